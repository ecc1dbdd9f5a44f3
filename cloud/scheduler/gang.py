"""Choosing nodes for the members of one job: gang workers and deployment replicas.

``JobContext`` gathers, once per job, the candidate nodes of every accepted kind,
the shared dynamic scores and the job's own static score parts (speed,
preference, extra ``ScoreTerm``s). ``pick`` returns the best valid node for the
next member with the runners-up; the caller applies it to a ``Statement`` so the
next member sees it. Replica spread is re-weighted after every replica. Whether
the job is placed whole (gang) or partly (deployments with ``min_replicas``) is
decided by the caller.

A gang runs at its slowest member's pace, so the caller may keep one on a single
speed class (``speed_classes``, ``JobContext.keep_to``): nodes whose accelerators
would run a member in the same time.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .arrays import BoolArray, FloatArray, IntArray
from .candidates import CandidateCache, DynamicScores, KindCandidates, member_runtime_s
from .extensions import Candidates, evaluate_term
from .filters import PASS, dynamic_codes
from .model import PRIORITY_LEVELS, InferenceDeployment
from .plan import ScoreBreakdown
from .policy import Policy
from .scoring import spread_by_region
from .shape import WorkShape
from .snapshot import CPU_COLUMN
from .state import ClusterState

# After this many rejected argmax picks, validate all candidates at once instead.
_MAX_SCALAR_REJECTS = 16
# Re-gather a job's scores when more nodes changed than this since its last member.
_INCREMENTAL_LIMIT = 32
# At most this many speed classes are tried for one gang (the fastest that could hold it).
MAX_SPEED_CLASSES = 4


@dataclass(slots=True)
class Option:
    """One accepted accelerator kind of the job."""

    k: int
    cand: KindCandidates
    runtime_s: FloatArray  # estimated run time per candidate (inf: long-running)
    dynamic: DynamicScores
    base: FloatArray  # weighted static terms per candidate: speed, preference, extras
    extra_values: list[FloatArray]  # normalised extra ScoreTerm values per candidate
    ceiling: float  # no candidate of this option can score more
    # dynamic + base per candidate, kept current across this job's members
    partial: FloatArray | None = None
    seen: int = 0
    valid: Callable[[int], bool] | None = None  # see JobContext.validator


class Choice(NamedTuple):
    option: Option
    position: int  # index into option.cand.nodes
    node: int
    score: float
    runners_up: tuple[tuple[Option, int, float], ...]


class JobContext:
    def __init__(
        self,
        shape: WorkShape,
        cache: CandidateCache,
        policy: Policy,
        state: ClusterState,
        *,
        normalise_over: Mapping[int, IntArray] | None = None,
    ) -> None:
        """``normalise_over``: per pool column, sorted nodes (a superset of this shape's
        candidates) over which the policy's score terms are normalised, so that a job's
        shapes are scored on one scale (``Scheduler._shape_scale``); None: over the
        candidates."""
        self.shape = shape
        self.state = state
        self.policy = policy
        self.cache = cache
        work = shape.work
        self.candidates = cache.candidates(shape, cache.shape_id(shape))
        extra_terms = [
            (term, weight)
            for term in policy.score_terms
            if (weight := policy.weight(work, term.name)) > 0
        ]
        self.options: list[Option] = []
        kinds = state.snapshot.nodes.kinds
        for cand in self.candidates:
            if not cand.nodes_list:
                continue
            base, base_max = cache.static_part(shape, cand)
            runtime = cache.runtime(shape, cand)
            values = []
            # The nodes the terms are normalised over, and where the candidates are among
            # them (None: the candidates themselves).
            scale = normalise_over.get(cand.k) if normalise_over is not None else None
            if scale is None or scale.size == cand.nodes.size:
                scored = Candidates(
                    cand.nodes, kinds[cand.k].kind, shape.accelerators, runtime, column=cand.k
                )
                positions = None
            else:
                scored = Candidates(
                    scale,
                    kinds[cand.k].kind,
                    shape.accelerators,
                    member_runtime_s(state.snapshot, shape, cand.k, scale),
                    column=cand.k,
                )
                positions = np.searchsorted(scale, cand.nodes)
            for term, weight in extra_terms:
                normalised = evaluate_term(term, state.snapshot, work, scored)
                if positions is not None:
                    normalised = normalised[positions]
                values.append(normalised)
                base = base + weight * normalised
                base_max = float(base.max())
            dynamic = cache.dynamic(shape, cand.k)
            ceiling = base_max + dynamic.ceiling
            if isinstance(work, InferenceDeployment):
                ceiling += shape.spread_weight  # spread is at most 1
            self.options.append(Option(cand.k, cand, runtime, dynamic, base, values, ceiling))
        # Replica spread: replicas per region (those already running count too) and
        # the deployment's traffic share per region.
        self.spread: IntArray | None = None
        self._traffic: FloatArray | None = None
        if isinstance(work, InferenceDeployment) and shape.spread_weight > 0:
            existing = state.work_node_count.get(work.work_id, {})
            if shape.members > 1 or existing:
                nodes = state.snapshot.nodes
                self.spread = np.zeros(len(nodes.regions), dtype=np.int64)
                for node, count in existing.items():
                    self.spread[nodes.region_code[node]] += count
                self._traffic = cache.traffic_weights(work.traffic_by_region)
        self._initial_spread = self.spread.copy() if self.spread is not None else None
        self._spread_table: FloatArray | None = None  # spread per region, as of this pick
        self._first_member = len(state.work_allocs.get(work.work_id, {}))
        self._next_member = self._first_member
        self._affinity = work.group is not None or bool(work.anti_affinity_groups)
        self.runtime_class_s: float | None = None  # see keep_to
        self.within: BoolArray | None = None  # see keep_within
        w_packing, w_load, w_speed, w_preference = shape.builtin_weights
        names = ["packing", "load", "speed", "preference"]
        weights = [w_packing, w_load, w_speed, w_preference]
        for term, weight in extra_terms:
            names.append(term.name)
            weights.append(weight)
        if self.spread is not None:
            names.append("spread")
            weights.append(shape.spread_weight)
        self.term_names = tuple(names)
        self.term_weights = tuple(weights)

    @property
    def has_candidates(self) -> bool:
        return bool(self.options)

    def keep_to(self, runtime_s: float | None) -> None:
        """From now on pick only nodes whose estimated run time is ``runtime_s`` (one
        speed class); None: any node."""
        self.runtime_class_s = runtime_s
        for option in self.options:
            option.valid = None  # built for the previous restriction

    def keep_within(self, nodes: BoolArray | None) -> None:
        """From now on pick only the nodes where ``nodes`` (a mask over all nodes) is
        true: one topology domain (topology.py); None: any node."""
        self.within = nodes
        for option in self.options:
            option.valid = None

    def allowed(self, option: Option) -> BoolArray | None:
        """Mask over ``option``'s candidates: those the speed class and topology domain
        kept to allow (None: all), for the preemption path."""
        result: BoolArray | None = None
        if self.runtime_class_s is not None:
            result = option.runtime_s == self.runtime_class_s
        if self.within is not None:
            inside = self.within[option.cand.nodes]
            result = inside if result is None else result & inside
        return result

    def _restricted(self) -> bool:
        return (
            self._affinity
            or self.state.has_reservations
            or shape_limited(self)
            or self.runtime_class_s is not None
            or self.within is not None
        )

    def reset(self) -> None:
        """Forget the members of a discarded attempt."""
        self.spread = self._initial_spread.copy() if self._initial_spread is not None else None
        self._next_member = self._first_member

    def next_member_id(self) -> tuple[int, str]:
        """Member number and allocation id, skipping ids already running."""
        while True:
            member = self._next_member
            self._next_member += 1
            allocation_id = f"{self.shape.work.work_id}/{member}"
            if allocation_id not in self.state.allocations:
                return member, allocation_id

    def record_member(self, node: int) -> None:
        if self.spread is not None:
            self.spread[self.state.snapshot.nodes.region_code[node]] += 1

    # -- choosing -----------------------------------------------------------------

    def scores(self, option: Option) -> tuple[FloatArray, bool]:
        """Current total score of each candidate of ``option``, and whether the array is
        kept by the option (the caller must then restore what it changes)."""
        dynamic = option.dynamic
        log = dynamic.log
        changed = len(log) - option.seen
        values = dynamic.sync()
        if option.partial is None or changed > _INCREMENTAL_LIMIT:
            option.partial = values[option.cand.nodes] + option.base
        elif changed:
            # Later members of the same job: only the nodes just used have changed.
            nodes = option.cand.nodes_list
            partial, base = option.partial, option.base
            for node in log[option.seen :]:
                position = bisect_left(nodes, node)
                if position < len(nodes) and nodes[position] == node:
                    partial[position] = values[node] + base[position]
        option.seen = len(log)
        if self.spread is None:
            return option.partial, True
        assert self._spread_table is not None
        bonus = self.shape.spread_weight * self._spread_table
        return option.partial + bonus[option.cand.region], False

    def validator(self, option: Option) -> Callable[[int], bool] | None:
        """Checks for what the shared scores cannot know: this job's own replicas,
        anti-affinity, reservations. None when nothing needs checking."""
        state = self.state
        if not self._restricted():
            return None
        shape = self.shape
        work = shape.work
        nodes = option.cand.nodes_list
        runtime = option.runtime_s
        k = option.k
        limit = shape.max_per_node
        avoids = work.anti_affinity_groups
        group = work.group
        check_affinity = group is not None or bool(avoids)
        reservations = state.has_reservations
        accelerators, host_memory = shape.accelerators, shape.host_memory_bytes
        start_s = state.reservation_start_s[k]
        slack = state.reservation_slack_accelerators[k]
        host_start_s = state.reservation_host_start_s
        host_slack = state.reservation_slack_host_memory_bytes
        cpu_cores = shape.cpu_cores
        cpu_start_s = state.reservation_start_s[CPU_COLUMN]
        cpu_slack = state.reservation_slack_accelerators[CPU_COLUMN]
        runtime_class_s = self.runtime_class_s
        within = self.within

        def valid(position: int) -> bool:
            if runtime_class_s is not None and runtime[position] != runtime_class_s:
                return False
            node = nodes[position]
            if within is not None and not within[node]:
                return False
            if limit is not None and state.members_on(work.work_id, node) >= limit:
                return False
            if check_affinity and state.anti_affinity_conflict(node, group, avoids):
                return False
            if reservations:
                end = state.now + runtime[position]
                if end > start_s[node] and slack[node] < accelerators:
                    return False
                if host_memory and end > host_start_s[node] and host_slack[node] < host_memory:
                    return False
                if cpu_cores and end > cpu_start_s[node] and cpu_slack[node] < cpu_cores:
                    return False
            return True

        return valid

    def valid_mask(self, option: Option) -> BoolArray:
        codes = dynamic_codes(self.state, self.shape, option.cand.static, option.runtime_s)
        result: BoolArray = codes == PASS
        if self.runtime_class_s is not None:
            result &= option.runtime_s == self.runtime_class_s
        if self.within is not None:
            result &= self.within[option.cand.nodes]
        return result

    def pick(self, kinds: Collection[int] | None = None) -> Choice | None:
        """Best valid (option, node) for the next member, with runners-up."""
        wanted = 1 + self.policy.runners_up
        if self.spread is not None:
            assert self._traffic is not None
            self._spread_table = spread_by_region(self._traffic, self.spread)
        found: list[tuple[float, int, int, Option, int]] = []
        for order, option in enumerate(self.options):
            if kinds is not None and option.k not in kinds:
                continue
            if len(found) >= wanted and option.ceiling < found[wanted - 1][0]:
                continue  # cannot reach the current top list (e.g. a less preferred kind)
            dynamic = option.dynamic
            full_at = dynamic.nothing_fits_at_evictions.get(option.cand.shape_id)
            if full_at is not None and full_at == dynamic.evictions():
                continue  # nothing fitted there and nothing has been evicted since
            scores, kept = self.scores(option)
            top = self._top_valid(option, scores, kept, wanted)
            # Judge from the shared scores alone (``partial``: -inf exactly where a member
            # does not fit), never from ``scores``: this job's own checks (replica limit,
            # anti-affinity, reservations) may have masked nodes other jobs can use.
            partial = option.partial
            if not top and partial is not None and partial.size and partial.max() == -np.inf:
                dynamic.nothing_fits_at_evictions[option.cand.shape_id] = dynamic.evictions()
            nodes = option.cand.nodes_list
            for position, score in top:
                found.append((score, order, nodes[position], option, position))
            if len(found) > len(top):  # several kinds contributed: merge them
                found.sort(key=_best_first)
        if not found:
            return None
        score, _, node, option, position = found[0]
        runners = tuple((o, p, s) for s, _, _, o, p in found[1:wanted])
        return Choice(option, position, node, score, runners)

    def _top_valid(
        self, option: Option, scores: FloatArray, kept: bool, wanted: int
    ) -> list[tuple[int, float]]:
        """Up to ``wanted`` valid positions, best first (ties: lowest node)."""
        valid = None
        if self._restricted():
            if option.valid is None:
                option.valid = self.validator(option)
            valid = option.valid
        chosen: list[tuple[int, float]] = []
        if valid is None and scores.size:
            # The common case: nothing to validate, so the top entries are the answer.
            for _ in range(wanted):
                position = int(scores.argmax())
                score = float(scores[position])
                if score == -np.inf:
                    break
                scores[position] = -np.inf
                chosen.append((position, score))
            if kept:
                _restore(scores, chosen)
            return chosen
        masked: list[tuple[int, float]] = []
        rejects = 0
        while len(chosen) < wanted and scores.size:
            position = int(scores.argmax())
            score = float(scores[position])
            if score == -np.inf:
                break
            scores[position] = -np.inf
            masked.append((position, score))
            if valid is None or valid(position):
                chosen.append((position, score))
                continue
            rejects += 1
            if rejects > _MAX_SCALAR_REJECTS:
                # Many invalid top nodes (e.g. a crowded anti-affinity group): filter
                # the whole array once, on a private copy, instead of node by node.
                private = np.where(self.valid_mask(option), scores, -np.inf)
                if kept:
                    _restore(scores, masked)
                    masked, kept = [], False
                scores, valid = private, None
        if kept:
            _restore(scores, masked)
        return chosen

    # -- explaining ---------------------------------------------------------------

    def breakdowns(self, choice: Choice) -> list[ScoreBreakdown]:
        """The terms behind the chosen node's score and each runner-up's, now (before
        the member is placed)."""
        entries = [(choice.option, choice.position, choice.score), *choice.runners_up]
        node_ids = self.state.snapshot.nodes.node_ids
        names, weights = self.term_names, self.term_weights
        spread = self._spread_table
        result = []
        for option, position, total in entries:
            cand = option.cand
            dynamic = option.dynamic
            node = cand.nodes_list[position]
            k = option.k
            packing, load = dynamic.parts_one(node)
            values = (
                packing,
                load,
                cand.speed_list[position],
                cand.preference_list[position],
                *[extra.item(position) for extra in option.extra_values],
                *(() if spread is None else (spread.item(cand.region.item(position)),)),
            )
            kind = self.state.snapshot.nodes.kinds[k].kind
            result.append(ScoreBreakdown(node_ids[node], kind, total, names, values, weights))
        return result


def speed_classes(job: JobContext, slowest_s: float, *, preempt: bool = False) -> list[float]:
    """Run times of the speed classes that might hold the whole gang and finish no
    later than ``slowest_s``, fastest first, at most ``MAX_SPEED_CLASSES``.

    "Might": enough members fit the free accelerators of the class's candidates (with
    ``preempt``, also those lower-priority work holds), within the topology domain the
    job keeps to; quota, host memory and reservations are left to the attempt itself.
    """
    shape = job.shape
    limit_s = slowest_s + 1e-6  # it came from an end time: now + run time - now
    room: dict[float, int] = {}
    for option in job.options:
        runtime = option.runtime_s
        nodes = option.cand.nodes
        members = members_per_node(job, option, preempt=preempt)
        if job.within is not None:
            members = np.where(job.within[nodes], members, 0)
        for runtime_s in np.unique(runtime[runtime <= limit_s]):
            value = float(runtime_s)
            room[value] = room.get(value, 0) + int(members[runtime == runtime_s].sum())
    fitting = sorted(value for value, count in room.items() if count >= shape.members)
    return fitting[:MAX_SPEED_CLASSES]


def members_per_node(job: JobContext, option: Option, *, preempt: bool) -> IntArray:
    """Per candidate node of ``option``, how many of the job's members might fit there
    now: its free accelerators (with ``preempt``, plus those lower-priority work holds)
    over a member's, within the job's per-node cap. An estimate: quota, host memory and
    reservations are left to the attempt itself."""
    shape = job.shape
    state = job.state
    nodes = option.cand.nodes
    available = state.free[option.k][nodes]
    lower = shape.rank + 1
    if preempt and lower < PRIORITY_LEVELS:
        available = available + state.evictable_accelerators[option.k][lower:][:, nodes].sum(axis=0)
        if option.k == CPU_COLUMN:  # the cores GPU/NPU work holds beside its devices
            available = available + state.evictable_cpu_cores[lower:][:, nodes].sum(axis=0)
    members: IntArray = available // shape.accelerators
    if shape.max_per_node is not None:
        members = np.minimum(members, shape.max_per_node)
    return members


def _best_first(entry: tuple[float, int, int, Option, int]) -> tuple[float, int, int]:
    return (-entry[0], entry[1], entry[2])


def shape_limited(job: JobContext) -> bool:
    """The job may not put more members on a node than allowed and already has some."""
    return job.shape.max_per_node is not None and bool(
        job.state.work_node_count.get(job.shape.work.work_id)
    )


def _restore(scores: FloatArray, masked: list[tuple[int, float]]) -> None:
    for position, score in masked:
        scores[position] = score
