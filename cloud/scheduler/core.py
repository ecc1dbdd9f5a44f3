"""``schedule(snapshot, policy) -> Plan``: one pure, deterministic scheduling pass.

For each job in queue order (queue_order.py):

0. a tenant at its ``max_running``, or a job array whose throttle this pass has
   used up (array_cap.py), keeps the job waiting (code ``quota``), evicting nothing;
1. candidates: static filters per accepted kind (filters.py, cached per shape);
2. plain attempt: members one by one, each within quota (quota.py), on the best
   valid node (gang.py, candidates.py), all inside one Statement;
3. if incomplete and something could be evicted: the same with preemption
   (preemption.py); borrowers reclaimed / own lower-priority work evicted when
   quota is the obstacle. A member that cannot be brought within quota is rolled
   back to its savepoint, victims included, so nothing is evicted for it;
   A whole gang whose members would run at different speeds is tried again on each
   single speed class that could hold it and finish no later (gang.speed_classes):
   the best-scoring such placement wins, so fast accelerators are not held at a
   slow member's pace while a placement of one class would do;
   A training job with alternative gang shapes (flexible shapes) gets a plain
   attempt in each, and the whole placement with the best mean score per member
   wins (``_best_shape``); the rest of the steps use its declared shape;
4. whole (or, for deployments, at least ``min_replicas``) -> commit; else discard,
   explain why (explain.py) and, for a capacity problem, reserve the earliest
   slot so later jobs cannot push it back (backfill.py).

Before step 2, a flexible training job (deadline or ``max_delay_s``) is offered to
the policy's ``start_advisor`` (temporal shifting). A deferral keeps it pending
(code ``deferred``) unless its target is not strictly after now or later than
the latest start that meets the deadline and maximum delay on every candidate:
shifting may never be the reason a deadline is missed. With ``Policy.patience_s``
every other training job is offered too, and may be held no later than that long
after its submission.

Hooks (score terms, latency estimator, start advisor) run while the job's
candidates are built and while the advisor is asked, before anything is placed. A
hook that fails for the job makes it pending with code ``hook-failed`` and the
pass goes on with the next job (extensions.py).

No I/O, no clock: time is ``snapshot.now``. Equal snapshots give equal plans.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from . import explain
from .array_cap import ArrayCapBook
from .arrays import IntArray
from .backfill import Slot, earliest_slot, may_free_up, reserve
from .candidates import CandidateCache
from .cordon_block import cordoned_blockers, waiting_for_cordoned
from .explain import PreemptionOutcome
from .extensions import (
    Booking,
    Candidates,
    HookFailed,
    StartCandidates,
    advise_start,
)
from .filters import PASS, count_rejections, node_codes
from .gang import Choice, JobContext, Option, speed_classes
from .mig_quota import WITHIN, governs, mig_block
from .model import KINDS, InferenceDeployment, TrainingJob, Work, rescue_marks
from .plan import (
    Deferral,
    HookFailure,
    NeverFits,
    Pending,
    PendingCode,
    Placement,
    Plan,
    Preemption,
    Reservation,
)
from .policy import DEFAULT_POLICY, Policy
from .preemption import Preemptor
from .queue_order import QueueOrder
from .quota import Admission, QuotaBook
from .shape import WorkShape, make_shape
from .snapshot import CPU_COLUMN, Snapshot
from .speed_mixing import earliest_single_class, speed_class_note
from .state import ClusterState
from .statement import Statement
from .topology import (
    Domains,
    domain_room,
    domains_to_try,
    gang_domains,
    topology_note,
    within_one,
)
from .unschedulable import FleetFit

_ATTEMPTS_PER_RESERVATION = 4
# Deadline rescues (``Policy.deadline_preemption``) looked at per pass, each an earliest
# slot per option and an attempt with eviction: a queue of many late jobs costs a pass
# no more than this many.
_RESCUES_PER_PASS = 4


@dataclass(slots=True)
class _Attempt:
    stmt: Statement
    placements: list[Placement] = field(default_factory=list)
    quota_block: Admission | None = None


class Scheduler:
    """One pass over a snapshot. ``step`` decides the next job in queue order, so a
    caller (the benchmark, the simulator) can observe each decision; ``run`` does all."""

    def __init__(self, snapshot: Snapshot, policy: Policy = DEFAULT_POLICY) -> None:
        self.snapshot = snapshot
        self.policy = policy
        self.state = ClusterState(snapshot)
        self.quota = QuotaBook(snapshot.tenants, self.state)
        self.cache = CandidateCache(snapshot, policy, self.state)
        self.preemptor = Preemptor(self.state, self.quota)
        self.fleet = FleetFit(snapshot)  # whether work could ever run here
        self.arrays = ArrayCapBook(snapshot.array_caps)  # job array throttles
        self.queue = QueueOrder(
            snapshot.queue,
            self.state,
            self.quota,
            policy.starvation_guard_s,
            fair=policy.queue_order == "fair",
            deadline_guard_s=policy.deadline_guard_s,
        )
        self._placements: list[Placement] = []
        self._preemptions: list[Preemption] = []
        self._pending: list[Pending] = []
        self._reservations: list[Reservation] = []
        self._order: list[str] = []
        self._reservation_attempts = 0
        self._rescues = 0
        self._bookings: list[Booking] = []  # for the start advisor, if any
        # Why a gang's whole placement was not kept (speed_mixing.py), for its explanation.
        self._notes: dict[str, str] = {}

    def step(self) -> bool:
        """Decide the next job; False when the queue is exhausted."""
        work = self.queue.pop()
        if work is None:
            return False
        self._order.append(work.work_id)
        self._decide(work)
        return True

    def run(self, max_decisions: int | None = None) -> Plan:
        """Decide the queue in order, or only its first `max_decisions` items."""
        while (max_decisions is None or len(self._order) < max_decisions) and self.step():
            pass
        return self.plan()

    def run_until(self, work_ids: Collection[str]) -> Plan:
        """Decide the queue in order until every one of `work_ids` is decided: their
        decisions are those of a whole pass (nothing later in the order changes them)."""
        waiting = set(work_ids)
        while waiting and self.step():
            waiting.discard(self._order[-1])
        return self.plan()

    def plan(self) -> Plan:
        undecided: frozenset[str] = frozenset()
        if len(self._order) < len(self.snapshot.queue):
            decided = set(self._order)
            undecided = frozenset(
                w.work_id for w in self.snapshot.queue if w.work_id not in decided
            )
        return Plan(
            now=self.snapshot.now,
            placements=tuple(self._placements),
            preemptions=tuple(self._preemptions),
            pending=tuple(self._pending),
            reservations=tuple(self._reservations),
            order=tuple(self._order),
            undecided=undecided,
        )

    # -- one job ----------------------------------------------------------------

    def _decide(self, work: Work) -> None:
        if self._over_running_limit(work) or self._over_array_throttle(work):
            return
        never = self.fleet.never_fits(work)
        alternatives: list[TrainingJob] = []
        if isinstance(work, TrainingJob) and work.alternative_shapes:
            work, alternatives, never = self._shapes_to_try(work, never)
        shape = make_shape(work, self.policy)
        # Every hook runs here, before anything is placed: a failure leaves nothing
        # to undo, and only this job waits.
        try:
            scale = (
                self._shape_scale(work, alternatives)
                if alternatives and isinstance(work, TrainingJob)
                else None
            )
            job = JobContext(shape, self.cache, self.policy, self.state, normalise_over=scale)
            deferral = self._advise(job) if job.has_candidates and never is None else None
        except HookFailed as failed:
            self._pend_hook_failure(shape, failed.failure)
            return
        if never is not None or not job.has_candidates:
            # Nothing to try: no node could ever hold it, or none passes the static filters.
            self._pend(job, None, 0, "off", never=never)
            return
        if deferral is not None:
            self._bookings.append(
                Booking(
                    zone=deferral.zone,
                    accelerator_kind=deferral.accelerator_kind,
                    accelerators=deferral.accelerators,
                    start_s=deferral.start_at,
                    end_s=deferral.start_at + deferral.runtime_s,
                    member_accelerators=shape.accelerators,
                )
            )
            self._pend(job, None, 0, "off", deferral=deferral)
            return
        if alternatives:
            job, attempt = self._best_shape(job, alternatives, scale)
            shape = job.shape
        else:
            attempt = self._settled(job, preempt=False)
        if len(attempt.placements) == shape.members:
            self._commit(job, attempt)
            return
        best_fit = len(attempt.placements)
        quota_block = attempt.quota_block
        attempt.stmt.discard()
        job.reset()
        preemption: PreemptionOutcome = "off"
        if self.policy.preemption:
            preemption = "nothing-evictable"
            if self.preemptor.can_help(job, self._admissions(job)):
                preemption = "tried"
                attempt = self._settled(job, preempt=True)
                placed = len(attempt.placements)
                if placed == shape.members or shape.min_members <= placed >= best_fit:
                    self._commit(job, attempt)
                    if placed < shape.members:
                        self._pend(job, attempt.quota_block, placed, preemption, placed=True)
                    return
                # Its verdict wins: it records quota whenever quota was (also) in the way.
                quota_block = attempt.quota_block
                attempt.stmt.discard()
                job.reset()
        if quota_block is None and self._rescued(job):
            return
        if best_fit >= shape.min_members:
            # A deployment that accepts a partial placement: redo the plain attempt
            # (the state is back to where it was, so it places the same replicas).
            attempt = self._attempt(job, preempt=False)
            self._commit(job, attempt)
            self._pend(job, attempt.quota_block, len(attempt.placements), preemption, placed=True)
            return
        self._pend(job, self._restated(job, quota_block), best_fit, preemption)

    def _restated(self, job: JobContext, block: Admission | None) -> Admission | None:
        """The blocking admission with its usage figures as the cluster stands once the
        attempts are undone: taken mid-attempt, they counted evictions made for earlier
        members (a reclaim from a borrower) that the discarded attempt gave back, and a
        person was told "cohort 2/4" of a cohort at 6."""
        quota = block.quota if block is not None else None
        if block is None or quota is None or quota.kind not in KINDS:
            return block  # cores and slices: their figures are not moved by evictions
        kind = KINDS.index(quota.kind)
        column = next((o.k for o in job.options if self.state.column_kinds[o.k] == kind), None)
        if column is None:
            return block
        fresh = self.quota.admit(self.state, quota.tenant, column, job.shape.accelerators)
        if fresh.quota is None:
            return block
        restated = dataclasses.replace(
            quota, usage=fresh.quota.usage, cohort_usage=fresh.quota.cohort_usage
        )
        return dataclasses.replace(block, quota=restated)

    def _shapes_to_try(
        self, work: TrainingJob, never: NeverFits | None
    ) -> tuple[TrainingJob, list[TrainingJob], NeverFits | None]:
        """Flexible shapes: the job to decide (the declared shape, or where the fleet
        could never run that, its first alternative that it could), the other shapes
        worth an attempt, and the fleet's verdict on the first. Deferral, preemption,
        reservation and the reason it waits are those of the first."""
        others = [
            reshaped
            for alternative in work.alternative_shapes
            if self.fleet.never_fits(reshaped := work.reshaped(alternative)) is None
        ]
        if never is None or not others:
            return work, others, never
        return others[0], others[1:], None

    def _shape_scale(
        self, work: TrainingJob, alternatives: list[TrainingJob]
    ) -> dict[int, IntArray] | None:
        """Per pool column, the candidates of any of the job's shapes: its shapes' score
        terms are normalised over them all. A term normalised over each shape's own
        candidates scores the same node differently per shape (a carbon term's best is
        judged against the dirtiest candidate, and a 4-GPU member has dirtier 4-GPU
        nodes to be judged against than an 8-GPU one), so the mean scores compared in
        ``_best_shape`` would measure the candidate sets, not the placements. None:
        the policy has no such terms."""
        if not self.policy.score_terms:
            return None
        over: dict[int, list[IntArray]] = {}
        for each in (work, *alternatives):
            shape = make_shape(each, self.policy)
            for cand in self.cache.candidates(shape, self.cache.shape_id(shape)):
                over.setdefault(cand.k, []).append(cand.nodes)
        return {k: np.unique(np.concatenate(nodes)) for k, nodes in over.items()}

    def _best_shape(
        self, job: JobContext, alternatives: list[TrainingJob], scale: dict[int, IntArray] | None
    ) -> tuple[JobContext, _Attempt]:
        """Flexible shapes: of a plain attempt at each alternative and at ``job``, the
        whole placement with the best mean score per member (each member of a shape
        holds the same share, so this is the score per accelerator; a sum would favour
        more, smaller workers), each shape's score terms normalised over the candidates
        of all of them (``_shape_scale``). Ties keep ``job`` (the declared shape), then
        the earlier alternative. None whole: ``job``'s attempt as it came, for the
        preemption and the explanation that follow, as without alternatives.

        Every attempt is judged on the capacity before any of them, as the speed classes
        and domains are (``_one_speed``, ``_settled``). ``job`` goes last, so that its
        attempt, the usual winner, is kept as it is; an alternative that wins is redone
        on that capacity and places the same members. An alternative for which the free
        accelerators could not hold every member is not tried, and a hook that fails for
        one only rules that shape out."""
        best: tuple[float, JobContext] | None = None
        work_id = job.shape.work.work_id
        for alternative in alternatives:
            try:
                trial_job = JobContext(
                    make_shape(alternative, self.policy),
                    self.cache,
                    self.policy,
                    self.state,
                    normalise_over=scale,
                )
            except HookFailed:
                continue
            if not self._room_for(trial_job):
                continue
            trial = self._settled(trial_job, preempt=False)
            self._notes.pop(work_id, None)  # a note on a shape not kept says nothing
            if len(trial.placements) == trial_job.shape.members:
                score = _mean_score(trial)
                if best is None or score > best[0]:
                    best = (score, trial_job)
            trial.stmt.discard()
            trial_job.reset()
        attempt = self._settled(job, preempt=False)
        whole = len(attempt.placements) == job.shape.members
        if best is None or (whole and _mean_score(attempt) >= best[0]):
            return job, attempt
        attempt.stmt.discard()
        job.reset()
        self._notes.pop(work_id, None)
        return best[1], self._settled(best[1], preempt=False)

    def _room_for(self, job: JobContext) -> bool:
        """Whether the free accelerators of its candidates could hold every member (what
        a plain attempt needs at least; host memory and cores aside)."""
        shape = job.shape
        room = 0
        for option in job.options:
            free = self.state.free[option.k][option.cand.nodes]
            room += int((free // shape.accelerators).sum())
            if room >= shape.members:
                return True
        return False

    def _advise(self, job: JobContext) -> Deferral | None:
        """The start advisor's deferral for a flexible training job, if it is safe."""
        advisor = self.policy.start_advisor
        shape = job.shape
        work = shape.work
        patience_s = self.policy.patience_s
        if advisor is None or not isinstance(work, TrainingJob):
            return None
        if not work.flexible and patience_s <= 0:
            return None
        state = self.state
        options = []
        latest = math.inf
        for option in job.options:
            nodes = option.cand.nodes
            fits = state.free[option.k][nodes] >= shape.accelerators
            if shape.host_memory_bytes:
                fits &= state.host_free[nodes] >= shape.host_memory_bytes
            if shape.cpu_cores:
                fits &= state.free[CPU_COLUMN][nodes] >= shape.cpu_cores
            candidates = Candidates(
                nodes,
                KINDS[state.column_kinds[option.k]],
                shape.accelerators,
                option.runtime_s,
                column=option.k,
            )
            options.append(StartCandidates(candidates, fits))
            # Safe on every candidate, whichever node it gets when it starts.
            latest = min(latest, work.latest_start(float(option.runtime_s.max())))
        if not work.flexible:
            latest = work.submitted_at + patience_s  # it may only wait that long
        deferral = advise_start(advisor, state.snapshot, work, options, self._bookings)
        if deferral is None or not state.now < deferral.start_at <= latest:
            return None
        return deferral

    def _settled(self, job: JobContext, *, preempt: bool) -> _Attempt:
        """An attempt at placing ``job``: a partial one as it came, or the whole placement
        to keep, within one topology domain (topology.py) and on one speed class
        (``_one_speed``); an empty attempt when neither allows one (the gang then waits).

        A gang is anchored: once its first (best-scoring) member is placed, the rest are
        picked within that member's domain, the placement the domain search below would
        try first anyway, without placing the gang twice. Only where the anchored gang
        is not placed whole is the unanchored attempt made and the other domains tried."""
        members = job.shape.members
        domains = gang_domains(self.snapshot, job.shape)
        if domains is None:
            attempt = self._attempt(job, preempt=preempt)
            if len(attempt.placements) < members:
                return attempt
            return self._one_speed(job, attempt, preempt=preempt)
        attempt = self._attempt(job, preempt=preempt, anchor=domains)
        tried: int | None = None  # the anchor's domain, when the anchored gang failed there
        if job.within is not None:
            anchored_in = self._domain_of(domains, attempt.placements[0])
            if len(attempt.placements) == members:
                kept = self._one_speed(job, attempt, preempt=preempt)
                if len(kept.placements) == members:
                    job.keep_within(None)
                    return kept
                attempt = kept
            attempt.stmt.discard()
            job.reset()
            job.keep_within(None)
            tried = anchored_in
            attempt = self._attempt(job, preempt=preempt)
        if len(attempt.placements) < members:
            return attempt
        if within_one(domains, self.snapshot, attempt.placements):
            job.keep_within(domains.nodes_in(self._domain_of(domains, attempt.placements[0])))
            kept = self._one_speed(job, attempt, preempt=preempt)
            job.keep_within(None)
            return kept
        # The domain of its best-scoring member first: where the gang fits whole there,
        # that placement is kept as it is, with no other domain tried or redone.
        preferred = self._domain_of(domains, attempt.placements[0])
        attempt.stmt.discard()  # the domains are judged on the capacity before it
        job.reset()
        room = domain_room(job, domains, preempt=preempt)
        others = domains_to_try(room, job.shape.members)
        if tried in others:
            others.remove(tried)
        if preferred in others:
            others.remove(preferred)
            job.keep_within(domains.nodes_in(preferred))
            first = self._one_speed(job, self._attempt(job, preempt=preempt), preempt=preempt)
            job.keep_within(None)
            if len(first.placements) == job.shape.members:
                return first
            first.stmt.discard()
            job.reset()
        best: tuple[float, int] | None = None  # (summed score, domain)
        for domain in others:
            job.keep_within(domains.nodes_in(domain))
            trial = self._one_speed(job, self._attempt(job, preempt=preempt), preempt=preempt)
            if len(trial.placements) == job.shape.members:
                score = sum(p.chosen.total for p in trial.placements)
                if best is None or score > best[0]:
                    best = (score, domain)
            trial.stmt.discard()
            job.reset()
        if best is None:
            job.keep_within(None)
            return _Attempt(Statement(self.state))
        # Redo the winner: the state is back where it was, so it places the same members.
        job.keep_within(domains.nodes_in(best[1]))
        chosen = self._one_speed(job, self._attempt(job, preempt=preempt), preempt=preempt)
        job.keep_within(None)
        return chosen

    def _domain_of(self, domains: Domains, placement: Placement) -> int:
        return int(domains.codes[self.snapshot.nodes.index[placement.node_id]])

    def _one_speed(self, job: JobContext, attempt: _Attempt, *, preempt: bool) -> _Attempt:
        """``attempt`` (a whole placement), or, for a gang it spreads over speed classes,
        the best-scoring whole placement on one class that finishes no later; if none
        fits now, the mixed one only when waiting for one class would not finish sooner
        (speed_mixing.py), else an empty attempt."""
        ends = {p.expected_end for p in attempt.placements if p.expected_end is not None}
        if job.shape.members < 2 or len(ends) < 2:
            return attempt
        attempt.stmt.discard()  # the classes are judged on the capacity before it
        job.reset()
        mixed_runtime_s = max(ends) - self.state.now
        best: tuple[float, float] | None = None  # (summed score, run time)
        for runtime_s in speed_classes(job, mixed_runtime_s, preempt=preempt):
            job.keep_to(runtime_s)
            trial = self._attempt(job, preempt=preempt)
            if len(trial.placements) == job.shape.members:
                score = sum(p.chosen.total for p in trial.placements)
                if best is None or score > best[0]:
                    best = (score, runtime_s)
            trial.stmt.discard()
            job.reset()
        job.keep_to(None)  # the estimate and any redo below choose among all classes
        if best is None:
            wait = earliest_single_class(job, mixed_runtime_s)
            if wait is not None and wait.finish_at < self.state.now + mixed_runtime_s - 1e-6:
                self._notes[job.shape.work.work_id] = speed_class_note(
                    wait, mixed_runtime_s, self.state.now
                )
                return _Attempt(Statement(self.state))
        # Redo the winner (or the mixed placement): the state is back where it was.
        job.keep_to(None if best is None else best[1])
        chosen = self._attempt(job, preempt=preempt)
        job.keep_to(None)
        if len(chosen.placements) < job.shape.members:  # never a part of a gang
            chosen.stmt.discard()
            job.reset()
            chosen = self._attempt(job, preempt=preempt)
        return self._at_gang_pace(job, chosen)

    def _at_gang_pace(self, job: JobContext, attempt: _Attempt) -> _Attempt:
        """A whole gang spread over speed classes with every member's expected end the
        gang's: it runs in lockstep at its slowest member's pace (speed_mixing.py), so
        a fast member's accelerators free when the slowest member's do, and reservations
        and deadline rescues must plan on that. Where a member, held that long, would
        take what a reservation on its node keeps, the gang waits (an empty attempt)."""
        ends = [p.expected_end for p in attempt.placements if p.expected_end is not None]
        if len(attempt.placements) < job.shape.members or len(set(ends)) < 2:
            return attempt
        gang_end = max(ends)
        index = self.snapshot.nodes.index
        aligned = []
        overrun = False
        for placement in attempt.placements:
            if placement.expected_end is not None and placement.expected_end < gang_end:
                placement = dataclasses.replace(placement, expected_end=gang_end)
                node = index[placement.node_id]
                slack_before = self._reservation_slack(placement, node)
                attempt.stmt.restate(placement, node)
                slack_after = self._reservation_slack(placement, node)
                overrun = overrun or any(
                    after < min(before, 0)
                    for before, after in zip(slack_before, slack_after, strict=True)
                )
            aligned.append(placement)
        attempt.placements = aligned
        if overrun:
            attempt.stmt.discard()
            job.reset()
            return _Attempt(Statement(self.state))
        return attempt

    def _reservation_slack(self, placement: Placement, node: int) -> tuple[int, int, int]:
        """What reservations on ``node`` leave to work running past their start, of the
        placement's pool, host memory and CPU cores (backfill.py)."""
        state = self.state
        k = state.column_of(placement, node)
        return (
            state.reservation_slack_accelerators[k].item(node),
            state.reservation_slack_host_memory_bytes.item(node),
            state.reservation_slack_accelerators[CPU_COLUMN].item(node),
        )

    def _admissions(self, job: JobContext, placed: int = 0) -> dict[int, Admission]:
        """The next member's admission per kind, ``placed`` of the job's members being
        placed in this attempt already."""
        if governs(self.state, job.shape.work):
            # Its slices count against its profile's quota alone (mig_block, _attempt).
            return {o.k: WITHIN for o in job.options}
        tenant, need = job.shape.work.tenant, job.shape.accelerators
        work_need = need * _members_needed(job.shape, placed)
        admit, state = self.quota.admit, self.state
        return {o.k: admit(state, tenant, o.k, need, work_need) for o in job.options}

    def _cores_admission(self, job: JobContext, placed: int = 0) -> Admission | None:
        """The CPU cores a GPU/NPU member holds beside its accelerators, against its
        tenant's ``cpu`` quota; None where the tenant has none (the cores are then
        capacity only, see ``ClusterState.cores_charged``)."""
        shape = job.shape
        tenant = shape.work.tenant
        if not shape.cpu_cores or tenant not in self.state.cores_charged:
            return None
        work_cores = shape.cpu_cores * _members_needed(shape, placed)
        return self.quota.admit(self.state, tenant, CPU_COLUMN, shape.cpu_cores, work_cores)

    def _attempt(
        self, job: JobContext, *, preempt: bool, anchor: Domains | None = None
    ) -> _Attempt:
        """Place ``job``'s members one by one, best-scoring first; with ``anchor``, the
        members after the first keep to the first's domain (``job.within`` then holds
        it; it stays None where that member's node is in no domain)."""
        attempt = _Attempt(Statement(self.state))
        stmt = attempt.stmt
        shape = job.shape
        for _ in range(shape.members):
            # A slice quota (mig_quota.py) is never made room under by evicting: over it,
            # the member waits.
            if (slices_over := mig_block(self.state, shape)) is not None:
                attempt.quota_block = slices_over
                break
            # Everything this member changes (victims, its allocation) comes after this.
            savepoint = stmt.mark()
            admissions = self._admissions(job, len(attempt.placements))
            cores = self._cores_admission(job, len(attempt.placements))
            cores_over = cores is not None and not cores.admitted
            # Cores over the cpu quota deny the member whichever kind it would take.
            admitted = [] if cores_over else [k for k, a in admissions.items() if a.admitted]
            choice = job.pick(admitted) if admitted else None
            over_quota: Choice | None = None
            if choice is None and len(admitted) < len(admissions):
                # It fits physically on a kind quota denies: with preemption, quota is
                # fixed below by evicting; without, that kind's quota is the reason.
                over_quota = job.pick()
                if preempt:
                    choice = over_quota
            if choice is None and preempt:
                found = self.preemptor.pick_with_victims(job, admissions)
                if found is not None:
                    for alloc, reason in found.victims:
                        stmt.evict(alloc.allocation_id, reason)
                    score = float(job.scores(found.option)[0][found.position])
                    choice = Choice(found.option, found.position, found.node, score, ())
            if choice is None:
                if over_quota is not None:
                    attempt.quota_block = _blocking(admissions[over_quota.option.k], cores)
                elif not admitted:  # the preferred kind's
                    attempt.quota_block = _blocking(admissions[job.options[0].k], cores)
                break
            admission = admissions[choice.option.k]
            borrowed = admission.mode == "borrow" or (cores is not None and cores.mode == "borrow")
            placement = self._place_member(job, stmt, choice, borrowed=borrowed)
            if not admission.admitted and not self.preemptor.release_quota(
                job, stmt, choice.option.k, admission.mode
            ):
                stmt.rollback_to(savepoint)  # the member and its victims
                attempt.quota_block = admission
                break
            if (
                cores_over
                and cores is not None
                and not self.preemptor.release_quota(job, stmt, CPU_COLUMN, cores.mode)
            ):
                stmt.rollback_to(savepoint)
                attempt.quota_block = cores
                break
            job.record_member(choice.node)
            attempt.placements.append(placement)
            if anchor is not None and len(attempt.placements) == 1:
                domain = self._domain_of(anchor, placement)
                if domain >= 0:
                    job.keep_within(anchor.nodes_in(domain))
        if attempt.quota_block is not None:
            attempt.quota_block = self._as_asked(job, attempt, attempt.quota_block)
        return attempt

    @staticmethod
    def _as_asked(job: JobContext, attempt: _Attempt, block: Admission) -> Admission:
        """The blocking admission as a person should read it: what the tenant (and its
        cohort) holds apart from this work's members placed earlier in the attempt
        (undone unless it commits), against all the work asks for."""
        quota = block.quota
        if quota is None:
            return block
        shape = job.shape
        if quota.kind == "cpu" and shape.cpu_cores:  # the cores beside its devices
            per_member, own = shape.cpu_cores, sum(p.cpu_cores for p in attempt.placements)
        elif quota.kind not in KINDS:  # a slice quota: every member is slices of it
            per_member, own = shape.accelerators, sum(p.accelerators for p in attempt.placements)
        else:
            per_member = shape.accelerators
            own = sum(
                p.accelerators for p in attempt.placements if p.accelerator_kind == quota.kind
            )
        asked = dataclasses.replace(
            quota,
            usage=quota.usage - own,
            cohort_usage=quota.cohort_usage - own,
            requested=shape.members * per_member,
        )
        return dataclasses.replace(block, quota=asked)

    def _place_member(
        self, job: JobContext, stmt: Statement, choice: Choice, *, borrowed: bool
    ) -> Placement:
        state = self.state
        shape = job.shape
        work = shape.work
        option = choice.option
        chosen, *runners = job.breakdowns(choice)
        member, allocation_id = job.next_member_id()
        expected_end = (
            state.now + option.runtime_s.item(choice.position)
            if shape.duration_s is not None
            else None
        )
        provider = None
        if isinstance(work, InferenceDeployment) and work.providers:
            rank = option.cand.static.provider_rank.item(choice.position)
            provider = work.providers[rank] if rank < len(work.providers) else None
        waived = option.cand.static.window_waived
        window = work.start_window if isinstance(work, TrainingJob) else None
        checkpointing, deadline_bound = rescue_marks(work)
        placement = Placement(
            work_id=work.work_id,
            work_kind=shape.work_kind,
            member=member,
            allocation_id=allocation_id,
            node_id=state.snapshot.nodes.node_ids[choice.node],
            accelerator_kind=state.snapshot.nodes.kinds[option.k].kind,
            accelerator_model=state.snapshot.nodes.model_at(option.k, choice.node),
            accelerators=shape.accelerators,
            host_memory_bytes=shape.host_memory_bytes,
            cpu_cores=shape.cpu_cores,
            provider=provider,
            tenant=work.tenant,
            priority=work.priority,
            preemptible=work.preemptible,
            borrowed=borrowed,
            start_at=state.now,
            expected_end=expected_end,
            chosen=chosen,
            runners_up=tuple(runners),
            group=work.group,
            anti_affinity_groups=work.anti_affinity_groups,
            window_waived=waived is not None and bool(waived[choice.position]),
            start_window=str(window) if window is not None else None,
            declared_shape=work.declared_shape if isinstance(work, TrainingJob) else None,
            checkpointing=checkpointing,
            deadline_bound=deadline_bound,
            min_available=work.min_available if isinstance(work, InferenceDeployment) else 0,
        )
        stmt.allocate(placement, choice.node)
        return placement

    def _commit(self, job: JobContext, attempt: _Attempt) -> None:
        attempt.stmt.commit()
        work = job.shape.work
        self._placements.extend(attempt.placements)
        self.arrays.note_placed(work.work_id)
        if self.policy.start_advisor is not None:
            nodes = self.state.snapshot.nodes
            self._bookings.extend(
                Booking(
                    zone=nodes.zones[nodes.zone_code[nodes.index[p.node_id]]],
                    accelerator_kind=p.accelerator_kind,
                    accelerators=p.accelerators,
                    start_s=p.start_at,
                    end_s=math.inf if p.expected_end is None else p.expected_end,
                    node_id=p.node_id,
                )
                for p in attempt.placements
            )
        touched = {work.tenant}
        node_ids = self.state.snapshot.nodes.node_ids
        for eviction in attempt.stmt.evicted:
            victim = eviction.allocation
            touched.add(victim.tenant)
            self._preemptions.append(
                Preemption(
                    allocation_id=victim.allocation_id,
                    work_id=victim.work_id,
                    node_id=node_ids[eviction.node],
                    tenant=victim.tenant,
                    priority=victim.priority,
                    reason=eviction.reason,
                    preempted_by=work.work_id,
                )
            )
        self.queue.shares_changed(touched)

    # -- deadline rescue ------------------------------------------------------------

    def _rescued(self, job: JobContext) -> bool:
        """A deadline rescue (``Policy.deadline_preemption``, preemption.py): a training
        job with a deadline or a maximum delay that capacity freeing in time would not
        let start by its latest start evicts checkpointing work without a deadline of
        its own, when that places it whole and every member ends by the deadline.
        Whether it placed the job (committed); otherwise nothing changed."""
        work = job.shape.work
        if (
            not self.policy.deadline_preemption
            or not isinstance(work, TrainingJob)
            or not work.flexible
            or self._rescues >= _RESCUES_PER_PASS
            or not self._rescue_due(work, _fastest_run_s(job))
            or not self._misses_latest_start(job, work)
        ):
            return False
        self._rescues += 1
        preemptor = self.preemptor
        preemptor.deadline_rescue, preemptor.other_reasons = True, self.policy.preemption
        try:
            if not preemptor.can_help(job, self._admissions(job)):
                return False
            attempt = self._settled(job, preempt=True)
        finally:
            preemptor.deadline_rescue, preemptor.other_reasons = False, True
        placements = attempt.placements
        deadline = math.inf if work.deadline is None else work.deadline
        if len(placements) == job.shape.members and all(
            p.expected_end is not None and p.expected_end <= deadline for p in placements
        ):
            self._commit(job, attempt)
            return True
        attempt.stmt.discard()
        job.reset()
        return False

    def _rescue_due(self, work: TrainingJob, fastest_run_s: float) -> bool:
        """Whether now is the time to rescue: not too late on its fastest node (evicting
        cannot help then, and a hopeless job must not use up the pass's rescues), and
        within ``Policy.deadline_guard_s`` of that latest start where a guard is set
        (until then capacity may yet free sooner than the running work's estimates)."""
        latest = work.latest_start(fastest_run_s)
        guard_s = self.policy.deadline_guard_s
        now = self.state.now
        return now <= latest and (guard_s is None or now >= latest - guard_s)

    def _misses_latest_start(self, job: JobContext, work: TrainingJob) -> bool:
        """Whether no option's earliest slot (backfill.py: capacity freeing as running
        work ends, reservations kept) starts within the job's maximum delay and ends its
        run by its deadline."""
        shape = job.shape
        deadline = math.inf if work.deadline is None else work.deadline
        for option in job.options:
            if not may_free_up(self.state, shape, option.cand):
                continue
            slot = earliest_slot(self.state, shape, option.cand, option.runtime_s, shape.members)
            if slot is None:
                continue
            if slot.start_at > work.latest_start(0.0) or max(slot.ends) > deadline:
                continue
            return False
        return True

    # -- explaining and reserving -------------------------------------------------

    def _pend(
        self,
        job: JobContext,
        quota_block: Admission | None,
        members_fit: int,
        preemption: PreemptionOutcome,
        *,
        placed: bool = False,
        deferral: Deferral | None = None,
        never: NeverFits | None = None,
    ) -> None:
        shape = job.shape
        work = shape.work
        state = self.state
        statics = [c.static for c in job.candidates]
        static_codes = self.cache.static_codes(shape, job.candidates)
        options = [(o.cand.static, o.runtime_s) for o in job.options]
        if any(static.nodes.size for static, _ in options):
            codes = node_codes(state, shape, static_codes, options)
            counts = count_rejections(codes)
            fitting = int(np.count_nonzero(codes == PASS))
        else:
            counts, fitting = self.cache.static_verdict(static_codes)
        total = state.snapshot.node_count
        summary = explain.summarise(counts, total, fitting, shape)
        missing = shape.members - (members_fit if placed else 0)
        quota = quota_block.quota if quota_block is not None else None
        reservation: Reservation | None = None
        retry_at: float | None = None
        code: PendingCode
        if deferral is not None:
            code, message = "deferred", explain.deferred(deferral, summary)
            retry_at = deferral.start_at
        elif placed:
            message = explain.partial(shape, members_fit, summary, quota, preemption)
            code = "partial"
        elif never is not None:
            code, message = "unschedulable", explain.unschedulable(counts, summary, never)
        elif not job.has_candidates:
            opens = [s.window_opens_at for s in statics if s.window_opens_at is not None]
            if opens:
                retry_at = min(opens)
                code, message = "window", explain.window(shape, retry_at, summary)
            elif cordoned := cordoned_blockers(state.snapshot.nodes, shape, static_codes):
                code, message = "cordoned", waiting_for_cordoned(cordoned, summary)
            else:
                code, message = "unschedulable", explain.unschedulable(counts, summary)
        elif quota_block is not None:
            code, message = "quota", explain.quota(quota, summary, preemption)
        else:
            reservation = self._reserve(job, missing)
            if counts.get("reserved", 0) >= missing:
                code, message = "reserved", explain.reserved(summary, reservation)
            else:
                code = "capacity"
                message = explain.capacity(
                    shape, summary, fitting, members_fit, reservation, preemption
                )
            # A gang kept off a mixed placement or to one domain says so first.
            note = self._notes.pop(work.work_id, None) or topology_note(job)
            if note is not None:
                message = f"{note}; {message}"
        self._pending.append(
            Pending(
                work_id=work.work_id,
                tenant=work.tenant,
                priority=work.priority,
                code=code,
                message=message,
                nodes_total=total,
                rejections=MappingProxyType({str(name): count for name, count in counts.items()}),
                fitting_nodes=fitting,
                members_needed=missing,
                members_placed=members_fit if placed else 0,
                quota=quota,
                reservation=reservation,
                retry_at=retry_at,
                deferral=deferral,
                never_fits=never,
            )
        )

    def _pend_hook_failure(self, shape: WorkShape, failure: HookFailure) -> None:
        # The filters did not finish, so there are no rejection counts to show.
        work = shape.work
        self._pending.append(
            Pending(
                work_id=work.work_id,
                tenant=work.tenant,
                priority=work.priority,
                code="hook-failed",
                message=explain.hook_failed(failure),
                nodes_total=self.state.snapshot.node_count,
                rejections=MappingProxyType({}),
                fitting_nodes=0,
                members_needed=shape.members,
                members_placed=0,
                hook_failure=failure,
            )
        )

    def _over_running_limit(self, work: Work) -> bool:
        """Work not yet placed of a tenant already running as many work items as its
        running limit allows waits (code ``quota``); nothing is evicted to make room."""
        limit = self.snapshot.running_limits.get(work.tenant)
        if limit is None:
            return False
        state = self.state
        running = state.running_work(work.tenant)
        if running < limit or state.holds(work.tenant, work.work_id):
            return False
        self._wait_for_quota(work, explain.running_limit(work.tenant, running, limit))
        return True

    def _over_array_throttle(self, work: Work) -> bool:
        """A task of a job array that this pass already placed as many tasks of as its
        throttle allows waits (code ``quota``, array_cap.py); nothing is evicted for it.
        Its siblings that could not be placed took no slot."""
        cap = self.arrays.full(work.work_id)
        if cap is None:
            return False
        self._wait_for_quota(
            work, explain.array_throttle(cap.array_id, cap.throttle, self.arrays.placed(cap))
        )
        return True

    def _wait_for_quota(self, work: Work, message: str) -> None:
        """`work` waits this pass for a limit of its tenant or array (code ``quota``),
        before any node was looked at."""
        self._pending.append(
            Pending(
                work_id=work.work_id,
                tenant=work.tenant,
                priority=work.priority,
                code="quota",
                message=message,
                nodes_total=self.state.snapshot.node_count,
                rejections=MappingProxyType({}),
                fitting_nodes=0,
                members_needed=make_shape(work, self.policy).members,
                members_placed=0,
            )
        )

    def _reserve(self, job: JobContext, members: int) -> Reservation | None:
        # The first blocked jobs in queue order reserve. Jobs whose capacity never frees
        # (held by long-running inference) find no slot; a few of them may not stop
        # the search, a long run of them may not cost every later decision a sweep.
        limit = self.policy.max_reservations
        if (
            not self.policy.backfill
            or len(self._reservations) >= limit
            or self._reservation_attempts >= _ATTEMPTS_PER_RESERVATION * limit
        ):
            return None
        best: tuple[Slot, Option] | None = None
        options = [o for o in job.options if may_free_up(self.state, job.shape, o.cand)]
        if options:
            self._reservation_attempts += 1
        for option in options:
            slot = earliest_slot(self.state, job.shape, option.cand, option.runtime_s, members)
            if slot is not None and (best is None or slot.start_at < best[0].start_at):
                best = (slot, option)
        if best is None:
            return None
        slot, option = best
        reserve(self.state, option.k, slot)
        node_ids = self.state.snapshot.nodes.node_ids
        reservation = Reservation(
            work_id=job.shape.work.work_id,
            start_at=slot.start_at,
            accelerator_kind=KINDS[self.state.column_kinds[option.k]],
            nodes=tuple(node_ids[n] for n in slot.nodes),
            accelerators=slot.amounts,
            host_memory_bytes=slot.host_memory_bytes if job.shape.host_memory_bytes else (),
            cpu_cores=slot.cpu_cores if job.shape.cpu_cores else (),
        )
        self._reservations.append(reservation)
        return reservation


