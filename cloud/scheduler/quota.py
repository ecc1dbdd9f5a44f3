"""Admission against tenant quotas: nominal quota, cohort borrowing, reclaim.

Rules (Kueue-like, per accelerator kind):

* within its nominal quota a tenant is always admitted; if its cohort is
  over-committed because others borrowed, the owner *reclaims*: borrowers'
  work is evicted until the cohort fits its nominal total again, each borrower's only
  down to its nominal quota (``still_reclaimable``). A borrower is above
  its nominal quota with the work it held when the pass started (``is_borrowing``):
  what it placed in this pass is never evicted, so it makes none of its older work
  reclaimable; the owner waits, and the next pass reclaims that work. Reclaim is judged
  on the work as a whole (the members it cannot be placed without), not on one
  member: a gang whose first worker is within nominal but whose whole is not
  borrows, and takes nothing back;
* beyond nominal it may *borrow* idle cohort capacity, up to its borrowing limit
  and only while the cohort as a whole stays within its nominal total;
* otherwise it is denied (the only remedy is to evict its own lower-priority
  work, see preemption.py), and never more of it than the job takes: a tenant that
  holds more than its quota when the pass starts (its quota was lowered) is brought
  back to what it held then, not below; or to what it held before the job, where
  others evicted some of its work in the pass (room so freed is none to grow back
  into). Lowering a quota evicts nothing by itself; only reclaim by the cohort's owners
  may.

Tenants without a ``Tenant`` record are unmanaged and always admitted. Tenants under a
configured cohort tree follow the same rules level by level (hierarchy.py): borrowing,
lending and reclaim at every cohort of their path.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

from .hierarchy import EMPTY_COHORTS, Cohort, CohortTree, UsageOf, tree_of
from .model import KINDS, Held, Tenant
from .state import ClusterState

# "slices": work asking for a MIG profile its tenant has a quota for, admitted by that
# quota (mig_quota.py), which is never borrowed, lent or reclaimed.
AdmissionMode = Literal["unmanaged", "nominal", "borrow", "reclaim", "denied", "slices"]


@dataclass(frozen=True, slots=True)
class QuotaState:
    """A tenant's quota position for one kind, for explanations."""

    mode: AdmissionMode  # "reclaim": within nominal, the cohort lent it out; "denied"
    tenant: str
    kind: str  # an AcceleratorKind, or a MIG slice quota "mig-1g.10gb" (mig_quota.py)
    usage: int
    requested: int
    nominal: int
    borrowing_limit: int | None  # None: may borrow whatever the cohort has idle
    cohort: str | None
    cohort_usage: int
    cohort_nominal: int


@dataclass(frozen=True, slots=True)
class Admission:
    mode: AdmissionMode
    # Accelerators that must be released first: by borrowers (reclaim) or by the
    # tenant's own lower-priority work (denied).
    shortfall: int
    quota: QuotaState | None
    # False where this member is within nominal but the work it belongs to is not:
    # such work borrows as a whole, so it may not take back what the cohort lent.
    work_within_nominal: bool = True

    @property
    def admitted(self) -> bool:
        return self.mode in ("unmanaged", "nominal", "borrow", "slices")

    @property
    def may_reclaim(self) -> bool:
        """Whether borrowers' work may be evicted for this member (reason ``reclaim``)."""
        return self.work_within_nominal and self.mode in ("nominal", "reclaim")


_UNMANAGED: Final = Admission("unmanaged", 0, None)
_NOMINAL: Final = Admission("nominal", 0, None)
# This member is within nominal, the rest of its work is not: admitted where the
# cohort has room, but nothing is reclaimed for it.
_NOMINAL_MEMBER_ONLY: Final = Admission("nominal", 0, None, work_within_nominal=False)
_BORROW: Final = Admission("borrow", 0, None)


