"""Which running work to evict so that a pending job fits.

Who may be evicted for a job J:

* preemptible work of strictly lower priority than J (reason ``priority``);
* preemptible work of *borrowers* (cohort tenants above their nominal quota) when
  J is within its own nominal quota: the owner reclaims what it lent, whatever
  the borrowers' priority (reason ``reclaim``);
* to bring J's tenant back within its quota: the tenant's own lower-priority
  work (reason ``quota``).

Training never evicts p0 inference, and nothing placed in this pass is evicted.
Victims are taken in order (borrowers first, then lowest priority, then latest
started) until the member fits; a reprieve pass then gives back every victim that
turned out unnecessary, most valuable first, so the set is minimal. Among nodes,
the one with the fewest victims (whole gangs count once), then the least
important victims, then the fewest evicted accelerators wins. Evicting one worker
of a training gang evicts the whole gang.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .arrays import IntArray
from .gang import JobContext, Option
from .model import KIND_INDEX, PRIORITY_LEVELS, PRIORITY_RANK, Held
from .plan import PreemptionReason
from .quota import Admission, AdmissionMode, QuotaBook
from .state import ClusterState
from .statement import Statement

# Nodes examined exactly per member (the ones that need the fewest accelerators freed).
_NODES_EXAMINED = 16

Victim = tuple[Held, PreemptionReason]


@dataclass(frozen=True, slots=True)
class VictimSet:
    option: Option
    position: int
    node: int
    victims: tuple[Victim, ...]  # gang siblings included
    cost: tuple[int, int, int, int]


class Preemptor:
    def __init__(self, state: ClusterState, quota: QuotaBook) -> None:
        self.state = state
        self.quota = quota

    def victim_key(self, alloc: Held) -> tuple[int, int, float, str]:
        k = _kind_index(alloc)
        borrower = self.quota.is_borrowing(self.state, alloc.tenant, k)
        return (
            0 if borrower else 1,
            -PRIORITY_RANK[alloc.priority],
            -alloc.started_at,
            alloc.allocation_id,
        )

    def _protected(self, job: JobContext, alloc: Held) -> bool:
        return (
            not alloc.preemptible
            or alloc.allocation_id in self.state.new_ids
            or (
                job.shape.work_kind == "training"
                and alloc.work_kind == "inference"
                and alloc.priority == "p0"
            )
        )

    def _borrowers(self, job: JobContext, k: int, admission: Admission) -> set[str]:
        """Tenants J may reclaim from: borrowing in J's cohort, J within nominal."""
        tenant = job.shape.work.tenant
        cohort = self.state.cohort_of.get(tenant)
        if cohort is None or admission.mode not in ("nominal", "reclaim"):
            return set()
        return {
            other
            for other, its_cohort in self.state.cohort_of.items()
            if its_cohort == cohort
            and other != tenant
            and self.quota.is_borrowing(self.state, other, k)
        }

    def can_help(self, job: JobContext, admissions: dict[int, Admission]) -> bool:
        """Cheap test: is there anything at all this job could evict?"""
        rank = job.shape.rank
        for option in job.options:
            k = option.k
            if any(
                self.state.evictable_total[k][level] for level in range(rank + 1, PRIORITY_LEVELS)
            ):
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
        need = shape.accelerators
        free = state.free[k][nodes]
        releasable = free.copy()
        if shape.rank + 1 < PRIORITY_LEVELS:
            releasable += state.evictable[k][shape.rank + 1 :][:, nodes].sum(axis=0)
        borrowers = self._borrowers(job, k, admission)
        if borrowers:
            releasable += self._reclaimable(job, k, borrowers)[nodes]
        positions = np.flatnonzero((releasable >= need) & (free < need))
        if positions.size == 0:
            return None
        deficit = need - free[positions]
        order = np.lexsort((positions, deficit))[:_NODES_EXAMINED]
        valid = job.validator(option)
        eligible = self._eligible(job, borrowers)
        best: VictimSet | None = None
        for position in positions[order].tolist():
            found = self._on_node(job, option, position, valid, eligible)
            if found is not None and (best is None or found.cost < best.cost):
                best = found
        return best

    def _reclaimable(self, job: JobContext, k: int, borrowers: set[str]) -> IntArray:
        """Per node: borrowers' evictable accelerators not already counted as lower priority."""
        extra = np.zeros(self.state.snapshot.node_count, dtype=np.int64)
        training = job.shape.work_kind == "training"
        for tenant in sorted(borrowers):
            for rank in range(job.shape.rank + 1):
                for inference in (False, True):
                    if training and inference and rank == 0:
                        continue  # training never evicts p0 inference
                    held = self.state.evictable_by_tenant.get((tenant, k, rank, inference))
                    if held:
                        where = np.fromiter(held.keys(), dtype=np.int64, count=len(held))
                        extra[where] += np.fromiter(held.values(), dtype=np.int64, count=len(held))
        return extra

    def _eligible(
        self, job: JobContext, borrowers: set[str]
    ) -> Callable[[Held], PreemptionReason | None]:
        rank = job.shape.rank

        def eligible(alloc: Held) -> PreemptionReason | None:
            if self._protected(job, alloc):
                return None
            if alloc.tenant in borrowers:
                return "reclaim"
            if PRIORITY_RANK[alloc.priority] > rank:
                return "priority"
            return None

        return eligible

    def _on_node(
        self,
        job: JobContext,
        option: Option,
        position: int,
        valid: Callable[[int], bool] | None,
        eligible: Callable[[Held], PreemptionReason | None],
    ) -> VictimSet | None:
        state = self.state
        shape = job.shape
        k = option.k
        node = option.cand.nodes_list[position]
        if (
            shape.max_per_node is not None
            and state.members_on(shape.work.work_id, node) >= shape.max_per_node
        ):
            return None
        work = shape.work
        if state.anti_affinity_conflict(node, work.group, work.anti_affinity_groups):
            return None
        need, host_need = shape.accelerators, shape.host_memory_bytes
        free, host_free = int(state.free[k][node]), int(state.host_free[node])
        pool = []
        for alloc in state.node_allocs.get(node, {}).values():
            if _kind_index(alloc) != k:
                continue
            reason = eligible(alloc)
            if reason is not None:
                pool.append((self.victim_key(alloc), alloc, reason))
        pool.sort(key=lambda entry: entry[0])
        chosen: list[tuple[Held, PreemptionReason]] = []
        freed = host_freed = 0
        for _, alloc, reason in pool:
            if free + freed >= need and host_free + host_freed >= host_need:
                break
            chosen.append((alloc, reason))
            freed += alloc.accelerators
            host_freed += alloc.host_memory_bytes
        if free + freed < need or host_free + host_freed < host_need:
            return None
        for entry in reversed(list(chosen)):  # reprieve, most valuable first
            alloc = entry[0]
            if (
                free + freed - alloc.accelerators >= need
                and host_free + host_freed - alloc.host_memory_bytes >= host_need
            ):
                chosen.remove(entry)
                freed -= alloc.accelerators
                host_freed -= alloc.host_memory_bytes
        if state.has_reservations:
            start = float(state.res_start[k][node])
            if state.now + option.runtime_s.item(position) > start:
                gain = sum(
                    a.accelerators
                    for a, _ in chosen
                    if a.expected_end is None or a.expected_end > start
                )
                if int(state.res_slack[k][node]) + gain < need:
                    return None
        victims: dict[str, Victim] = {}
        for alloc, reason in chosen:
            for sibling in state.siblings(alloc):
                victims.setdefault(sibling.allocation_id, (sibling, reason))
        units = len({a.work_id for a, _ in victims.values()})
        least_rank = min(PRIORITY_RANK[a.priority] for a, _ in victims.values())
        cost = (units, -least_rank, sum(a.accelerators for a, _ in victims.values()), node)
        return VictimSet(option, position, node, tuple(victims.values()), cost)

    def _allocations_of(self, tenants: set[str]) -> list[Held]:
        found = self.state.tenant_allocs
        return [a for tenant in sorted(tenants) for a in found.get(tenant, {}).values()]

    def release_quota(self, job: JobContext, stmt: Statement, k: int, mode: AdmissionMode) -> bool:
        """After a tentative placement under ``reclaim`` or ``denied``: evict borrowers
        (reclaim) or the tenant's own lower-priority work (denied) until quota holds."""
        state = self.state
        tenant = job.shape.work.tenant
        if self.quota.violation(state, tenant, k, mode) <= 0:
            return True
        if mode == "reclaim":
            borrowers = self._borrowers(job, k, Admission("reclaim", 0, None))
            pool = [
                a
                for a in self._allocations_of(borrowers)
                if _kind_index(a) == k and not self._protected(job, a)
            ]
            reason: PreemptionReason = "reclaim"
        else:
            pool = [
                a
                for a in self._allocations_of({tenant})
                if _kind_index(a) == k
                and PRIORITY_RANK[a.priority] > job.shape.rank
                and not self._protected(job, a)
            ]
            reason = "quota"
        pool.sort(key=self.victim_key)
        for alloc in pool:
            if self.quota.violation(state, tenant, k, mode) <= 0:
                break
            if alloc.allocation_id not in state.allocations:
                continue  # already gone with its gang
            if mode == "reclaim" and not self.quota.is_borrowing(state, alloc.tenant, k):
                continue
            for sibling in state.siblings(alloc):
                stmt.evict(sibling.allocation_id, reason)
        return self.quota.violation(state, tenant, k, mode) <= 0


def _kind_index(alloc: Held) -> int:
    return KIND_INDEX[alloc.accelerator_kind]
