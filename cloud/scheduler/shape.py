"""What one worker or replica of a piece of work needs, whatever its type.

Training jobs and inference deployments differ in vocabulary but not in what the
placement machinery needs: ``WorkShape`` is that common denominator, plus the
hashable keys under which filter and score results are cached and shared by all
jobs that ask for the same thing.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from shared.work_literals import WorkKind

from .model import KIND_INDEX, PRIORITY_RANK, InferenceDeployment, TrainingJob, Work
from .policy import Policy
from .self_anti_affinity import keeps_members_apart

StaticKey = tuple[Hashable, ...]


@dataclass(frozen=True, slots=True)
class WorkShape:
    work: Work
    work_kind: WorkKind
    rank: int  # priority rank, 0 = p0
    members: int  # gang workers or replicas
    min_members: int  # fewer than this placed = nothing placed
    accelerators: int  # per member
    kind_codes: tuple[int, ...]  # accepted kinds, best first
    memory_bytes: int
    host_memory_bytes: int
    cpu_cores: int  # from the node's CPU pool beside the accelerators (GPU/NPU training)
    duration_s: float | None  # on the reference accelerator; None = long-running
    max_per_node: int | None  # members of this work one node may hold; None = no limit
    static_key: StaticKey  # everything the static filters depend on, except the kind
    builtin_weights: tuple[float, float, float, float]  # packing, load, speed, preference
    spread_weight: float

    @property
    def is_gang(self) -> bool:
        return self.work_kind == "training" and self.members > 1


def make_shape(work: Work, policy: Policy) -> WorkShape:
    if work.score_weights:
        weights = (
            policy.weight(work, "packing"),
            policy.weight(work, "load"),
            policy.weight(work, "speed"),
            policy.weight(work, "preference"),
        )
    else:
        weights = policy.builtin_weights
    common: tuple[Hashable, ...] = (
        work.sites if len(work.sites) == 1 else tuple(sorted(work.sites)),
        tuple(sorted(work.node_selector.items())) if work.node_selector else (),
        work.affinity,
        tuple(sorted(work.tolerations, key=lambda t: (t.key, t.value or "")))
        if work.tolerations
        else (),
        work.accelerator_models,
        work.mig_profile,
        work.memory_bytes,
    )
    if isinstance(work, TrainingJob):
        # Window waiver and deadline depend on the duration only when a deadline exists.
        timing = (work.start_window, work.deadline, work.duration_s if work.deadline else None)
        containment = (work.isolation, work.image is not None, work.has_secrets)
        return WorkShape(
            work=work,
            work_kind="training",
            rank=PRIORITY_RANK[work.priority],
            members=work.workers,
            min_members=work.workers,
            accelerators=work.accelerators_per_worker,
            kind_codes=(KIND_INDEX[work.accelerator_kind],),
            memory_bytes=work.memory_bytes,
            host_memory_bytes=work.host_memory_bytes,
            cpu_cores=work.cpus_per_worker,
            duration_s=work.duration_s,
            max_per_node=_apart_cap(work, None),
            static_key=("training", work.accelerators_per_worker, *common, *timing, *containment),
            builtin_weights=weights,
            spread_weight=0.0,
        )
    assert isinstance(work, InferenceDeployment)
    # Everything a latency estimate may depend on (ServingLatency's compute time and
    # queueing use the reference time, the request rate and the replica count).
    latency = (
        (
            work.latency_slo_ms,
            tuple(sorted(work.traffic_by_region.items())),
            work.reference_ms_per_request,
            work.requests_per_s,
            work.replicas,
        )
        if work.latency_slo_ms is not None
        else None
    )
    return WorkShape(
        work=work,
        work_kind="inference",
        rank=PRIORITY_RANK[work.priority],
        members=work.replicas,
        min_members=work.min_replicas if work.min_replicas is not None else work.replicas,
        accelerators=work.accelerators_per_replica,
        kind_codes=tuple(KIND_INDEX[k] for k in work.accepted_kinds),
        memory_bytes=work.memory_bytes,
        host_memory_bytes=work.host_memory_bytes,
        cpu_cores=0,
        duration_s=None,
        max_per_node=_apart_cap(work, work.max_replicas_per_node),
        static_key=(
            "inference",
            work.accelerators_per_replica,
            *common,
            work.accepted_kinds,
            work.providers,
            latency,
        ),
        builtin_weights=weights,
        spread_weight=policy.weight(work, "spread"),
    )


def _apart_cap(work: Work, declared: int | None) -> int | None:
    """Members per node: 1 for work that keeps its own members apart, whatever else it
    declares, so that counts of what fits (reservations, speed classes, explanations)
    see what the anti-affinity filter will allow, not one member per free slice."""
    if keeps_members_apart(work):
        return 1
    return declared