class QuotaBook:
    def __init__(
        self,
        tenants: Mapping[str, Tenant],
        start: ClusterState | None = None,
        cohorts: Mapping[str, Cohort] | None = None,
    ) -> None:
        """``start``: the state before anything of this pass, whose usage is what a
        denied tenant's own evictions never have to go below. ``cohorts``: the
        configured cohort tree (hierarchy.py), by default the start's snapshot's;
        empty: flat cohorts only."""
        self.tenants = tenants
        if cohorts is None:
            cohorts = start.snapshot.cohorts if start is not None else EMPTY_COHORTS
        self.tree = tree_of(tenants, cohorts)
        cohort_nominal: dict[str, list[int]] = {}
        for tenant in tenants.values():
            if tenant.cohort is not None:
                totals = cohort_nominal.setdefault(tenant.cohort, [0] * len(KINDS))
                for k, kind in enumerate(KINDS):
                    totals[k] += tenant.nominal.get(kind, 0)
        self.cohort_nominal = cohort_nominal
        # Per tenant, per kind index: plain lists, read on every member placed.
        self._nominal = {
            name: [t.nominal.get(kind, 0) for kind in KINDS] for name, t in tenants.items()
        }
        self._limit = {
            name: [t.borrowing_limit.get(kind) for kind in KINDS] for name, t in tenants.items()
        }
        self._start_usage = (
            {}
            if start is None
            else {name: list(usage) for name, usage in start.tenant_usage.items()}
        )
        self._knows_start = start is not None
        # Per tenant, the allocations it held when the pass started: built on the first
        # reclaim that needs to know which of them were evicted since.
        self._start_allocs: dict[str, list[Held]] | None = None
        # held_before_pass's answers, per (tenant, kind index), for one state version.
        self._held_before: dict[tuple[str, int], int] = {}
        self._held_before_version = -1

    # ``column`` below is a pool column of the snapshot (snapshot.py): quota is per
    # kind, whichever of the kind's pools the accelerators are in.

    @property
    def nominals(self) -> Mapping[str, list[int]]:
        """Tenant -> nominal quota per kind index (KINDS order)."""
        return self._nominal

    def nominal(self, tenant: str, kind_code: int) -> int | None:
        nominal = self._nominal.get(tenant)
        return None if nominal is None else nominal[kind_code]

    def is_borrowing(self, state: ClusterState, tenant: str, column: int) -> bool:
        """Whether ``tenant`` borrows, for reclaim: judged on the work it held when the
        pass started and still holds. What it placed in this pass is never evicted, so
        counting it would let a reclaim fall on the older work within its nominal quota
        (the reclaiming job waits instead, and the next pass reclaims the new work)."""
        kind_code = state.column_kinds[column]
        nominal = self.nominal(tenant, kind_code)
        if nominal is None or state.usage(tenant, column) <= nominal:
            return False  # cheap first: it holds at least what it held before the pass
        if self._knows_start and self._held_at_start(tenant, kind_code) <= nominal:
            return False  # and it held no more when the pass started
        return self.held_before_pass(state, tenant, column) > nominal

    def _held_at_start(self, tenant: str, kind_code: int) -> int:
        held = self._start_usage.get(tenant)
        return held[kind_code] if held is not None else 0

    def held_before_pass(self, state: ClusterState, tenant: str, column: int) -> int:
        """What ``tenant`` holds of column ``column``'s kind of the work that was running
        when the pass started: its usage then, less what was evicted since. Without the
        start state (``start``), everything it holds."""
        if not self._knows_start:
            return state.usage(tenant, column)
        kind_code = state.column_kinds[column]
        held = self._held_at_start(tenant, kind_code)
        if not held or not any(state.evictions_by_kind):
            return held  # nothing was evicted in this pass, not even rolled back
        # A tree asks for every tenant under its root, level by level: the answers hold
        # until the state next changes (``change_log`` grows with every change).
        version = len(state.change_log)
        if version != self._held_before_version:
            self._held_before_version = version
            self._held_before.clear()
        key = (tenant, kind_code)
        found = self._held_before.get(key)
        if found is None:
            found = held - sum(
                state.charge(alloc, kind_code)
                for alloc in self._allocations_at_start(state).get(tenant, ())
                if state.allocations.get(alloc.allocation_id) is not alloc
            )
            self._held_before[key] = found
        return found

    def _allocations_at_start(self, state: ClusterState) -> Mapping[str, list[Held]]:
        if self._start_allocs is None:
            self._start_allocs = {}
            for alloc in state.snapshot.allocations:
                self._start_allocs.setdefault(alloc.tenant, []).append(alloc)
        return self._start_allocs

    def _held_before_pass_of(self, state: ClusterState, column: int) -> UsageOf:
        def of(tenant: str) -> int:
            return self.held_before_pass(state, tenant, column)

        return of

    def in_tree(self, tenant: str) -> bool:
        return self.tree is not None and self.tree.manages(tenant)

    def reclaimable(self, state: ClusterState, tenant: str, column: int) -> set[str]:
        """Tenants whose work ``tenant`` (within its nominal quota) may reclaim: the
        borrowers of its flat cohort, or, in a tree, those under a borrowing node below
        the nearest cohort they share with it."""
        if self.tree is not None and self.tree.manages(tenant):
            # Borrowing is judged on the work held before the pass, as in a flat cohort
            # (``is_borrowing``), at every level of the tree.
            return self.tree.lenders_reclaim_from(
                tenant, state.column_kinds[column], self._held_before_pass_of(state, column)
            )
        cohort = state.cohort_of.get(tenant)
        if cohort is None:
            return set()
        return {
            other
            for other, its_cohort in state.cohort_of.items()
            if its_cohort == cohort and other != tenant and self.is_borrowing(state, other, column)
        }

    def still_reclaimable(
        self,
        state: ClusterState,
        tenant: str,
        column: int,
        other: str,
        given_back: Mapping[str, int],
    ) -> bool:
        """Whether ``tenant`` may reclaim one more allocation of ``other``'s once the
        victims already chosen are gone (``given_back``: per tenant, what they release of
        column ``column``'s kind). As in Kueue, a borrower's work is reclaimed only while
        the borrower, less those victims, still borrows (in a tree: it or a cohort below
        the one it shares with ``tenant``): so down to its nominal quota, which only a
        last victim larger than what is left above it crosses."""

        def held(name: str) -> int:
            return self.held_before_pass(state, name, column) - given_back.get(name, 0)

        if self.tree is not None and self.tree.manages(tenant):
            return self.tree.reclaims_from(tenant, other, state.column_kinds[column], held)
        nominal = self.nominal(other, state.column_kinds[column])
        return (
            nominal is not None
            and other != tenant
            and state.cohort_of.get(other) is not None
            and state.cohort_of.get(other) == state.cohort_of.get(tenant)
            and held(other) > nominal
        )

    def excess_over_nominal(
        self, state: ClusterState, tenant: str, column: int, other: str
    ) -> int | None:
        """How far ``other`` is above its nominal quota of column ``column``'s kind, with
        the work it held before the pass, as ``tenant`` reclaims from it (a flat cohort);
        None in a tree, where what a cohort above it borrows need not shrink with it."""
        if self.tree is not None and self.tree.manages(tenant):
            return None
        nominal = self.nominal(other, state.column_kinds[column])
        if nominal is None:
            return None
        return self.held_before_pass(state, other, column) - nominal

    def admit(
        self,
        state: ClusterState,
        tenant: str,
        column: int,
        amount: int,
        work_amount: int | None = None,
    ) -> Admission:
        """Admission of one member's ``amount``. ``work_amount``: what the work still
        needs before it can be placed, this member's ``amount`` included (by default
        that alone). The tenant reclaims only while it stays within nominal with all of
        it: a gang of 2 × 2 under a nominal 2 borrows, though its first worker fits."""
        nominals = self._nominal.get(tenant)
        if nominals is None:
            return _UNMANAGED
        work_amount = amount if work_amount is None else max(amount, work_amount)
        if self.tree is not None and self.tree.manages(tenant):
            return self._admit_in_tree(self.tree, state, tenant, column, amount, work_amount)
        k = state.column_kinds[column]
        kind = KINDS[k]
        usage = state.usage(tenant, column)
        nominal = nominals[k]
        cohort = state.cohort_of.get(tenant)
        cohort_usage = state.cohort_used(cohort, column) if cohort is not None else usage
        cohort_nominal = self.cohort_nominal[cohort][k] if cohort is not None else nominal
        cohort_excess = cohort_usage + amount - cohort_nominal
        mode: AdmissionMode
        shortfall = 0
        work_within = usage + work_amount <= nominal
        if usage + amount <= nominal and (cohort is None or cohort_excess <= 0):
            return _NOMINAL if work_within else _NOMINAL_MEMBER_ONLY
        if work_within:
            mode, shortfall = "reclaim", cohort_excess
        elif cohort is None:
            mode, shortfall = "denied", usage + amount - nominal
        else:
            limit = self._limit[tenant][k]
            over_limit = usage + amount - (nominal + limit) if limit is not None else 0
            if over_limit <= 0 and cohort_excess <= 0:
                return _BORROW
            mode, shortfall = "denied", max(over_limit, cohort_excess)
        quota = QuotaState(
            mode=mode,
            tenant=tenant,
            kind=kind,
            usage=usage,
            requested=amount,
            nominal=nominal,
            borrowing_limit=self._limit[tenant][k] if cohort is not None else 0,
            cohort=cohort,
            cohort_usage=cohort_usage,
            cohort_nominal=cohort_nominal,
        )
        return Admission(mode, shortfall, quota)

    def _admit_in_tree(
        self,
        tree: CohortTree,
        state: ClusterState,
        tenant: str,
        column: int,
        amount: int,
        work_amount: int,
    ) -> Admission:
        k = state.column_kinds[column]
        usage = state.usage(tenant, column)
        nominal = self._nominal[tenant][k]
        check = tree.check(tenant, k, amount, _usage_of(state, column))
        within = usage + work_amount <= nominal  # the whole work: see ``admit``
        if check.own_excess <= 0 and check.path_excess <= 0:
            if within:
                return _NOMINAL
            return _NOMINAL_MEMBER_ONLY if usage + amount <= nominal else _BORROW
        mode: AdmissionMode = "reclaim" if within else "denied"
        shortfall = check.path_excess if within else max(check.own_excess, check.path_excess)
        limit = self._limit[tenant][k]
        quota = QuotaState(
            mode=mode,
            tenant=tenant,
            kind=KINDS[k],
            usage=usage,
            requested=amount,
            nominal=nominal,
            borrowing_limit=limit,
            cohort=check.cohort,
            cohort_usage=check.cohort_committed,
            cohort_nominal=check.cohort_nominal,
        )
        return Admission(mode, shortfall, quota)

    def violation(
        self,
        state: ClusterState,
        tenant: str,
        column: int,
        mode: AdmissionMode,
        *,
        held_before_work: int,
    ) -> int:
        """Accelerators still to release after a tentative placement made under ``mode``.

        Denied: down to the quota and the cohort's total, but not below what the tenant
        held when the pass started or, if less, before the work being placed
        (``held_before_work``): its own evictions make room for that work and no more (a
        lowered quota is no reason to evict), and room that others freed by evicting its
        work in this pass is none to grow back into."""
        record = self.tenants.get(tenant)
        if record is None or mode in ("unmanaged", "nominal", "borrow", "slices"):
            return 0
        k = state.column_kinds[column]
        held = min(self._held_at_start(tenant, k), held_before_work)
        if self.tree is not None and self.tree.manages(tenant):
            check = self.tree.check(tenant, k, 0, _usage_of(state, column))
            if mode == "reclaim":
                return max(0, check.path_excess)
            usage = state.usage(tenant, column)
            return max(0, min(max(check.own_excess, check.path_excess), usage - held))
        usage = state.usage(tenant, column)
        nominal = self._nominal[tenant][k]
        cohort = record.cohort
        if cohort is None:
            return max(0, usage - max(nominal, held))
        cohort_nominal = self.cohort_nominal[cohort][k]
        if mode == "reclaim":
            return max(0, state.cohort_used(cohort, column) - cohort_nominal)
        cohort_excess = state.cohort_used(cohort, column) - cohort_nominal
        limit = record.borrowing_limit.get(KINDS[k])
        over_limit = usage - (nominal + limit) if limit is not None else 0
        # As in a tree: a lowered quota is no reason to evict, so never below what the
        # tenant held (``held``); but a cohort over its total (quota lowered, or room
        # another eviction just freed) is no room to grow into either.
        return max(0, min(max(over_limit, cohort_excess), usage - held))


def charge(state: ClusterState, alloc: Held, column: int) -> int:
    """What ``alloc`` counts toward its tenant's usage of pool column ``column``'s kind."""
    return state.charge(alloc, state.column_kinds[column])


def _usage_of(state: ClusterState, column: int) -> UsageOf:
    k = state.column_kinds[column]
    usage = state.tenant_usage

    def of(tenant: str) -> int:
        held = usage.get(tenant)
        return held[k] if held is not None else 0

    return of
