"""Feasibility: which nodes can take one worker or replica, and why the others cannot.

A fixed chain of filters, each one vectorised over all nodes. A node rejected by
several filters is counted under the first, so the counts add up to the node
count ("0/120 nodes: 80 no NPU, 40 over latency SLO").

Static filters depend only on the snapshot and the job, so their result is cached
per job shape for the whole pass. Dynamic filters depend on what the pass has
placed so far and are evaluated on the statically feasible nodes only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal

import numpy as np

from shared.taints import TaintEffect

from .arrays import BoolArray, CodeArray, FloatArray, IntArray, read_only
from .extensions import Candidates, LatencyEstimator, estimate_latency
from .mig import accepted_models, kept_off_profiles, restricts_models
from .model import ISOLATION_RANK, InferenceDeployment, TrainingJob
from .shape import WorkShape
from .snapshot import CPU_COLUMN, SITE_INDEX, NodeTable, Snapshot
from .state import ClusterState
from .windows import is_open, local_second_of_day, seconds_until_open, seconds_until_open_in_zone

FilterName = Literal[
    "health",
    "approval",
    "site",
    "training",
    "isolation",
    "runtime",
    "sealing",
    "kind",
    "count",
    "model",
    "memory",
    "provider",
    "selector",
    "taint",
    "window",
    "deadline",
    "slo-unverifiable",
    "latency-slo",
    "anti-affinity",
    "replica-limit",
    "busy",
    "host-memory",
    "cpus",
    "reserved",
]
FILTERS: Final[tuple[FilterName, ...]] = (
    "health",
    "approval",
    "site",
    "training",
    "isolation",
    "runtime",
    "sealing",
    "kind",
    "count",
    "model",
    "memory",
    "provider",
    "selector",
    "taint",
    "window",
    "deadline",
    "slo-unverifiable",
    "latency-slo",
    "anti-affinity",
    "replica-limit",
    "busy",
    "host-memory",
    "cpus",
    "reserved",
)
CODE: Final[Mapping[FilterName, int]] = {name: i + 1 for i, name in enumerate(FILTERS)}
PASS: Final = 0


@dataclass(frozen=True, slots=True)
class StaticResult:
    """Static filtering of all nodes for one job shape and one accelerator kind."""

    kind_code: int
    codes: CodeArray  # per node: PASS, or CODE of the first static filter that rejects it
    nodes: IntArray  # the nodes that pass, ascending
    provider_rank: IntArray  # per passing node: rank of its best accepted provider (0 = first)
    window_opens_at: float | None  # earliest start among nodes held back only by the window
    # per passing node: its start window is closed but waived to meet the deadline
    # (None: waived nowhere)
    window_waived: BoolArray | None = None


def static_filters(
    snapshot: Snapshot, shape: WorkShape, k: int, latency: LatencyEstimator | None
) -> StaticResult:
    nodes = snapshot.nodes
    work = shape.work
    columns = nodes.kinds[k]
    n = len(nodes)
    codes = np.zeros(n, dtype=np.int8)

    def reject(name: FilterName, passes: BoolArray) -> None:
        codes[(codes == PASS) & ~passes] = CODE[name]

    reject("health", nodes.healthy)
    reject("approval", nodes.approved)
    reject("site", np.isin(nodes.site_code, [SITE_INDEX[s] for s in work.sites]))
    if isinstance(work, TrainingJob):
        reject("training", nodes.runs_training)
        reject("isolation", nodes.isolation_rank >= ISOLATION_RANK[work.isolation])
        if work.image is not None:
            reject("runtime", nodes.runs_containers)
        if work.has_secrets:
            reject("sealing", nodes.receives_secrets)
    reject("kind", columns.capacity > 0)
    reject("count", columns.capacity >= shape.accelerators)
    kept_off = kept_off_profiles(work, snapshot.tenants)
    if restricts_models(work, kept_off):
        accepted = accepted_models(work, columns.models, kept_off)
        reject("model", np.isin(columns.model_code, accepted))
    if shape.memory_bytes:
        reject("memory", columns.memory_bytes >= shape.memory_bytes)
    provider_rank = np.zeros(n, dtype=np.int64)
    if isinstance(work, InferenceDeployment) and work.providers:
        provider_rank[:] = len(work.providers)
        for rank, name in reversed(list(enumerate(work.providers))):
            if name in columns.provider_names:
                has = columns.providers[:, columns.provider_names.index(name)]
                provider_rank[has] = rank
        reject("provider", provider_rank < len(work.providers))
    reject("selector", _selector_mask(nodes, shape))
    reject("taint", _tolerated_mask(nodes, shape))
    window_opens_at: float | None = None
    waived: BoolArray | None = None
    runtime = _runtime_s(snapshot, shape, k)
    if isinstance(work, TrainingJob) and work.start_window is not None:
        window = work.start_window
        second = local_second_of_day(snapshot.now, nodes.utc_offset_s)
        open_now = is_open(window, second)
        wait = seconds_until_open(window, second)
        # A node with an IANA time zone may change its UTC offset before the window
        # opens (daylight saving): its opening is computed in that zone.
        for code, zone in enumerate(nodes.timezones):
            wait[nodes.timezone_code == code] = seconds_until_open_in_zone(
                window, snapshot.now, zone
            )
        if work.deadline is not None:
            # Waiting for the window must not make the job miss its deadline.
            waived = ~open_now & (snapshot.now + wait + runtime > work.deadline)
            open_now = open_now | waived
        held = (codes == PASS) & ~open_now
        if held.any():
            window_opens_at = float(snapshot.now + wait[held].min())
        reject("window", open_now)
    if isinstance(work, TrainingJob) and work.deadline is not None:
        reject("deadline", snapshot.now + runtime <= work.deadline)
    if isinstance(work, InferenceDeployment) and work.latency_slo_ms is not None:
        survivors = np.flatnonzero(codes == PASS)
        if latency is None:
            # An SLO is a hard constraint: without an estimator it cannot be met
            # knowingly, so no node passes (never silently ignored).
            codes[survivors] = CODE["slo-unverifiable"]
        elif survivors.size:
            estimate = estimate_latency(
                latency,
                snapshot,
                work,
                Candidates(
                    survivors, columns.kind, shape.accelerators, runtime[survivors], column=k
                ),
            )
            over = survivors[estimate > work.latency_slo_ms]
            codes[over] = CODE["latency-slo"]
    passing = np.flatnonzero(codes == PASS)
    return StaticResult(
        kind_code=k,
        codes=read_only(codes),
        nodes=read_only(passing.astype(np.int64)),
        provider_rank=read_only(provider_rank[passing]),
        window_opens_at=window_opens_at,
        window_waived=(
            read_only(waived[passing]) if waived is not None and waived[passing].any() else None
        ),
    )


def _runtime_s(snapshot: Snapshot, shape: WorkShape, k: int) -> FloatArray:
    if shape.duration_s is None:
        return np.full(len(snapshot.nodes), np.inf)
    result: FloatArray = shape.duration_s / snapshot.nodes.kinds[k].relative_speed
    return result


def _selector_mask(nodes: NodeTable, shape: WorkShape) -> BoolArray:
    work = shape.work
    mask = np.ones(len(nodes), dtype=np.bool_)
    for key, value in work.node_selector.items():
        codes = nodes.label_codes.get(key)
        values = nodes.label_values.get(key, ())
        if codes is None or value not in values:
            return np.zeros(len(nodes), dtype=np.bool_)
        mask &= codes == values.index(value)
    for req in work.affinity:
        codes = nodes.label_codes.get(key := req.key)
        if codes is None:
            present = np.zeros(len(nodes), dtype=np.bool_)
            matches = present
        else:
            present = codes >= 0
            wanted = [i for i, v in enumerate(nodes.label_values[key]) if v in req.values]
            matches = np.isin(codes, wanted)
        if req.operator == "In":
            mask &= matches
        elif req.operator == "NotIn":
            mask &= ~matches
        elif req.operator == "Exists":
            mask &= present
        else:
            mask &= ~present
    return mask


def untolerated_mask(nodes: NodeTable, shape: WorkShape, effect: TaintEffect) -> BoolArray:
    """Per node: does it carry a taint of `effect` the work does not tolerate?"""
    tolerations = shape.work.tolerations
    untolerated = [
        i
        for i, taint in enumerate(nodes.taints)
        if taint.effect == effect and not any(t.tolerates(taint) for t in tolerations)
    ]
    if not untolerated:
        return np.zeros(len(nodes), dtype=np.bool_)
    result: BoolArray = np.asarray(nodes.taint_matrix[:, untolerated].any(axis=1))
    return result


def _tolerated_mask(nodes: NodeTable, shape: WorkShape) -> BoolArray:
    result: BoolArray = np.logical_not(untolerated_mask(nodes, shape, "NoSchedule"))
    return result


def _anti_affinity_conflicts(state: ClusterState, shape: WorkShape) -> BoolArray:
    """Per node: does running or tentatively placed work conflict with the job's groups?"""
    work = shape.work
    conflict = np.zeros(state.snapshot.node_count, dtype=np.bool_)
    for group in work.anti_affinity_groups:
        conflict[list(state.group_nodes.get(group, {}))] = True
    if work.group is not None:
        conflict[list(state.avoid_nodes.get(work.group, {}))] = True
    return conflict