def _fastest_run_s(job: JobContext) -> float:
    """The job's run time on its fastest candidate node (inf with none)."""
    runs = [float(option.runtime_s.min()) for option in job.options if option.runtime_s.size]
    return min(runs, default=math.inf)


def _members_needed(shape: WorkShape, placed: int) -> int:
    """The members, the next one included, without which the work cannot be placed: a
    gang's every worker, a deployment's replicas up to its ``min_replicas`` (those
    beyond are admitted one by one). Quota judges reclaim on them all (quota.py)."""
    return max(1, shape.min_members - placed)


def _mean_score(attempt: _Attempt) -> float:
    return sum(p.chosen.total for p in attempt.placements) / len(attempt.placements)


def _blocking(accelerators: Admission, cores: Admission | None) -> Admission:
    """What stops a member: its accelerators' quota, or else its cores' (``cpu``) one."""
    if cores is None or not accelerators.admitted:
        return accelerators
    return cores


def schedule(
    snapshot: Snapshot, policy: Policy = DEFAULT_POLICY, *, max_decisions: int | None = None
) -> Plan:
    """Decide placements, preemptions, reservations and reasons for the whole queue, or
    (`max_decisions`) for the head of it in queue order: what a quick pass needs when
    capacity freed, at a cost bounded whatever the length of the queue; the rest is
    `Plan.undecided`."""
    return Scheduler(snapshot, policy).run(max_decisions)
