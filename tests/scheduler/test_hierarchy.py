"""Hierarchical cohorts: nominal quota, borrowing and lending limits at every level of
the tree, reclaim of what a cohort lent; and fair share with decayed past usage, level
by level (cloud/scheduler/hierarchy.py, fair_share.py), with a fake clock."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest

from cloud.scheduler import (
    Allocation,
    Cohort,
    CohortTreeError,
    Policy,
    Snapshot,
    Tenant,
    Work,
    schedule,
)
from cloud.scheduler.fair_share import DecayedUsage, kind_usage
from cloud.scheduler.hierarchy import CohortTree
from cloud.scheduler.plan import Plan
from cloud.scheduler.unschedulable import never_fits

from .builders import NOW, gpu_node, job, running

NODES = [gpu_node(f"n{i}") for i in range(4)]  # 32 GPUs

# org ── research ── a (8), b (8)
#     └─ prod ────── c (16)
TENANTS = [
    Tenant(name="a", cohort="research", nominal={"gpu": 8}),
    Tenant(name="b", cohort="research", nominal={"gpu": 8}),
    Tenant(name="c", cohort="prod", nominal={"gpu": 16}),
]


def _plan(
    queue: Sequence[Work],
    cohorts: Sequence[Cohort],
    *,
    allocations: Sequence[Allocation] = (),
    tenants: Sequence[Tenant] = TENANTS,
    past: dict[str, tuple[float, ...]] | None = None,
    nodes: Sequence[object] = NODES,
) -> Plan:
    snapshot = Snapshot.build(
        now=NOW,
        nodes=nodes,  # type: ignore[arg-type]
        allocations=allocations,
        queue=queue,
        tenants=tenants,
        cohorts=cohorts,
        past_usage=past,
    )
    return schedule(snapshot, Policy())


def _placed(plan: Plan) -> list[str]:
    return sorted({p.work_id for p in plan.placements})


def _tree(*cohorts: Cohort) -> list[Cohort]:
    return [Cohort(name="research", parent="org"), Cohort(name="prod", parent="org"), *cohorts]


def test_without_limits_a_tenant_borrows_what_the_whole_tree_has_idle() -> None:
    queue = [job(f"a{i}", 8, tenant="a", submitted_at=i) for i in range(4)]
    plan = _plan(queue, _tree())
    assert _placed(plan) == ["a0", "a1", "a2", "a3"]
    assert [p.borrowed for p in plan.placements] == [False, True, True, True]


def test_a_lending_limit_keeps_the_rest_of_a_cohorts_quota_for_its_own_members() -> None:
    # prod lends at most 8 of its 16: a may hold its 8, b's idle 8 and 8 of prod's.
    cohorts = [
        Cohort(name="research", parent="org"),
        Cohort(name="prod", parent="org", lending_limit={"gpu": 8}),
    ]
    queue = [job(f"a{i}", 8, tenant="a", submitted_at=i) for i in range(4)]
    plan = _plan(queue, cohorts)
    assert _placed(plan) == ["a0", "a1", "a2"]
    pending = plan.pending_for("a3")
    assert pending is not None
    assert pending.code == "quota"
    assert pending.quota is not None
    assert pending.quota.cohort == "org"  # the level whose limit stops it
    # org: a's 24, prod's 8 kept back unlent, of org's 32.
    assert (pending.quota.cohort_usage, pending.quota.cohort_nominal) == (32, 32)
    assert "cohort org 32/32) and asks for 8 more" in pending.message


def test_a_tenants_lending_limit_is_not_lent_to_its_siblings() -> None:
    tenants = [
        Tenant(name="a", cohort="research", nominal={"gpu": 8}),
        Tenant(name="b", cohort="research", nominal={"gpu": 8}),
    ]
    cohorts = [Cohort(name="research", lending_limit={"gpu": 0})]
    queue = [job(f"a{i}", 8, tenant="a", submitted_at=i) for i in range(3)]
    plan = _plan(queue, cohorts, tenants=tenants)
    # research is the root: its nominal is a's and b's together, whatever it lends.
    assert _placed(plan) == ["a0", "a1"]


def test_a_cohorts_borrowing_limit_caps_its_whole_subtree() -> None:
    cohorts = [
        Cohort(name="research", parent="org", borrowing_limit={"gpu": 4}),
        Cohort(name="prod", parent="org"),
    ]
    queue = [job(f"a{i}", 4, tenant="a", submitted_at=i) for i in range(4)] + [
        job(f"b{i}", 4, tenant="b", submitted_at=10 + i) for i in range(4)
    ]
    plan = _plan(queue, cohorts)
    held = sum(p.accelerators for p in plan.placements)
    assert held == 20  # research's 16 plus at most 4 borrowed from prod
    waiting = [w for w in ("a3", "b3") if plan.pending_for(w) is not None]
    assert waiting


def test_a_cohorts_own_nominal_quota_bounds_its_members() -> None:
    # research may hold only 12 in all, though a and b have 8 each.
    cohorts = [
        Cohort(name="research", parent="org", nominal={"gpu": 12}),
        Cohort(name="prod", parent="org", lending_limit={"gpu": 0}),
    ]
    queue = [job("a0", 8, tenant="a"), job("b0", 8, tenant="b", submitted_at=1)]
    plan = _plan(queue, cohorts)
    assert _placed(plan) == ["a0"]


def test_the_cohort_that_lent_reclaims_from_the_borrowers_below_the_shared_cohort() -> None:
    # a borrowed prod's idle GPUs (24 of 32); c (prod) asks for its nominal 16.
    borrowed = [
        running(f"a-run{i}", f"n{i}", 8, tenant="a", priority="p2", work_id=f"a-run{i}")
        for i in range(3)
    ]
    plan = _plan(
        [job("c0", 8, workers=2, tenant="c", priority="p2")], _tree(), allocations=borrowed
    )
    assert _placed(plan) == ["c0"]
    evicted = {p.work_id for p in plan.preemptions}
    assert {p.reason for p in plan.preemptions} == {"reclaim"}
    assert len(evicted) == 1  # 8 idle + 8 reclaimed: a keeps its nominal 8 and 8 of b's


def test_nothing_is_reclaimed_when_no_level_borrows() -> None:
    # research (a: 8, b: 8) holds 16 within its own nominal; c holds 16: nothing is
    # borrowed anywhere, so b's request beyond its quota waits, reclaiming nothing.
    held = [
        running("a-run", "n0", 8, tenant="a", work_id="a-run"),
        running("b-run", "n1", 8, tenant="b", work_id="b-run"),
        running("c-run0", "n2", 8, tenant="c", work_id="c-run0"),
        running("c-run1", "n3", 8, tenant="c", work_id="c-run1"),
    ]
    plan = _plan([job("b1", 8, tenant="b", priority="p2")], _tree(), allocations=held)
    assert plan.preemptions == ()
    pending = plan.pending_for("b1")
    assert pending is not None
    assert pending.code == "quota"


@pytest.mark.parametrize("other_nominal", [0, 2])
def test_a_gang_beyond_its_tenants_nominal_quota_reclaims_nothing_in_a_tree(
    other_nominal: int,
) -> None:
    # org ── lab ── a (6), b (2)
    #     └─ other ── d (other_nominal, holding nothing: with 2, org has room for
    #                    b's first worker and only the node is short)
    # One node of 8: a holds 7, borrowing 1 of b's with a preemptible job of 3. b's gang
    # of 2 × 2 is beyond its nominal 2 as a whole: it may borrow, never reclaim, though
    # its first worker alone would be within nominal.
    tenants = [
        Tenant(name="a", cohort="lab", nominal={"gpu": 6}),
        Tenant(name="b", cohort="lab", nominal={"gpu": 2}),
        Tenant(name="d", cohort="other", nominal={"gpu": other_nominal}),
    ]
    cohorts = [Cohort(name="lab", parent="org"), Cohort(name="other", parent="org")]
    held = [
        running("a-fixed", "n0", 4, tenant="a", priority="p1", preemptible=False),
        running("a-job", "n0", 3, tenant="a", priority="p1"),
    ]
    node = [gpu_node("n0")]
    gang = job("b-gang", 2, workers=2, tenant="b")
    plan = _plan([gang], cohorts, allocations=held, tenants=tenants, nodes=node)
    assert plan.preemptions == ()
    assert plan.placements == ()
    pending = plan.pending_for("b-gang")
    assert pending is not None
    if other_nominal == 0:  # org's total is the node's: quota stops the first worker
        assert pending.message.startswith("Over quota: tenant b uses 0 GPU (nominal 2")
    # Within its nominal, the same gang takes back what a borrowed.
    within = job("b-within", 1, workers=2, tenant="b")
    plan = _plan([within], cohorts, allocations=held, tenants=tenants, nodes=node)
    assert [(p.allocation_id, p.reason) for p in plan.preemptions] == [("a-job", "reclaim")]
    assert _placed(plan) == ["b-within"]


def test_work_beyond_what_the_tree_could_ever_lend_is_unschedulable() -> None:
    cohorts = [
        Cohort(name="research", parent="org", borrowing_limit={"gpu": 4}),
        Cohort(name="prod", parent="org"),
    ]
    snapshot = Snapshot.build(now=NOW, nodes=NODES, tenants=TENANTS, cohorts=cohorts)
    found = never_fits(snapshot, job("big", 8, workers=3, tenant="a"))
    assert found is not None
    assert "may hold at most 20 GPU" in found.reason
    assert never_fits(snapshot, job("fits", 4, workers=5, tenant="a")) is None


def test_a_cycle_of_parents_is_refused_naming_the_setting() -> None:
    with pytest.raises(CohortTreeError) as refused:
        CohortTree(
            {t.name: t for t in TENANTS},
            {
                "research": Cohort(name="research", parent="org"),
                "org": Cohort(name="org", parent="research"),
            },
        )
    assert refused.value.field in ("cohorts.org.parent", "cohorts.research.parent")


@pytest.mark.parametrize("other_name", ["lab-team", "lab"])
def test_a_tenant_named_like_a_cohort_does_not_change_another_tenants_admission(
    other_name: str,
) -> None:
    # org (2) ── lab ── alice (4)
    #     └───────────── other_name (0)
    # Tenants and cohorts are named apart: a tenant called "lab" is not the cohort lab,
    # so alice's 4 GPU still count against org's 2 and her job waits.
    tenants = [
        Tenant(name="alice", cohort="lab", nominal={"gpu": 4}),
        Tenant(name=other_name, cohort="org"),
    ]
    cohorts = [Cohort(name="org", nominal={"gpu": 2}), Cohort(name="lab", parent="org")]
    plan = _plan([job("alice-4", 4, tenant="alice")], cohorts, tenants=tenants)
    assert plan.placements == ()
    assert plan.pending_for("alice-4") is not None


@pytest.mark.parametrize("other_name", ["lab-team", "lab"])
def test_a_tenant_named_like_a_lending_cohort_does_not_lift_its_limit(
    other_name: str,
) -> None:
    # No cohort records: lab is in the tree because alice lends only part of her quota,
    # so lab's nominal is her 2 and she may hold at most 2, whatever another tenant
    # (in cohort x) is called.
    tenants = [
        Tenant(name="alice", cohort="lab", nominal={"gpu": 2}, lending_limit={"gpu": 2}),
        Tenant(name=other_name, cohort="x", nominal={"gpu": 0}, lending_limit={"gpu": 0}),
    ]
    plan = _plan([job("alice-4", 4, tenant="alice")], [], tenants=tenants)
    assert plan.placements == ()
    assert plan.pending_for("alice-4") is not None


def test_reclaim_tells_a_tenant_from_a_cohort_of_the_same_name() -> None:
    # org ── research ── a (8), prod (8)   (a tenant named like the other cohort)
    #     └─ prod ────── c (16)
    # The tenant "prod" borrowed prod's idle GPUs; c asks for its nominal 16 and
    # reclaims from it, as from any borrower below the cohort they share.
    tenants = [TENANTS[0], Tenant(name="prod", cohort="research", nominal={"gpu": 8}), TENANTS[2]]
    borrowed = [
        running(f"p-run{i}", f"n{i}", 8, tenant="prod", priority="p2", work_id=f"p-run{i}")
        for i in range(3)
    ]
    plan = _plan(
        [job("c0", 8, workers=2, tenant="c", priority="p2")],
        _tree(),
        allocations=borrowed,
        tenants=tenants,
    )
    assert _placed(plan) == ["c0"]
    assert {p.reason for p in plan.preemptions} == {"reclaim"}


# ---- fair share ------------------------------------------------------------------------


def test_decayed_usage_halves_every_half_life() -> None:
    half_life = 3600.0
    gpu = kind_usage({"gpu": 1.0}).index(1.0)
    held = [0] * len(kind_usage({}))
    held[gpu] = 4
    usage = DecayedUsage.empty(0.0).advanced(half_life, held, half_life)
    # Holding 4 for one half-life from nothing: an average of 4 * (1 - 1/2).
    assert usage.average(half_life, half_life)[gpu] == pytest.approx(2.0)
    # One more half-life holding nothing halves it; reading later decays it as well.
    later = usage.advanced(2 * half_life, [0] * len(held), half_life)
    assert later.average(2 * half_life, half_life)[gpu] == pytest.approx(1.0)
    assert usage.average(2 * half_life, half_life)[gpu] == pytest.approx(1.0)
    assert math.isclose(
        later.average(3 * half_life, half_life)[gpu], 0.5, rel_tol=1e-9
    )  # a fake clock: no time passes but what the test says
    assert DecayedUsage.empty(0.0).advanced(10.0, held, 0.0).average(10.0, 0.0)[gpu] == 0.0


def test_the_sibling_with_less_decayed_usage_is_served_first() -> None:
    nodes = [gpu_node("n0")]
    tenants = [
        Tenant(name="a", cohort="research", nominal={"gpu": 8}),
        Tenant(name="b", cohort="research", nominal={"gpu": 8}),
    ]
    queue = [
        job("a-job", 8, tenant="a", submitted_at=NOW - 60),
        job("b-job", 8, tenant="b", submitted_at=NOW - 30),
    ]
    fresh = _plan(queue, [Cohort(name="research")], tenants=tenants, nodes=nodes)
    assert _placed(fresh) == ["a-job"]  # no past: submission order
    past = {"a": kind_usage({"gpu": 4.0})}
    plan = _plan(queue, [Cohort(name="research")], tenants=tenants, nodes=nodes, past=past)
    assert _placed(plan) == ["b-job"]


def test_shares_are_compared_level_by_level_from_the_top() -> None:
    # x: a1 (share 0.5); y: b1 (share 0.75) and b2 idle. Flat DRF would serve a1; the
    # tree compares x (0.5) with y (6/16) first and serves y's b1.
    tenants = [
        Tenant(name="a1", cohort="x", nominal={"gpu": 8}),
        Tenant(name="b1", cohort="y", nominal={"gpu": 8}),
        Tenant(name="b2", cohort="y", nominal={"gpu": 8}),
    ]
    cohorts = [Cohort(name="x", parent="top"), Cohort(name="y", parent="top")]
    past = {"a1": kind_usage({"gpu": 4.0}), "b1": kind_usage({"gpu": 6.0})}
    queue = [
        job("a1-job", 8, tenant="a1", submitted_at=NOW - 60),
        job("b1-job", 8, tenant="b1", submitted_at=NOW - 30),
    ]
    nodes = [gpu_node("n0")]
    plan = _plan(queue, cohorts, tenants=tenants, past=past, nodes=nodes)
    assert _placed(plan) == ["b1-job"]
    flat = _plan(queue, (), tenants=tenants, past=past, nodes=nodes)
    assert _placed(flat) == ["a1-job"]


def test_a_tenants_lending_limit_holds_in_a_flat_cohort_too() -> None:
    tenants = [
        Tenant(name="a", cohort="lab", nominal={"gpu": 8}),
        Tenant(name="b", cohort="lab", nominal={"gpu": 8}, lending_limit={"gpu": 2}),
    ]
    queue = [job(f"a{i}", 2, tenant="a", submitted_at=i) for i in range(6)]
    plan = _plan(queue, (), tenants=tenants)
    # a's 8 and at most 2 of b's idle 8.
    assert sum(p.accelerators for p in plan.placements) == 10
    snapshot = Snapshot.build(now=NOW, nodes=NODES, tenants=tenants)
    found = never_fits(snapshot, job("big", 4, workers=3, tenant="a"))
    assert found is not None
    assert "may hold at most 10 GPU" in found.reason