def _at_replica_limit(state: ClusterState, shape: WorkShape) -> BoolArray:
    assert shape.max_per_node is not None
    counts = np.zeros(state.snapshot.node_count, dtype=np.int64)
    for node, count in state.work_node_count.get(shape.work.work_id, {}).items():
        counts[node] = count
    result: BoolArray = counts >= shape.max_per_node
    return result


def placement_conflicts(state: ClusterState, shape: WorkShape, nodes: IntArray) -> BoolArray | None:
    """Per node of ``nodes``: rejected whatever is evicted (anti-affinity, replica
    limit). None when the job has neither constraint."""
    work = shape.work
    conflict: BoolArray | None = None
    if work.anti_affinity_groups or work.group is not None:
        conflict = _anti_affinity_conflicts(state, shape)
    if shape.max_per_node is not None and work.work_id in state.work_node_count:
        limited = _at_replica_limit(state, shape)
        conflict = limited if conflict is None else conflict | limited
    return None if conflict is None else conflict[nodes]


def dynamic_codes(
    state: ClusterState, shape: WorkShape, static: StaticResult, runtime_s: FloatArray
) -> CodeArray:
    """First failing dynamic filter per statically feasible node (PASS if it fits now)."""
    work = shape.work
    k = static.kind_code
    nodes = static.nodes
    codes = np.zeros(nodes.size, dtype=np.int8)

    def reject(name: FilterName, fails: BoolArray) -> None:
        codes[(codes == PASS) & fails] = CODE[name]

    if work.anti_affinity_groups or work.group is not None:
        reject("anti-affinity", _anti_affinity_conflicts(state, shape)[nodes])
    if shape.max_per_node is not None:
        reject("replica-limit", _at_replica_limit(state, shape)[nodes])
    reject("busy", state.free[k][nodes] < shape.accelerators)
    if shape.host_memory_bytes:
        reject("host-memory", state.host_free[nodes] < shape.host_memory_bytes)
    if shape.cpu_cores:
        reject("cpus", state.free[CPU_COLUMN][nodes] < shape.cpu_cores)
    if state.has_reservations:
        # Work running past a reserved start may only use the reservation's slack.
        ends = state.now + runtime_s
        blocked = (ends > state.reservation_start_s[k][nodes]) & (
            state.reservation_slack_accelerators[k][nodes] < shape.accelerators
        )
        if shape.host_memory_bytes:
            blocked |= (ends > state.reservation_host_start_s[nodes]) & (
                state.reservation_slack_host_memory_bytes[nodes] < shape.host_memory_bytes
            )
        if shape.cpu_cores:
            # Cores beside the accelerators keep to the CPU pool's reservations.
            blocked |= (ends > state.reservation_start_s[CPU_COLUMN][nodes]) & (
                state.reservation_slack_accelerators[CPU_COLUMN][nodes] < shape.cpu_cores
            )
        reject("reserved", blocked)
    return codes


