"""Why placement is fast: filter results cached per job shape, scores kept current.

* ``KindCandidates``: the statically feasible nodes of one job shape and kind,
  with the static score parts (speed, preference) computed once per pass.
* ``DynamicScores``: the placement-dependent part of the score (packing, load,
  and ``-inf`` where a member does not fit) for *every* node of one kind, shared
  by all jobs with the same accelerator count, host memory and weights. After a
  placement only the changed nodes (``ClusterState.kind_log``) are re-scored,
  once, whichever job shapes they belong to.

Choosing a node for a member is then a gather of the shared dynamic scores over
the job's candidates, one add and an argmax, never a pass over the cluster.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from .arrays import CodeArray, FloatArray, IntArray, read_only
from .filters import (
    FILTERS,
    PASS,
    FilterName,
    StaticResult,
    count_rejections,
    static_filters,
    untolerated_mask,
)
from .mig import kept_off_profiles
from .model import TrainingJob
from .policy import Policy
from .scoring import (
    ShapeFit,
    blend_fit,
    packing_and_load,
    packing_and_load_one,
    preference,
    shape_fit,
    shape_fit_one,
    speed,
    traffic_weights,
)
from .shape import WorkShape
from .snapshot import CPU_COLUMN, Snapshot
from .state import ClusterState

# What an untolerated PreferNoSchedule taint takes off a node's preference term (0..1):
# enough that an untainted node of the same kind wins, short of a filter.
PREFER_NO_SCHEDULE_PENALTY = 0.5

_V = TypeVar("_V")

_CACHE_LIMIT = 512
_SCALAR_RESCORE = 4  # up to this many changed nodes, re-score them one by one
_FULL_RESCORE_RATIO = 4  # re-score the whole column when over 1/4 of the nodes changed


@dataclass(frozen=True, slots=True)
class KindCandidates:
    """Statically feasible nodes of one shape and pool column, with static data."""

    static: StaticResult
    shape_id: int  # CandidateCache.shape_id of the shapes these candidates belong to
    kind_rank: int  # position of this column's kind in the work's accepted kinds
    nodes: IntArray
    nodes_list: list[int]
    speed: FloatArray
    preference: FloatArray
    speed_list: list[float]  # the same as Python floats, for cheap one-node reads
    preference_list: list[float]
    region: IntArray

    @property
    def k(self) -> int:
        return self.static.kind_code


class DynamicScores:
    """packing and load of one member on every node of one kind; -inf where it does not fit."""

    def __init__(
        self,
        state: ClusterState,
        k: int,
        accelerators: int,
        host_memory: int,
        cpu_cores: int,
        w_packing: float,
        w_load: float,
        threshold: float,
        fit: ShapeFit | None = None,
    ) -> None:
        self.k = k
        self.fit = fit  # shape fit blended into packing (the policy's CapacityValue)
        self.accelerators = accelerators
        self.host_memory = host_memory
        self.cpu_cores = cpu_cores
        self.w_packing = w_packing
        self.w_load = w_load
        self.threshold = threshold
        self._state = state
        self.ceiling = w_packing + w_load  # both terms are at most 1
        self.base_util = state.snapshot.nodes.kinds[k].utilisation
        self.inv_capacity = state.inv_capacity[k]
        # Host memory (and the CPU pool's cores, which GPU work takes too) is shared by
        # all kinds; otherwise only this kind's changes matter.
        self.log = state.change_log if host_memory or cpu_cores else state.kind_log[k]
        self.seen = len(self.log)
        self.value: FloatArray = np.empty(state.snapshot.node_count)
        self._rescore(slice(None))
        # Per candidate set (CandidateCache.shape_id) on which no member fitted: the
        # eviction count then. Until something is evicted, nothing will fit there.
        self.nothing_fits_at_evictions: dict[int, int] = {}

    def evictions(self) -> int:
        """Evictions so far that could have made room: of this kind, or of any kind
        when host memory or CPU cores are needed too."""
        evictions = self._state.evictions_by_kind
        return sum(evictions) if self.host_memory or self.cpu_cores else evictions[self.k]

    def sync(self) -> FloatArray:
        """Bring ``value`` up to date with the placements made since the last call."""
        log = self.log
        if self.seen != len(log):
            changed = log[self.seen :]
            self.seen = len(log)
            if len(changed) <= _SCALAR_RESCORE:
                for node in changed:
                    self._rescore_one(node)
            elif len(changed) * _FULL_RESCORE_RATIO > self.value.size:
                self._rescore(slice(None))
            else:
                self._rescore(np.unique(np.array(changed, dtype=np.int64)))
        return self.value

    def _rescore(self, where: slice | IntArray) -> None:
        state = self._state
        k = self.k
        free = state.free[k][where]
        fits = free >= self.accelerators
        if self.host_memory:
            fits &= state.host_free[where] >= self.host_memory
        if self.cpu_cores:
            fits &= state.free[CPU_COLUMN][where] >= self.cpu_cores
        packing, load = packing_and_load(
            free,
            self.accelerators,
            self.inv_capacity[where],
            self.base_util[where],
            state.util_delta[k][where],
            self.threshold,
        )
        if self.fit is not None:
            fitted = shape_fit(self.fit, free, self.accelerators, self.inv_capacity[where], where)
            packing = blend_fit(packing, fitted)
        total = self.w_packing * packing + self.w_load * load
        self.value[where] = np.where(fits, total, -np.inf)

    def parts_one(self, node: int) -> tuple[float, float]:
        """packing (shape fit blended in) and load of one member on ``node``, now: the
        scalar twin of ``_rescore``, the same formula, so the same bits (explanations
        show these)."""
        state = self._state
        k = self.k
        free: int = state.free[k].item(node)
        inv_capacity = self.inv_capacity.item(node)
        packing, load = packing_and_load_one(
            free,
            self.accelerators,
            inv_capacity,
            self.base_util.item(node),
            state.util_delta[k].item(node),
            self.threshold,
        )
        if self.fit is not None:
            fitted = shape_fit_one(self.fit, free, self.accelerators, inv_capacity, node)
            packing = blend_fit(packing, fitted)
        return packing, load

    def _rescore_one(self, node: int) -> None:
        state = self._state
        k = self.k
        free: int = state.free[k].item(node)
        if (
            free < self.accelerators
            or (self.host_memory and state.host_free.item(node) < self.host_memory)
            or (self.cpu_cores and state.free[CPU_COLUMN].item(node) < self.cpu_cores)
        ):
            self.value[node] = -np.inf
            return
        if self.fit is not None:
            packing, load = self.parts_one(node)
        else:  # parts_one without shape fit, inline: the hot path of every placement
            packing, load = packing_and_load_one(
                free,
                self.accelerators,
                self.inv_capacity.item(node),
                self.base_util.item(node),
                state.util_delta[k].item(node),
                self.threshold,
            )
        self.value[node] = self.w_packing * packing + self.w_load * load


def member_runtime_s(snapshot: Snapshot, shape: WorkShape, k: int, nodes: IntArray) -> FloatArray:
    """Estimated run time of one of ``shape``'s members on each of ``nodes`` in pool
    column ``k`` (inf: long-running)."""
    if shape.duration_s is None:
        return np.full(nodes.size, np.inf)
    runtime: FloatArray = shape.duration_s / snapshot.nodes.kinds[k].relative_speed[nodes]
    return runtime


class CandidateCache:
    def __init__(self, snapshot: Snapshot, policy: Policy, state: ClusterState) -> None:
        self.snapshot = snapshot
        self.policy = policy
        self.state = state
        self._ids: dict[Hashable, int] = {}
        self._static: dict[Hashable, KindCandidates] = {}
        self._static_codes: dict[Hashable, CodeArray] = {}
        self._dynamic: dict[Hashable, DynamicScores] = {}
        self._fits: dict[int, ShapeFit] = {}
        self._static_part: dict[Hashable, tuple[FloatArray, float]] = {}
        self._traffic: dict[Hashable, FloatArray] = {}
        self._runtime: dict[Hashable, FloatArray] = {}
        # Per static codes array (by identity, kept alive here): the rejection counts
        # and fitting nodes of work no node statically admits.
        self._static_verdicts: dict[Hashable, tuple[CodeArray, dict[FilterName, int], int]] = {}

    def shape_id(self, shape: WorkShape) -> int:
        """A small int for the shape's static key: hashed once per job, not per lookup.
        The slice profiles its tenant's quota keeps it off (mig.py) are part of it: two
        tenants' otherwise equal work may pass the filter ``model`` on different pools."""
        key = shape.static_key
        kept_off = kept_off_profiles(shape.work, self.snapshot.tenants)
        if kept_off:
            key = (*key, kept_off)
        found = self._ids.get(key)
        if found is None:
            found = self._ids[key] = len(self._ids)
        return found

    def candidates(self, shape: WorkShape, shape_id: int) -> list[KindCandidates]:
        """Per accepted kind, best first, per pool column of the kind (a node with MIG
        slices beside whole GPUs is a candidate in each): the feasible nodes."""
        result = []
        kind_columns = self.snapshot.nodes.kind_columns
        for rank, kind_code in enumerate(shape.kind_codes):
            for k in kind_columns[kind_code]:
                key = (shape_id, k)
                found = self._static.get(key)
                if found is None:
                    found = self._build(shape, shape_id, k, rank)
                    _remember(self._static, key, found)
                result.append(found)
        return result

    def dynamic(self, shape: WorkShape, k: int) -> DynamicScores:
        w_packing, w_load, _, _ = shape.builtin_weights
        key = (k, shape.accelerators, shape.host_memory_bytes, shape.cpu_cores, w_packing, w_load)
        found = self._dynamic.get(key)
        if found is None:
            found = DynamicScores(
                self.state,
                k,
                shape.accelerators,
                shape.host_memory_bytes,
                shape.cpu_cores,
                w_packing,
                w_load,
                self.policy.load_threshold,
                self._shape_fit(k),
            )
            _remember(self._dynamic, key, found)
        return found

    def _shape_fit(self, k: int) -> ShapeFit | None:
        """The pass's shape fit for pool column ``k``, when the policy values capacity:
        the demand is every member running or queued on the column's kind."""
        valuer = self.policy.capacity_value
        if valuer is None:
            return None
        found = self._fits.get(k)
        if found is None:
            snapshot = self.snapshot
            column = snapshot.nodes.kinds[k]
            largest = int(column.capacity.max()) if column.capacity.size else 0
            found = ShapeFit.for_demand(
                member_demand(snapshot, column.kind), largest, valuer.node_values(snapshot, k)
            )
            self._fits[k] = found
        return found

    def static_part(self, shape: WorkShape, cand: KindCandidates) -> tuple[FloatArray, float]:
        """Weighted speed + preference of each candidate, and its maximum."""
        _, _, w_speed, w_preference = shape.builtin_weights
        key = (cand.shape_id, cand.k, w_speed, w_preference)
        found = self._static_part.get(key)
        if found is None:
            values = read_only(w_speed * cand.speed + w_preference * cand.preference)
            found = (values, float(values.max()) if values.size else 0.0)
            _remember(self._static_part, key, found)
        return found

    def static_codes(self, shape: WorkShape, cands: list[KindCandidates]) -> CodeArray:
        """Per node, over the accepted kinds, the furthest static filter reached;
        nodes statically feasible for a kind count as ``len(FILTERS) + 1`` there,
        so that dynamic codes can be merged in with a maximum."""
        # By the kinds' columns too: a training shape's static key leaves its kind out
        # (candidates are per kind), and a GPU and an NPU job may otherwise be alike.
        key = (cands[0].shape_id, tuple(cand.k for cand in cands))
        found = self._static_codes.get(key)
        if found is None:
            beyond = len(FILTERS) + 1
            furthest = np.zeros(self.snapshot.node_count, dtype=np.int8)
            for cand in cands:
                codes = np.where(cand.static.codes == PASS, beyond, cand.static.codes)
                furthest = np.maximum(furthest, codes.astype(np.int8))
            found = read_only(furthest)
            _remember(self._static_codes, key, found)
        return found

    def static_verdict(self, static_furthest: CodeArray) -> tuple[dict[FilterName, int], int]:
        """``count_rejections`` and the fitting nodes of ``node_codes`` for work that no
        node passes the static filters for: its codes are then the static ones alone,
        the same for every job of its shape whatever the cluster's state. A queue of
        thousands of such jobs (asking for a label no node has) is judged once per shape,
        not once per job against every node."""
        found = self._static_verdicts.get(id(static_furthest))
        if found is None or found[0] is not static_furthest:
            # node_codes without a statically feasible node: the static codes alone.
            beyond = len(FILTERS) + 1
            codes = np.where(static_furthest == beyond, PASS, static_furthest).astype(np.int8)
            found = (static_furthest, count_rejections(codes), int(np.count_nonzero(codes == PASS)))
            _remember(self._static_verdicts, id(static_furthest), found)
        return dict(found[1]), found[2]

    def runtime(self, shape: WorkShape, cand: KindCandidates) -> FloatArray:
        """Estimated run time of one member on each candidate (inf: long-running)."""
        key = (cand.shape_id, cand.k, shape.duration_s)
        found = self._runtime.get(key)
        if found is None:
            found = read_only(member_runtime_s(self.snapshot, shape, cand.k, cand.nodes))
            _remember(self._runtime, key, found)
        return found

    def traffic_weights(self, traffic: Mapping[str, float]) -> FloatArray:
        key = tuple(sorted(traffic.items()))
        found = self._traffic.get(key)
        if found is None:
            found = read_only(traffic_weights(self.snapshot.nodes.regions, traffic))
            _remember(self._traffic, key, found)
        return found

    def _build(self, shape: WorkShape, shape_id: int, k: int, rank: int) -> KindCandidates:
        static = static_filters(self.snapshot, shape, k, self.policy.latency_estimator)
        columns = self.snapshot.nodes.kinds[k]
        nodes = static.nodes
        providers = getattr(shape.work, "providers", ())
        speed_values = speed(columns.relative_speed[nodes], columns.max_speed)
        preference_values = preference(
            rank, len(shape.kind_codes), static.provider_rank, len(providers)
        )
        if self.snapshot.nodes.taints:
            avoid = untolerated_mask(self.snapshot.nodes, shape, "PreferNoSchedule")[nodes]
            preference_values = np.where(
                avoid, preference_values - PREFER_NO_SCHEDULE_PENALTY, preference_values
            )
        return KindCandidates(
            static=static,
            shape_id=shape_id,
            kind_rank=rank,
            nodes=nodes,
            nodes_list=nodes.tolist(),
            speed=read_only(speed_values),
            preference=read_only(preference_values),
            speed_list=speed_values.tolist(),
            preference_list=preference_values.tolist(),
            region=read_only(self.snapshot.nodes.region_code[nodes]),
        )


# Queued jobs looked at for the demand mix of shape fit: the head of the queue says
# enough about the mix, and a pass over tens of thousands would cost more than it tells.
_DEMAND_QUEUE_HEAD = 2000


def member_demand(snapshot: Snapshot, kind: str) -> dict[int, float]:
    """Accelerators wanted per member size of ``kind``: the training running now and
    the head of the queue (``ShapeFit``'s demand mix)."""
    demand: dict[int, float] = {}
    for alloc in snapshot.allocations:
        if alloc.work_kind == "training" and alloc.accelerator_kind == kind:
            demand[alloc.accelerators] = demand.get(alloc.accelerators, 0.0) + alloc.accelerators
    for work in snapshot.queue[:_DEMAND_QUEUE_HEAD]:
        if isinstance(work, TrainingJob) and work.accelerator_kind == kind:
            size = work.accelerators_per_worker
            demand[size] = demand.get(size, 0.0) + size * work.workers
    return demand


def _remember(cache: dict[Hashable, _V], key: Hashable, value: _V) -> None:
    if len(cache) >= _CACHE_LIMIT:
        del cache[next(iter(cache))]
    cache[key] = value
