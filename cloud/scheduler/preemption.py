"""Which running work to evict so that a pending job fits.

Who may be evicted for a job J:

* preemptible work of strictly lower priority than J (reason ``priority``);
* preemptible work of *borrowers* (cohort tenants above their nominal quota with
  the work they held when the pass started, quota.py) when J is within its own
  nominal quota: the owner reclaims what it lent, whatever the borrowers' priority
  (reason ``reclaim``);
* to bring J's tenant back within its quota: the tenant's own lower-priority
  work (reason ``quota``).
* in a *deadline rescue* (``Policy.deadline_preemption``; core.py starts one when
  no capacity freeing in time would let J start before its latest start): running
  training of J's priority or lower that saves checkpoints and has no deadline or
  maximum delay of its own (reason ``deadline``). It loses at most a checkpoint
  interval's work and waits again; J would otherwise miss its deadline.

Training never evicts p0 inference, and nothing placed in this pass is evicted.
What is short may be accelerators of J's kind, host memory, the CPU cores a GPU job
asks for beside its accelerators, or several; host memory and cores can also be freed
by evicting lower-priority work of another kind on the node. The CPU pool is one pool:
a CPU job or deployment is made room for by evicting CPU work and GPU/NPU work that
holds cores beside its devices alike. Reclaiming a borrower's
work frees its accelerators, host memory and cores alike. A reservation keeps its
accelerators, host memory and cores from victims' replacements.
Victims are taken in order (lowest priority, then latest started; when J
reclaims, the borrowers' work first) until the member fits. As in Kueue, a borrower's
work is reclaimed only while the borrower, less the victims chosen before, still
borrows: down to its nominal quota (a last victim larger than what is left above it
aside), the rest of its work going only for a reason of its own (a lower priority), so
a member that needs more waits or takes another node. A reprieve pass then
gives back every victim that turned out unnecessary, most valuable first, so the
set is minimal. Among nodes, the one with the fewest victims (whole gangs count
once), then the least important victims, then the fewest evicted accelerators
wins. Evicting one worker of a training gang evicts the whole gang. A deployment
never loses replicas below its `min_available` (disruption_budget.py).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .arrays import IntArray
from .disruption_budget import DisruptionBudget
from .filters import placement_conflicts
from .gang import JobContext, Option
from .model import PRIORITY_LEVELS, PRIORITY_RANK, Held
from .plan import PreemptionReason
from .quota import Admission, AdmissionMode, QuotaBook, charge
from .snapshot import CPU_COLUMN
from .state import ClusterState
from .statement import Statement

# Victim sets compared per member: those on the nodes that need the least freed
# among the nodes where evicting can make room at all.
_VICTIM_SETS_COMPARED = 16

Victim = tuple[Held, PreemptionReason]
# A victim being considered, and whether evicting it frees some of the job's pool column
# (``Preemptor._frees``; otherwise it is only evicted for its host memory or cores).
_Candidate = tuple[Held, PreemptionReason, bool]


@dataclass(frozen=True, slots=True)
class VictimSet:
    option: Option
    position: int
    node: int
    victims: tuple[Victim, ...]  # gang siblings included
    cost: tuple[int, int, int, int]


def victim_key(alloc: Held, reason: PreemptionReason) -> tuple[int, int, float, str]:
    """Eviction order: when reclaiming, the borrowers' work first; then the lowest
    priority, then the latest started."""
    return (
        0 if reason == "reclaim" else 1,
        -PRIORITY_RANK[alloc.priority],
        -alloc.started_at,
        alloc.allocation_id,
    )


class Preemptor:
    def __init__(self, state: ClusterState, quota: QuotaBook) -> None:
        self.state = state
        self.quota = quota
        self.budget = DisruptionBudget(state)
        # Set by the core around a deadline rescue's attempt (module docstring); with
        # `other_reasons` off only the rescue's own victims are eligible.
        self.deadline_rescue = False
        self.other_reasons = True
        # Per (tenant, pool column): its largest allocation when the pass started, the
        # most one victim of it frees (``_reclaim_cap``); built on first use.
        self._largest: dict[tuple[str, int], int] | None = None

    def _protected(self, job: JobContext, alloc: Held) -> bool:
        return (
            not alloc.preemptible
            or alloc.allocation_id in self.state.new_ids
            or not self.budget.allows(alloc)
            or (
                job.shape.work_kind == "training"
                and alloc.work_kind == "inference"
                and alloc.priority == "p0"
            )
        )

    def _borrowers(self, job: JobContext, k: int, admission: Admission) -> set[str]:
        """Tenants J may reclaim from: borrowing in J's cohort (or, in a cohort tree,
        under what lends to J's side) with the work they held before the pass, J within
        nominal."""
        if not admission.may_reclaim:
            return set()
        return self.quota.reclaimable(self.state, job.shape.work.tenant, k)

    def can_help(self, job: JobContext, admissions: dict[int, Admission]) -> bool:
        """Cheap test: is there anything at all this job could evict?"""
        state = self.state
        lower = range(self._first_evictable_rank(job), PRIORITY_LEVELS)
        if job.shape.host_memory_bytes and any(
            state.evictable_host_memory_total_bytes[level] for level in lower
        ):
            return True
        if job.shape.cpu_cores and any(
            state.evictable_cpu_cores_total[level]
            or state.evictable_accelerators_total[CPU_COLUMN][level]
            for level in lower
        ):
            return True
        for option in job.options:
            k = option.k
            if any(state.evictable_accelerators_total[k][level] for level in lower):
                return True
            # A CPU member's cores: also those GPU/NPU work holds beside its devices.
            if k == CPU_COLUMN and any(state.evictable_cpu_cores_total[level] for level in lower):
                return True
            if self._borrowers(job, k, admissions[k]):
                return True
        return False

    def pick_with_victims(
        self, job: JobContext, admissions: dict[int, Admission]
    ) -> VictimSet | None:
        best: VictimSet | None = None
        for option in job.options:
            found = self._best_on_option(job, option, admissions[option.k])
            if found is not None and (best is None or found.cost < best.cost):
                best = found
        return best

    def _best_on_option(
        self, job: JobContext, option: Option, admission: Admission
    ) -> VictimSet | None:
        state = self.state
        shape = job.shape
        k = option.k
        nodes = option.cand.nodes
        need, host_need = shape.accelerators, shape.host_memory_bytes
        lower = self._first_evictable_rank(job)
        free = state.free[k][nodes]
        releasable = free.copy()
        if lower < PRIORITY_LEVELS:
            releasable += state.evictable_accelerators[k][lower:][:, nodes].sum(axis=0)
            if k == CPU_COLUMN:  # the cores GPU/NPU work holds beside its devices
                releasable += state.evictable_cpu_cores[lower:][:, nodes].sum(axis=0)
        borrowers = self._borrowers(job, k, admission)
        reclaimable = self._reclaimable(job, k, borrowers) if borrowers else None
        if reclaimable is not None:
            releasable += reclaimable[0][nodes]
        short = free < need
        enough = releasable >= need
        host_deficit: IntArray | None = None
        if host_need:
            host_free = state.host_free[nodes]
            host_releasable = host_free.copy()
            if lower < PRIORITY_LEVELS:
                host_releasable += state.evictable_host_memory_bytes[lower:][:, nodes].sum(axis=0)
            if reclaimable is not None:
                host_releasable += reclaimable[1][nodes]
            short |= host_free < host_need
            enough &= host_releasable >= host_need
            host_deficit = np.maximum(host_need - host_free, 0)
        if shape.cpu_cores:
            # Cores of the node's CPU pool: held by CPU work and beside other members.
            cpu_free = state.free[CPU_COLUMN][nodes]
            cpu_releasable = cpu_free.copy()
            if lower < PRIORITY_LEVELS:
                cpu_releasable += state.evictable_cpu_cores[lower:][:, nodes].sum(axis=0)
                cpu_releasable += state.evictable_accelerators[CPU_COLUMN][lower:][:, nodes].sum(
                    axis=0
                )
            if reclaimable is not None:
                cpu_releasable += reclaimable[2][nodes]
            short |= cpu_free < shape.cpu_cores
            enough &= cpu_releasable >= shape.cpu_cores
        usable = short & enough
        # Nodes no eviction makes usable (anti-affinity, replica limit) are dropped
        # before any is examined, so they cannot crowd out the ones that work.
        conflicts = placement_conflicts(state, shape, nodes)
        if conflicts is not None:
            usable &= ~conflicts
        # The speed class and topology domain the gang keeps to (core.py) bind victims too.
        allowed = job.allowed(option)
        if allowed is not None:
            usable &= allowed
        positions = np.flatnonzero(usable)
        if positions.size == 0:
            return None
        deficit = np.maximum(need - free[positions], 0)
        if host_deficit is None:
            order = np.lexsort((positions, deficit))
        else:
            order = np.lexsort((positions, host_deficit[positions], deficit))
        eligible = self._eligible(job, k, borrowers)
        # A borrower at its nominal quota keeps the rest of its work but for a reason of
        # the work's own (a lower priority): ``_on_node`` asks this then.
        unreclaimed = self._eligible(job, k, set()) if borrowers else eligible
        best: VictimSet | None = None
        compared = 0
        # Walk on past nodes where no victim set works (reservations), until enough
        # sets have been compared.
        for position in positions[order].tolist():
            found = self._on_node(job, option, position, eligible, unreclaimed)
            if found is None:
                continue
            if best is None or found.cost < best.cost:
                best = found
            compared += 1
            if compared >= _VICTIM_SETS_COMPARED:
                break
        return best

    def _reclaimable(
        self, job: JobContext, k: int, borrowers: set[str]
    ) -> tuple[IntArray, IntArray, IntArray]:
        """Per node: borrowers' evictable accelerators of kind ``k``, and their host
        memory and CPU cores beside them, not already counted as lower priority. A
        borrower's accelerators count up to what one member could reclaim of them on a
        node (``_reclaim_cap``), so nodes where it would have to go below its nominal
        quota are not searched."""
        n = self.state.snapshot.node_count
        accelerators = np.zeros(n, dtype=np.int64)
        host = np.zeros(n, dtype=np.int64)
        cores = np.zeros(n, dtype=np.int64)
        training = job.shape.work_kind == "training"
        by_tenant = self.state.evictable_by_tenant
        host_by_tenant = self.state.evictable_host_by_tenant
        cores_by_tenant = self.state.evictable_cores_by_tenant
        for tenant in sorted(borrowers):
            cap = self._reclaim_cap(job, k, tenant)
            own = accelerators if cap is None else np.zeros(n, dtype=np.int64)
            for rank in range(job.shape.rank + 1):
                for inference in (False, True):
                    if training and inference and rank == 0:
                        continue  # training never evicts p0 inference
                    key = (tenant, k, rank, inference)
                    found = (
                        (by_tenant.get(key), own),
                        (host_by_tenant.get(key), host),
                        (cores_by_tenant.get(key), cores),
                    )
                    for held, total in found:
                        if held:
                            where = np.fromiter(held.keys(), dtype=np.int64, count=len(held))
                            total[where] += np.fromiter(
                                held.values(), dtype=np.int64, count=len(held)
                            )
            if cap is not None:
                accelerators += np.minimum(own, cap)
        return accelerators, host, cores

    def _reclaim_cap(self, job: JobContext, k: int, tenant: str) -> int | None:
        """At most what one member reclaims of column ``k`` from ``tenant`` on a node:
        while it borrows (``QuotaBook.still_reclaimable``), so its excess over its nominal
        quota less one, plus one last victim, at most its largest allocation. None where
        victims and quota are counted apart (the CPU pool's cores beside devices, slices
        under a slice quota) or, in a tree, a cohort's may not shrink with its members'."""
        state = self.state
        if k == CPU_COLUMN or tenant in state.mig_quota_profiles:
            return None
        excess = self.quota.excess_over_nominal(state, job.shape.work.tenant, k, tenant)
        if excess is None:
            return None
        if self._largest is None:
            self._largest = {}
            index = state.snapshot.nodes.index
            for alloc in state.snapshot.allocations:
                key = (alloc.tenant, state.column_of(alloc, index[alloc.node_id]))
                self._largest[key] = max(self._largest.get(key, 0), alloc.accelerators)
        return max(0, excess - 1 + self._largest.get((tenant, k), 0))

    def _first_evictable_rank(self, job: JobContext) -> int:
        """The highest priority rank whose work the job may evict: lower priorities
        only, or its own too in a deadline rescue (the per-rank totals over-count
        there: which of that rank's work qualifies is `_eligible`'s to say)."""
        return job.shape.rank + (0 if self.deadline_rescue else 1)

    def _eligible(
        self, job: JobContext, k: int, borrowers: set[str]
    ) -> Callable[[Held], PreemptionReason | None]:
        rank = job.shape.rank
        rescue, others = self.deadline_rescue, self.other_reasons

        def eligible(alloc: Held) -> PreemptionReason | None:
            if self._protected(job, alloc):
                return None
            if others and alloc.tenant in borrowers and self._column(alloc) == k:
                return "reclaim"
            if others and PRIORITY_RANK[alloc.priority] > rank:
                return "priority"
            if (
                rescue
                and alloc.work_kind == "training"
                and alloc.checkpointing
                and not alloc.deadline_bound
                and PRIORITY_RANK[alloc.priority] >= rank
            ):
                return "deadline"
            return None

        return eligible

    def _on_node(
        self,
        job: JobContext,
        option: Option,
        position: int,
        eligible: Callable[[Held], PreemptionReason | None],
        unreclaimed: Callable[[Held], PreemptionReason | None],
    ) -> VictimSet | None:
        state = self.state
        shape = job.shape
        k = option.k
        node = option.cand.nodes_list[position]
        need, host_need, cpu_need = shape.accelerators, shape.host_memory_bytes, shape.cpu_cores
        free: int = state.free[k].item(node)
        host_free: int = state.host_free.item(node)
        cpu_free: int = state.free[CPU_COLUMN].item(node) if cpu_need else 0
        pool: list[tuple[tuple[int, int, float, str], _Candidate]] = []
        for alloc in state.node_allocs.get(node, {}).values():
            same_kind = self._frees(alloc, k) > 0
            if (
                not same_kind
                and not (host_need and alloc.host_memory_bytes)
                and not (cpu_need and self._cores(alloc))
            ):
                continue
            reason = eligible(alloc)
            if reason is not None:
                pool.append((victim_key(alloc, reason), (alloc, reason, same_kind)))
        heapq.heapify(pool)  # in victim order; a borrower's work may come back later
        chosen: list[_Candidate] = []
        taken: dict[str, int] = {}  # replicas chosen per deployment (disruption budgets)
        # Per borrower, what its victims chosen so far release of the job's kind (gangs
        # whole): it is reclaimed only down to its nominal quota.
        reclaimed: dict[str, int] = {}
        reclaimed_ids: set[str] = set()
        freed = host_freed = cpu_freed = 0
        while pool:
            _, candidate = heapq.heappop(pool)
            alloc, reason, same_kind = candidate
            short = free + freed < need
            host_short = host_free + host_freed < host_need
            cpu_short = cpu_free + cpu_freed < cpu_need
            if not (short or host_short or cpu_short):
                break
            cores = self._cores(alloc) if cpu_need else 0
            if (
                (short and same_kind)
                or (host_short and alloc.host_memory_bytes)
                or (cpu_short and cores)
            ) and self.budget.allows(alloc, taken):
                if reason == "reclaim":
                    if not self.quota.still_reclaimable(
                        state, job.shape.work.tenant, k, alloc.tenant, reclaimed
                    ):
                        # Down to its nominal quota: the rest goes only for a lower priority.
                        other_reason = unreclaimed(alloc)
                        if other_reason is not None:
                            demoted = (alloc, other_reason, same_kind)
                            heapq.heappush(pool, (victim_key(alloc, other_reason), demoted))
                        continue
                    self._count_reclaimed(alloc, k, reclaimed, reclaimed_ids)
                chosen.append(candidate)
                taken[alloc.work_id] = taken.get(alloc.work_id, 0) + 1
                freed += self._frees(alloc, k)
                host_freed += alloc.host_memory_bytes
                cpu_freed += cores
        if free + freed < need or host_free + host_freed < host_need:
            return None
        if cpu_free + cpu_freed < cpu_need:
            return None
        for candidate in reversed(list(chosen)):  # reprieve, most valuable first
            alloc, _, same_kind = candidate
            accelerators = self._frees(alloc, k)
            cores = self._cores(alloc) if cpu_need else 0
            if (
                free + freed - accelerators >= need
                and host_free + host_freed - alloc.host_memory_bytes >= host_need
                and cpu_free + cpu_freed - cores >= cpu_need
            ):
                chosen.remove(candidate)
                freed -= accelerators
                host_freed -= alloc.host_memory_bytes
                cpu_freed -= cores
        if state.has_reservations and not self._keeps_reservations(
            job, option, position, node, chosen
        ):
            return None
        victims: dict[str, Victim] = {}
        for alloc, reason, _ in chosen:
            for sibling in state.siblings(alloc):
                victims.setdefault(sibling.allocation_id, (sibling, reason))
        units = len({a.work_id for a, _ in victims.values()})
        least_rank = min(PRIORITY_RANK[a.priority] for a, _ in victims.values())
        cost = (units, -least_rank, sum(a.accelerators for a, _ in victims.values()), node)
        return VictimSet(option, position, node, tuple(victims.values()), cost)

    def _count_reclaimed(
        self, alloc: Held, k: int, reclaimed: dict[str, int], counted_ids: set[str]
    ) -> None:
        """Add what reclaiming ``alloc`` releases of column ``k``'s kind to its tenant's
        entry in ``reclaimed``: the whole gang it takes down, each member once."""
        for sibling in self.state.siblings(alloc):
            if sibling.allocation_id not in counted_ids:
                counted_ids.add(sibling.allocation_id)
                reclaimed[alloc.tenant] = reclaimed.get(alloc.tenant, 0) + charge(
                    self.state, sibling, k
                )

    def _keeps_reservations(
        self, job: JobContext, option: Option, position: int, node: int, chosen: list[_Candidate]
    ) -> bool:
        """Would the member, once its victims are gone, still leave every reservation
        on the node its accelerators, host memory and CPU cores?"""
        state = self.state
        shape = job.shape
        end = state.now + option.runtime_s.item(position)
        start: float = state.reservation_start_s[option.k].item(node)
        if end > start:
            gain = sum(
                self._frees(a, option.k)
                for a, _, _ in chosen
                if a.expected_end is None or a.expected_end > start
            )
            slack: int = state.reservation_slack_accelerators[option.k].item(node)
            if slack + gain < shape.accelerators:
                return False
        host_start: float = state.reservation_host_start_s.item(node)
        if shape.host_memory_bytes and end > host_start:
            gain = sum(
                a.host_memory_bytes
                for a, _, _ in chosen
                if a.expected_end is None or a.expected_end > host_start
            )
            host_slack: int = state.reservation_slack_host_memory_bytes.item(node)
            if host_slack + gain < shape.host_memory_bytes:
                return False
        cpu_start: float = state.reservation_start_s[CPU_COLUMN].item(node)
        if shape.cpu_cores and end > cpu_start:
            gain = sum(
                self._cores(a)
                for a, _, _ in chosen
                if a.expected_end is None or a.expected_end > cpu_start
            )
            cpu_slack: int = state.reservation_slack_accelerators[CPU_COLUMN].item(node)
            if cpu_slack + gain < shape.cpu_cores:
                return False
        return True

    def _allocations_of(self, tenants: set[str]) -> list[Held]:
        found = self.state.tenant_allocs
        return [a for tenant in sorted(tenants) for a in found.get(tenant, {}).values()]

    def release_quota(self, job: JobContext, stmt: Statement, k: int, mode: AdmissionMode) -> bool:
        """After a tentative placement under ``reclaim`` or ``denied``: evict borrowers
        (reclaim) or the tenant's own lower-priority work (denied) until quota holds."""
        state = self.state
        tenant = job.shape.work.tenant
        held_before = self._held_before_attempt(stmt, tenant, k)

        def violation() -> int:
            return self.quota.violation(state, tenant, k, mode, held_before_work=held_before)

        if violation() <= 0:
            return True
        reason: PreemptionReason
        if mode == "reclaim":
            borrowers = self._borrowers(job, k, Admission("reclaim", 0, None))
            pool = [
                a
                for a in self._allocations_of(borrowers)
                if self._holds_quota(a, k) and not self._protected(job, a)
            ]
            reason = "reclaim"
        else:
            pool = [
                a
                for a in self._allocations_of({tenant})
                if self._holds_quota(a, k)
                and PRIORITY_RANK[a.priority] > job.shape.rank
                and not self._protected(job, a)
            ]
            reason = "quota"
        pool.sort(key=lambda alloc: victim_key(alloc, reason))
        for alloc in pool:
            if violation() <= 0:
                break
            if alloc.allocation_id not in state.allocations or not self.budget.allows(alloc):
                continue  # already gone with its gang, or its deployment is at its budget
            if mode == "reclaim" and not self.quota.still_reclaimable(
                state, tenant, k, alloc.tenant, {}
            ):
                continue  # down to its nominal quota already
            for sibling in state.siblings(alloc):
                stmt.evict(sibling.allocation_id, reason)
        return violation() <= 0

    def _held_before_attempt(self, stmt: Statement, tenant: str, k: int) -> int:
        """What ``tenant`` held of column ``k``'s kind before the attempt in ``stmt``: its
        usage less the job's members placed in it, plus its own work evicted in it."""
        state = self.state
        placed = sum(charge(state, alloc, k) for alloc, _ in stmt.allocated)
        given_back = sum(
            charge(state, eviction.allocation, k)
            for eviction in stmt.evicted
            if eviction.allocation.tenant == tenant
        )
        return state.usage(tenant, k) - placed + given_back

    def _cores(self, alloc: Held) -> int:
        """CPU cores evicting ``alloc`` gives back: those it holds beside its
        accelerators, or its accelerators when they are the CPU pool's."""
        held = alloc.accelerators if self._column(alloc) == CPU_COLUMN else 0
        return held + alloc.cpu_cores

    def _frees(self, alloc: Held, k: int) -> int:
        """What evicting ``alloc`` frees of pool column ``k``: its accelerators where they
        are that pool's, and, in the CPU pool, the cores it holds beside its devices."""
        freed = alloc.accelerators if self._column(alloc) == k else 0
        return (freed + alloc.cpu_cores) if k == CPU_COLUMN else freed

    def _column(self, alloc: Held) -> int:
        """The pool column ``alloc`` holds: what evicting it frees."""
        return self.state.column_of(alloc, self.state.node_of[alloc.allocation_id])

    def _holds_quota(self, alloc: Held, column: int) -> bool:
        """Evicting ``alloc`` releases quota of ``column``'s kind: it holds accelerators of
        the kind, whichever pool of the kind they are in, or, for the ``cpu`` kind, cores
        beside its devices that its tenant's ``cpu`` quota is charged for."""
        state = self.state
        kinds = state.column_kinds
        if kinds[self._column(alloc)] == kinds[column]:
            return True
        return (
            kinds[column] == kinds[CPU_COLUMN]
            and alloc.cpu_cores > 0
            and alloc.tenant in state.cores_charged
        )
