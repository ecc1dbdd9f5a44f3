"""What is scheduled and for whom: work, tenants, running allocations, constraints.

Plain frozen value types with validation; no behaviour beyond parsing. A refused value
raises `shared.errors.FieldError` naming the field (a `ValueError`), so the API maps a
job the scheduler would refuse to `invalid_params` without reading the message. The node
side of the world lives in ``snapshot.py``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Final, Protocol

from shared.errors import FieldError
from shared.messages import AcceleratorKind, IsolationLevel, Site
from shared.mig_profiles import is_mig_profile
from shared.taints import TaintEffect
from shared.work_literals import (
    GANG_TOPOLOGIES,
    GangTopology,
    IsolationRequirement,
    LabelOperator,
    PriorityClass,
    WorkKind,
)

# p0 > p1 > p2; a lower rank is more important.
PRIORITY_RANK: Final[Mapping[PriorityClass, int]] = MappingProxyType({"p0": 0, "p1": 1, "p2": 2})
PRIORITY_LEVELS: Final = 3
KINDS: Final[tuple[AcceleratorKind, ...]] = ("gpu", "npu", "cpu")
KIND_INDEX: Final[Mapping[AcceleratorKind, int]] = MappingProxyType(
    {kind: index for index, kind in enumerate(KINDS)}
)

# How well a node contains training workers, weakest first (docs/isolation.md). A node
# that reports ``unavailable`` cannot isolate them and takes no training at all; a job
# asks for at least ``none``.
ISOLATION_RANK: Final[Mapping[IsolationLevel, int]] = MappingProxyType(
    {"unavailable": 0, "none": 1, "user": 2, "sandbox": 3}
)


def stronger_isolation(
    first: IsolationRequirement, second: IsolationRequirement
) -> IsolationRequirement:
    """The stronger of two requirements (a job's own and the cluster's minimum)."""
    return first if ISOLATION_RANK[first] >= ISOLATION_RANK[second] else second


# Names a job's ``score_weights`` may use: the built-in terms, the green terms
# (cloud.green) and, for other extension terms, any name starting with "x-".
BUILTIN_TERM_NAMES: Final = ("packing", "load", "speed", "preference", "spread")
GREEN_TERM_NAMES: Final = ("carbon", "price", "latency")
KNOWN_TERM_NAMES: Final = BUILTIN_TERM_NAMES + GREEN_TERM_NAMES
EXTENSION_TERM_PREFIX: Final = "x-"


def _frozen_mapping(value: Mapping[str, str]) -> Mapping[str, str]:
    return MappingProxyType(dict(value))


def _refused(subject: str, name: str, reason: str) -> FieldError:
    """Field `name` of `subject` (a work id, "tenant acme"; empty: none) refused; its
    text "subject: reason". Reasons name the field in words ("sites must name at least
    one site"): the API shows them as they are."""
    return FieldError(name, reason, message=f"{subject}: {reason}" if subject else reason)


def _checked_weights(work_id: str, weights: Mapping[str, float]) -> Mapping[str, float]:
    """Per-job weight overrides, checked when the job is built so that a bad one is
    rejected with the job instead of ending a scheduling pass."""
    for name, weight in weights.items():
        if name not in KNOWN_TERM_NAMES and not name.startswith(EXTENSION_TERM_PREFIX):
            known = ", ".join(KNOWN_TERM_NAMES)
            raise _refused(
                work_id,
                "score_weights",
                f"score_weights names unknown term {name!r} (known: {known}; "
                f"other extension terms are named {EXTENSION_TERM_PREFIX}...)",
            )
        if not isinstance(weight, int | float) or not math.isfinite(weight) or weight < 0:
            raise _refused(
                work_id,
                "score_weights",
                f"score weight {name} must be a finite number >= 0, got {weight!r}",
            )
    return MappingProxyType({name: float(weight) for name, weight in weights.items()})


@dataclass(frozen=True, slots=True)
class Taint:
    """A node taint. ``NoSchedule``: only work that tolerates it may land there;
    ``PreferNoSchedule``: other work lands there only when nothing better fits (its
    preference term is lowered)."""

    key: str
    value: str = ""
    effect: TaintEffect = "NoSchedule"

    def __str__(self) -> str:
        text = f"{self.key}={self.value}" if self.value else self.key
        return text if self.effect == "NoSchedule" else f"{text}:{self.effect}"


@dataclass(frozen=True, slots=True)
class Toleration:
    """Tolerates taints with this key; ``value=None`` tolerates every value."""

    key: str
    value: str | None = None

    def tolerates(self, taint: Taint) -> bool:
        return taint.key == self.key and (self.value is None or self.value == taint.value)


@dataclass(frozen=True, slots=True)
class LabelRequirement:
    """Node affinity (In, Exists) or anti-affinity (NotIn, DoesNotExist) on one label key."""

    key: str
    operator: LabelOperator
    values: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        needs_values = self.operator in ("In", "NotIn")
        requirement = f"label requirement {self.key} {self.operator}"
        if needs_values and not self.values:
            raise _refused("", "values", f"{requirement} needs values")
        if not needs_values and self.values:
            raise _refused("", "values", f"{requirement} takes no values")


_WINDOW = re.compile(r"^([01][0-9]|2[0-3]):([0-5][0-9])-([01][0-9]|2[0-3]):([0-5][0-9])$")
MINUTES_PER_DAY: Final = 24 * 60


@dataclass(frozen=True, slots=True)
class StartWindow:
    """Minutes of the day (node local time) during which work may start; may wrap midnight."""

    start_minute: int
    end_minute: int

    def __post_init__(self) -> None:
        for minute in (self.start_minute, self.end_minute):
            if not 0 <= minute < MINUTES_PER_DAY:
                raise FieldError((), f"window minute {minute} is outside 0..1439")
        if self.start_minute == self.end_minute:
            raise FieldError((), "an empty start window never opens; omit it to allow any time")

    @classmethod
    def parse(cls, text: str) -> StartWindow:
        """Parse ``"HH:MM-HH:MM"``, e.g. ``"20:00-06:00"`` for nights."""
        match = _WINDOW.match(text.strip())
        if match is None:
            raise FieldError((), f"start window {text!r} is not HH:MM-HH:MM")
        sh, sm, eh, em = (int(part) for part in match.groups())
        return cls(start_minute=sh * 60 + sm, end_minute=eh * 60 + em)

    def __str__(self) -> str:
        s, e = self.start_minute, self.end_minute
        return f"{s // 60:02d}:{s % 60:02d}-{e // 60:02d}:{e % 60:02d}"


# A handful of alternatives bounds what a pass spends on one job: each is a placement
# attempt of its own (core.py).
MAX_ALTERNATIVE_SHAPES: Final = 4


@dataclass(frozen=True, slots=True, order=True)
class GangShape:
    """A gang's shape: ``workers`` workers of ``accelerators_per_worker`` devices each.

    Written ``2×4`` (two workers of four), as explanations show it."""

    workers: int
    accelerators_per_worker: int

    @property
    def accelerators(self) -> int:
        return self.workers * self.accelerators_per_worker

    def __str__(self) -> str:
        return f"{self.workers}×{self.accelerators_per_worker}"


def _check_alternative_shapes(
    work_id: str, declared: GangShape, alternatives: tuple[GangShape, ...]
) -> None:
    """Positive, distinct, not the declared shape, at most a handful, and the same total
    accelerators as the declared shape: a data-parallel job's total work (and so its
    ``duration_s``, its energy, its quota) is the same in any of its shapes."""
    name = "alternative_shapes"
    if len(alternatives) > MAX_ALTERNATIVE_SHAPES:
        raise _refused(
            work_id, name, f"alternative_shapes lists at most {MAX_ALTERNATIVE_SHAPES} shapes"
        )
    seen = {declared}
    for shape in alternatives:
        if shape.workers < 1 or shape.accelerators_per_worker < 1:
            raise _refused(
                work_id, name, "an alternative shape's workers and accelerators_per_worker are >= 1"
            )
        if shape in seen:
            raise _refused(
                work_id,
                name,
                f"alternative shape {shape} repeats the declared shape or another alternative",
            )
        if shape.accelerators != declared.accelerators:
            raise _refused(
                work_id,
                name,
                f"alternative shape {shape} asks for {shape.accelerators} accelerators in "
                f"all; the declared {declared} asks for {declared.accelerators} (every shape "
                "of a job has the same total)",
            )
        seen.add(shape)


def _check_common(work_id: str, tenant: str, sites: tuple[Site, ...]) -> None:
    if not work_id:
        raise _refused("", "work_id", "work_id must not be empty")
    if not tenant:
        raise _refused(work_id, "tenant", "tenant must not be empty")
    if not sites:
        raise _refused(work_id, "sites", "sites must name at least one site")


def _check_mig_profile(
    work_id: str, profile: str | None, kinds: tuple[AcceleratorKind, ...]
) -> None:
    if profile is None:
        return
    if not is_mig_profile(profile):
        raise _refused(work_id, "mig_profile", f"mig_profile {profile!r} is not like 1g.10gb")
    if kinds != ("gpu",):
        at_fault = "accelerator_kind" if len(kinds) == 1 else "accepted_kinds"
        raise _refused(work_id, at_fault, "a mig_profile asks for GPU slices: the kind is gpu")


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingJob:
    """A gang of ``workers`` workers, each needing ``accelerators_per_worker`` devices.

    ``duration_s`` is the estimate on a reference accelerator (relative speed 1.0,
    an A100); a node twice as fast is expected to finish in half the time.

    ``alternative_shapes`` (flexible shapes): other gang shapes the job runs as well in,
    e.g. ``2×4`` for a declared ``1×8`` data-parallel job. Every shape has the declared
    total of accelerators, so ``duration_s`` (an estimate for the declared shape) holds
    for each: the same total GPU work. The scheduler places the shape whose placement
    scores best (core.py); the copy it places is ``reshaped``, which records the
    declared shape in ``declared_shape``. Per-worker needs (``host_memory_bytes``,
    ``cpus_per_worker``) are per worker of whichever shape runs.
    """

    work_id: str
    tenant: str
    priority: PriorityClass = "p1"
    submitted_at: float = 0.0
    workers: int = 1
    accelerators_per_worker: int = 1
    accelerator_kind: AcceleratorKind = "gpu"
    memory_bytes: int = 0  # per accelerator
    host_memory_bytes: int = 0  # per worker
    # CPU cores per worker of a GPU or NPU job, taken from the node's CPU pool (its
    # cores) beside the accelerators; a CPU job's cores are its accelerators.
    cpus_per_worker: int = 0
    accelerator_models: tuple[str, ...] = ()  # accepted models; empty accepts any
    duration_s: float = 3600.0
    preemptible: bool = True
    start_window: StartWindow | None = None
    deadline: float | None = None  # UTC epoch seconds by which the job must finish
    # The job may start up to this long after submission (temporal shifting may use it).
    max_delay_s: float | None = None
    # It saves a checkpoint at least this often (seconds of its run) and a restarted run
    # resumes from the newest one, so it may be moved while running (None: starts over).
    checkpoint_interval_s: float | None = None
    sites: tuple[Site, ...] = ("cloud",)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    affinity: tuple[LabelRequirement, ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    group: str | None = None  # name other work can avoid with anti_affinity_groups
    anti_affinity_groups: tuple[str, ...] = ()  # never share a node with these groups
    score_weights: Mapping[str, float] = field(default_factory=dict)
    # The least isolation a node must give its workers: the job's own or the cluster's
    # minimum, whichever is stronger (cloud.work.convert).
    isolation: IsolationRequirement = "none"
    image: str | None = None  # an OCI image to run in: needs a node with a container runtime
    # It has secrets (secret_env, registry credentials): sealed to each node's own key,
    # so only nodes with a usable sealing key can take it.
    has_secrets: bool = False
    # Where the gang's workers must all be: one region (default), zone or rack (the node
    # label ``rack``), or anywhere (cloud/scheduler/topology.py).
    topology: GangTopology = "region"
    # Each accelerator is a MIG slice of this profile ("1g.10gb"), never a whole GPU.
    mig_profile: str | None = None
    # Other shapes it may run in (flexible shapes), in order of preference after the
    # declared one; each has the declared total of accelerators.
    alternative_shapes: tuple[GangShape, ...] = ()
    # Set only on the copy the scheduler places in another shape (``reshaped``): the
    # shape the job declared. A submitted job leaves it None.
    declared_shape: GangShape | None = None

    def __post_init__(self) -> None:
        _check_common(self.work_id, self.tenant, self.sites)
        work_id = self.work_id
        _check_mig_profile(work_id, self.mig_profile, (self.accelerator_kind,))
        if self.topology not in GANG_TOPOLOGIES:
            raise _refused(work_id, "topology", "topology must be region, zone, rack or any")
        if self.workers < 1 or self.accelerators_per_worker < 1:
            at_fault = "workers" if self.workers < 1 else "accelerators_per_worker"
            raise _refused(work_id, at_fault, "workers and accelerators_per_worker must be >= 1")
        if not 0 < self.duration_s < math.inf:  # NaN too
            raise _refused(work_id, "duration_s", "duration_s must be positive and finite")
        if min(self.memory_bytes, self.host_memory_bytes) < 0:
            at_fault = "memory_bytes" if self.memory_bytes < 0 else "host_memory_bytes"
            raise _refused(work_id, at_fault, "memory must not be negative")
        if self.cpus_per_worker < 0:
            raise _refused(work_id, "cpus_per_worker", "cpus_per_worker must be >= 0")
        if self.cpus_per_worker and self.accelerator_kind == "cpu":
            raise _refused(
                work_id,
                "cpus_per_worker",
                "a CPU job's cores are its accelerators_per_worker; cpus_per_worker is for "
                "GPU and NPU jobs",
            )
        if self.max_delay_s is not None and not self.max_delay_s >= 0:
            raise _refused(work_id, "max_delay_s", "max_delay_s must be >= 0")
        if self.checkpoint_interval_s is not None and not self.checkpoint_interval_s > 0:
            raise _refused(
                work_id, "checkpoint_interval_s", "checkpoint_interval_s must be positive"
            )
        if self.isolation not in ("none", "user", "sandbox"):
            raise _refused(work_id, "isolation", "isolation must be none, user or sandbox")
        if self.alternative_shapes:
            _check_alternative_shapes(work_id, self.shape, self.alternative_shapes)
        object.__setattr__(self, "node_selector", _frozen_mapping(self.node_selector))
        object.__setattr__(
            self, "score_weights", _checked_weights(self.work_id, self.score_weights)
        )

    @property
    def shape(self) -> GangShape:
        """The shape it runs in: the declared one, or on a reshaped copy the chosen one."""
        return GangShape(self.workers, self.accelerators_per_worker)

    def reshaped(self, shape: GangShape) -> TrainingJob:
        """The job in one of its alternative shapes, as the scheduler places it: no
        alternatives of its own, the declared shape recorded."""
        return replace(
            self,
            workers=shape.workers,
            accelerators_per_worker=shape.accelerators_per_worker,
            alternative_shapes=(),
            declared_shape=self.shape,
        )

    @property
    def flexible(self) -> bool:
        """It may wait for a better start: it has a deadline or a maximum delay."""
        return self.deadline is not None or self.max_delay_s is not None

    @property
    def movable(self) -> bool:
        """It may be stopped and resumes from a checkpoint: it can move while running."""
        return self.checkpoint_interval_s is not None and self.preemptible

    def latest_start(self, runtime_s: float) -> float:
        """The latest start that still finishes by the deadline after ``runtime_s`` and
        keeps within the maximum delay (inf when neither is set)."""
        latest = math.inf
        if self.deadline is not None:
            latest = self.deadline - runtime_s
        if self.max_delay_s is not None:
            latest = min(latest, self.submitted_at + self.max_delay_s)
        return latest


@dataclass(frozen=True, slots=True, kw_only=True)
class InferenceDeployment:
    """``replicas`` copies of an ONNX model server, each on its own accelerator(s).

    ``accepted_kinds`` and ``providers`` are in order of preference. With
    ``min_replicas`` below ``replicas`` a partial placement is accepted and the rest
    stays pending; by default the deployment is placed whole or not at all.
    """

    work_id: str
    tenant: str
    priority: PriorityClass = "p0"
    submitted_at: float = 0.0
    replicas: int = 1
    min_replicas: int | None = None
    accelerators_per_replica: int = 1
    accepted_kinds: tuple[AcceleratorKind, ...] = ("npu", "gpu", "cpu")
    providers: tuple[str, ...] = ()  # ONNX Runtime execution providers; empty accepts any
    memory_bytes: int = 0  # model memory per accelerator
    host_memory_bytes: int = 0  # per replica
    accelerator_models: tuple[str, ...] = ()
    latency_slo_ms: float | None = None
    traffic_by_region: Mapping[str, float] = field(default_factory=dict)
    # Expected peak request rate over all replicas, and the compute time of one request
    # on the reference accelerator (relative speed 1.0). Used by energy estimates and
    # load-aware latency estimators (cloud.green); 0 / None: unknown.
    requests_per_s: float = 0.0
    reference_ms_per_request: float | None = None
    max_replicas_per_node: int = 1
    # Replicas preemption never takes it below (a disruption budget; 0: none).
    min_available: int = 0
    preemptible: bool = True
    sites: tuple[Site, ...] = ("edge",)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    affinity: tuple[LabelRequirement, ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    group: str | None = None
    anti_affinity_groups: tuple[str, ...] = ()
    score_weights: Mapping[str, float] = field(default_factory=dict)
    # Each accelerator is a MIG slice of this profile ("1g.10gb"), never a whole GPU.
    mig_profile: str | None = None

    def __post_init__(self) -> None:
        _check_common(self.work_id, self.tenant, self.sites)
        work_id = self.work_id
        _check_mig_profile(work_id, self.mig_profile, self.accepted_kinds)
        if self.replicas < 1 or self.accelerators_per_replica < 1:
            at_fault = "replicas" if self.replicas < 1 else "accelerators_per_replica"
            raise _refused(work_id, at_fault, "replicas and accelerators_per_replica must be >= 1")
        if self.min_replicas is not None and not 1 <= self.min_replicas <= self.replicas:
            raise _refused(work_id, "min_replicas", "min_replicas must be within 1..replicas")
        if not self.accepted_kinds or len(set(self.accepted_kinds)) != len(self.accepted_kinds):
            raise _refused(work_id, "accepted_kinds", "accepted_kinds must be non-empty and unique")
        if self.max_replicas_per_node < 1:
            raise _refused(work_id, "max_replicas_per_node", "max_replicas_per_node must be >= 1")
        if any(weight < 0 for weight in self.traffic_by_region.values()):
            raise _refused(work_id, "traffic_by_region", "traffic must not be negative")
        if not self.requests_per_s >= 0:
            raise _refused(work_id, "requests_per_s", "requests_per_s must be >= 0")
        if self.reference_ms_per_request is not None and not self.reference_ms_per_request > 0:
            raise _refused(
                work_id, "reference_ms_per_request", "reference_ms_per_request must be > 0"
            )
        object.__setattr__(self, "node_selector", _frozen_mapping(self.node_selector))
        object.__setattr__(
            self, "traffic_by_region", MappingProxyType(dict(self.traffic_by_region))
        )
        object.__setattr__(
            self, "score_weights", _checked_weights(self.work_id, self.score_weights)
        )


Work = TrainingJob | InferenceDeployment


def work_kind(work: Work) -> WorkKind:
    return "training" if isinstance(work, TrainingJob) else "inference"


def rescue_marks(work: Work) -> tuple[bool, bool]:
    """(``checkpointing``, ``deadline_bound``) of ``work`` once it runs, as its
    ``Allocation`` and ``Placement`` carry them: training that saves checkpoints, and
    training with a deadline or a maximum delay (what a deadline rescue may evict and
    may not, preemption.py)."""
    if not isinstance(work, TrainingJob):
        return False, False
    return work.checkpoint_interval_s is not None, work.flexible


@dataclass(frozen=True, slots=True, kw_only=True)
class Tenant:
    """Nominal quota per accelerator kind; a kind not listed has a nominal quota of 0.

    Tenants of one cohort lend each other idle nominal quota. ``borrowing_limit``
    caps what this tenant may borrow per kind; a kind not listed may borrow up to
    whatever is idle in the cohort. Tenants that appear in no ``Tenant`` record are
    unmanaged: no quota applies to them.
    """

    name: str
    cohort: str | None = None
    nominal: Mapping[AcceleratorKind, int] = field(default_factory=dict)
    borrowing_limit: Mapping[AcceleratorKind, int] = field(default_factory=dict)
    # Of its unused nominal quota, what its cohort's other members may borrow per kind
    # (hierarchy.py); a kind not listed: all of it.
    lending_limit: Mapping[AcceleratorKind, int] = field(default_factory=dict)
    # MIG slices per profile ("1g.10gb": 7): its slices of a profile listed here count
    # against this, never against its gpu quota; no borrowing (mig_quota.py).
    mig_nominal: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, quotas in (
            ("nominal", self.nominal),
            ("borrowing_limit", self.borrowing_limit),
            ("lending_limit", self.lending_limit),
            ("mig_nominal", self.mig_nominal),
        ):
            if any(v < 0 for v in quotas.values()):
                raise _refused(f"tenant {self.name}", name, "quotas must not be negative")
        for profile in self.mig_nominal:
            if not is_mig_profile(profile):
                raise _refused(
                    f"tenant {self.name}", "mig_nominal", f"{profile!r} is not a MIG profile"
                )
        object.__setattr__(self, "mig_nominal", MappingProxyType(dict(self.mig_nominal)))
        object.__setattr__(self, "nominal", MappingProxyType(dict(self.nominal)))
        object.__setattr__(self, "borrowing_limit", MappingProxyType(dict(self.borrowing_limit)))
        object.__setattr__(self, "lending_limit", MappingProxyType(dict(self.lending_limit)))


@dataclass(frozen=True, slots=True, kw_only=True)
class Allocation:
    """Work running on one node (one gang worker or one replica).

    ``expected_end`` is None for long-running work such as inference replicas.
    ``borrowed`` is informational only (what the placement said when it started):
    the scheduler never reads it, it recomputes who borrows from each tenant's
    current usage against its nominal quota.
    """

    allocation_id: str
    work_id: str
    work_kind: WorkKind
    tenant: str
    priority: PriorityClass
    preemptible: bool
    node_id: str
    accelerator_kind: AcceleratorKind
    accelerators: int
    host_memory_bytes: int = 0
    started_at: float = 0.0
    expected_end: float | None = None
    borrowed: bool = False  # ignored by the scheduler: borrowing is recomputed
    group: str | None = None
    anti_affinity_groups: tuple[str, ...] = ()
    # The model of the node's pool it holds, for a node with several pools of the kind
    # (MIG slices beside whole GPUs); "" for its first pool.
    accelerator_model: str = ""
    power_limit_w: float | None = None  # each device's power cap; None: the default
    # Its deployment's disruption budget: preemption leaves the deployment at least this
    # many replicas (cloud/scheduler/disruption_budget.py); 0 for training.
    min_available: int = 0
    # CPU cores it holds in the node's CPU pool beside its accelerators (a GPU or NPU
    # job's cpus_per_worker); 0 for a CPU allocation, whose cores are its accelerators.
    cpu_cores: int = 0
    # Training that saves checkpoints (stopping it loses at most an interval's work),
    # and training with a deadline or a maximum delay: what a deadline rescue may evict
    # and may not (preemption.py).
    checkpointing: bool = False
    deadline_bound: bool = False

    def __post_init__(self) -> None:
        if self.accelerators < 1:
            raise _refused(
                f"allocation {self.allocation_id}", "accelerators", "accelerators must be >= 1"
            )


class Held(Protocol):
    """Anything that holds accelerators on a node: a snapshot ``Allocation`` or a
    ``Placement`` made in this pass (both have these fields)."""

    @property
    def allocation_id(self) -> str: ...
    @property
    def work_id(self) -> str: ...
    @property
    def work_kind(self) -> WorkKind: ...
    @property
    def tenant(self) -> str: ...
    @property
    def priority(self) -> PriorityClass: ...
    @property
    def preemptible(self) -> bool: ...
    @property
    def node_id(self) -> str: ...
    @property
    def accelerator_kind(self) -> AcceleratorKind: ...
    @property
    def accelerator_model(self) -> str: ...
    @property
    def accelerators(self) -> int: ...
    @property
    def host_memory_bytes(self) -> int: ...
    @property
    def cpu_cores(self) -> int: ...
    @property
    def started_at(self) -> float: ...
    @property
    def expected_end(self) -> float | None: ...
    @property
    def group(self) -> str | None: ...
    @property
    def anti_affinity_groups(self) -> tuple[str, ...]: ...
    @property
    def checkpointing(self) -> bool: ...
    @property
    def deadline_bound(self) -> bool: ...