def node_codes(
    state: ClusterState,
    shape: WorkShape,
    static_furthest: CodeArray,
    candidates: Sequence[tuple[StaticResult, FloatArray]],
) -> CodeArray:
    """Per node, over all accepted kinds, the furthest the node got in the chain.

    ``static_furthest`` is the cached static part (statically feasible = beyond
    every filter). PASS means the node could take a member right now.
    """
    beyond = len(FILTERS) + 1
    furthest = static_furthest.copy()
    # A node statically feasible for one kind is judged by its dynamic codes there.
    for static, _ in candidates:
        if static.nodes.size:
            furthest[static.nodes] = 0
    for static, runtime in candidates:
        nodes = static.nodes
        if nodes.size:
            codes = dynamic_codes(state, shape, static, runtime)
            ranked = np.where(codes == PASS, beyond, codes).astype(np.int8)
            furthest[nodes] = np.maximum(furthest[nodes], ranked)
    result: CodeArray = np.where(furthest == beyond, PASS, furthest).astype(np.int8)
    return result


def count_rejections(codes: CodeArray) -> dict[FilterName, int]:
    """Nodes rejected per filter, in chain order, zeros omitted."""
    counts = np.bincount(codes.astype(np.int64), minlength=len(FILTERS) + 1)
    return {name: int(counts[CODE[name]]) for name in FILTERS if counts[CODE[name]]}
