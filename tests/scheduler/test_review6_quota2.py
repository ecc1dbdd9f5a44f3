"""Quota follow-ups to the reclaim fix (cloud/scheduler/quota.py, preemption.py,
hierarchy.py):

* a tenant over its quota whose work others evicted in the pass does not grow back
  into that room: its own evictions make room for its new work, never the others';
* reclaim takes a borrower down to its nominal quota, not below, when one member needs
  several victims on one node (as Kueue: a borrower's work is reclaimed only while the
  borrower, less the victims chosen before, still borrows).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from cloud.scheduler import Allocation, Cohort, Plan, Tenant, Work
from shared.messages import AcceleratorKind
from shared.work_literals import PriorityClass

from .builders import NOW, deployment, npu_replica, plan_on_npus

PRIORITIES: tuple[PriorityClass, ...] = ("p0", "p1", "p2")
TREE = [Cohort(name="left", parent="org"), Cohort(name="right", parent="org")]


def _npus_after(plan: Plan, held: Sequence[Allocation], tenants: Sequence[str]) -> int:
    """What ``tenants`` hold once the plan is carried out."""
    evicted = {p.allocation_id for p in plan.preemptions}
    kept = sum(
        a.accelerators for a in held if a.tenant in tenants and a.allocation_id not in evicted
    )
    return kept + sum(p.accelerators for p in plan.placements if p.tenant in tenants)


# -- 1. room others freed by evicting a tenant's work is none to grow back into --------


@pytest.mark.parametrize("tree", [False, True], ids=["flat", "tree"])
def test_a_borrower_whose_work_was_reclaimed_does_not_grow_back_into_the_room(
    tree: bool,
) -> None:
    # The reviewer's fuzzer, seed 2392, made small: c (nominal 0) borrows o's idle NPU.
    # o's 2-NPU deployment, within o's nominal 2, reclaims it. c's next deployment finds
    # a free NPU: the cohort (nominal total 2) is full with o's 2, so c is over quota
    # and must make room with its own lower-priority work (it has none). Before the fix
    # the NPU c held when the pass started, though reclaimed, counted as its own to
    # take again, and the cohort ended at 3 of 2.
    tenants = [
        Tenant(name="o", cohort="left", nominal={"npu": 2}),
        Tenant(name="c", cohort="right" if tree else "left", nominal={"npu": 0}),
    ]
    held = [
        npu_replica("c-old/0", "e0", tenant="c", priority="p2"),
        # Unmanaged, lower priority: something c could evict, so c's job gets an
        # attempt with preemption (where over-quota members are placed and fixed).
        npu_replica("x/0", "e2", tenant="x", priority="p2"),
    ]
    queue = [
        deployment(
            "o-job",
            tenant="o",
            priority="p0",
            kinds=("npu",),
            accelerators_per_replica=2,
            submitted_at=NOW - 20,
        ),
        deployment("c-new", tenant="c", priority="p0", kinds=("npu",), submitted_at=NOW - 10),
    ]
    plan = plan_on_npus([2, 1, 1], queue, held, tenants, TREE if tree else [])
    assert [(p.allocation_id, p.reason) for p in plan.preemptions] == [("c-old/0", "reclaim")]
    assert [p.work_id for p in plan.placements] == ["o-job"]
    pending = plan.pending_for("c-new")
    assert pending is not None
    assert pending.code == "quota"
    assert _npus_after(plan, held, ("o", "c")) <= 2


def test_a_borrower_whose_work_a_higher_priority_evicted_does_not_grow_back() -> None:
    # As the fuzzer found it: c's borrowed NPU goes to an unmanaged p0 job (priority),
    # o then takes its own nominal share of the cohort, and c's next job finds the
    # cohort full. It waits instead of taking the cohort past its total.
    tenants = [
        Tenant(name="o", cohort="lab", nominal={"npu": 2}),
        Tenant(name="c", cohort="lab", nominal={"npu": 0}, borrowing_limit={"npu": 1}),
    ]
    held = [
        npu_replica("c-old/0", "e0", tenant="c", priority="p2"),
        npu_replica("o-old/0", "e1", tenant="o", priority="p0", preemptible=False),
        npu_replica("x/0", "e4", tenant="x", priority="p2"),
    ]
    queue = [
        deployment(
            "ops-job",
            tenant="ops",
            priority="p0",
            kinds=("npu",),
            node_selector={"pool": "ops"},
            submitted_at=NOW - 30,
        ),
        deployment("o-job", tenant="o", priority="p0", kinds=("npu",), submitted_at=NOW - 20),
        deployment("c-new", tenant="c", priority="p1", kinds=("npu",), submitted_at=NOW - 10),
    ]
    plan = plan_on_npus([1, 1, 1, 1, 1], queue, held, tenants, labels={0: {"pool": "ops"}})
    assert [(p.allocation_id, p.reason) for p in plan.preemptions] == [("c-old/0", "priority")]
    assert sorted(p.work_id for p in plan.placements) == ["o-job", "ops-job"]
    pending = plan.pending_for("c-new")
    assert pending is not None
    assert pending.code == "quota"
    assert _npus_after(plan, held, ("o", "c")) <= 2


def test_a_lowered_quota_still_lets_a_job_take_the_place_of_the_tenants_own_work() -> None:
    # a holds 3 of a nominal 1 (its quota was lowered): its p0 job may take the place of
    # its own p2 replica, never of more, and never grows a past what it held.
    tenants = [
        Tenant(name="a", cohort="lab", nominal={"npu": 1}),
        Tenant(name="b", cohort="lab", nominal={"npu": 2}),
    ]
    held = [
        npu_replica("a-keep/0", "e0", tenant="a", priority="p0"),
        npu_replica("a-keep2/0", "e1", tenant="a", priority="p1"),
        npu_replica("a-low/0", "e2", tenant="a", priority="p2"),
    ]
    queue = [deployment("a-new", tenant="a", priority="p0", kinds=("npu",))]
    plan = plan_on_npus([1, 1, 1, 1], queue, held, tenants)
    assert [(p.allocation_id, p.reason) for p in plan.preemptions] == [("a-low/0", "quota")]
    assert [p.work_id for p in plan.placements] == ["a-new"]
    assert _npus_after(plan, held, ("a",)) == 3


# -- 2. one member, several victims on one node: down to nominal, not below ------------


@pytest.mark.parametrize("tree", [False, True], ids=["flat", "tree"])
def test_one_member_does_not_reclaim_a_borrower_below_its_nominal_quota(tree: bool) -> None:
    # The reviewer's repro: b (nominal 1) holds two 1-NPU replicas on a 2-NPU node; d
    # (nominal 2) asks for one 2-NPU replica. Only one of b's replicas is borrowed: the
    # other is within b's quota, so d waits (code quota) instead of taking b to 0.
    tenants = [
        Tenant(name="b", cohort="left", nominal={"npu": 1}),
        Tenant(name="d", cohort="right" if tree else "left", nominal={"npu": 2}),
    ]
    held = [npu_replica(f"b{i}/0", "e0", tenant="b", priority="p0") for i in range(2)]
    queue = [
        deployment("d-job", tenant="d", priority="p2", kinds=("npu",), accelerators_per_replica=2)
    ]
    plan = plan_on_npus([2, 1], queue, held, tenants, TREE if tree else [])
    assert plan.preemptions == ()
    assert plan.placements == ()
    pending = plan.pending_for("d-job")
    assert pending is not None
    assert pending.code == "quota"


def test_reclaim_finds_a_node_where_the_borrowers_excess_is_enough() -> None:
    # b (nominal 2) holds 3: two on e0, one on e1 beside an unmanaged p1 replica. d's
    # p0 replica of 2 NPUs would take both of b's on e0 (b to 1, below its quota); on
    # e1 it takes b's one borrowed NPU (reclaim) and the p1 replica (priority).
    tenants = [
        Tenant(name="b", cohort="lab", nominal={"npu": 2}),
        Tenant(name="d", cohort="lab", nominal={"npu": 2}),
    ]
    held = [
        npu_replica("b0/0", "e0", tenant="b", priority="p0"),
        npu_replica("b1/0", "e0", tenant="b", priority="p0"),
        npu_replica("b2/0", "e1", tenant="b", priority="p0"),
        npu_replica("z/0", "e1", tenant="z", priority="p1"),
    ]
    queue = [
        deployment("d-job", tenant="d", priority="p0", kinds=("npu",), accelerators_per_replica=2)
    ]
    plan = plan_on_npus([2, 2], queue, held, tenants)
    assert [(p.work_id, p.node_id) for p in plan.placements] == [("d-job", "e1")]
    assert sorted((p.allocation_id, p.reason) for p in plan.preemptions) == [
        ("b2/0", "reclaim"),
        ("z/0", "priority"),
    ]
    assert _npus_after(plan, held, ("b",)) == 2


def test_a_last_victim_larger_than_the_borrowers_excess_is_still_reclaimed() -> None:
    # b (nominal 2) holds 3: a 2-NPU replica on e0 and one on e1. d, within its nominal,
    # needs 2 on one node: b still borrows before its 2-NPU replica goes, so it goes
    # (b ends at 1, as in Kueue); else d could never have its nominal share while b
    # borrows with work of that size.
    tenants = [
        Tenant(name="b", cohort="lab", nominal={"npu": 2}),
        Tenant(name="d", cohort="lab", nominal={"npu": 2}),
    ]
    held = [
        npu_replica("big/0", "e0", 2, tenant="b", priority="p0"),
        npu_replica("small/0", "e1", tenant="b", priority="p0"),
    ]
    queue = [
        deployment("d-job", tenant="d", priority="p2", kinds=("npu",), accelerators_per_replica=2)
    ]
    plan = plan_on_npus([2, 1], queue, held, tenants)
    assert [(p.work_id, p.node_id) for p in plan.placements] == [("d-job", "e0")]
    assert [(p.allocation_id, p.reason) for p in plan.preemptions] == [("big/0", "reclaim")]


def test_a_borrowers_work_beyond_its_excess_goes_only_for_a_lower_priority() -> None:
    # b (nominal 1) holds two p2 replicas on d's node; d's p1 replica of 2 takes one
    # back as reclaim and the other because it is of lower priority, as it would take
    # anyone's: the reason says which.
    tenants = [
        Tenant(name="b", cohort="lab", nominal={"npu": 1}),
        Tenant(name="d", cohort="lab", nominal={"npu": 2}),
    ]
    held = [
        npu_replica("b0/0", "e0", tenant="b", priority="p2", started_at=NOW - 600),
        npu_replica("b1/0", "e0", tenant="b", priority="p2", started_at=NOW - 300),
    ]
    queue = [
        deployment("d-job", tenant="d", priority="p1", kinds=("npu",), accelerators_per_replica=2)
    ]
    plan = plan_on_npus([2], queue, held, tenants)
    assert [p.work_id for p in plan.placements] == ["d-job"]
    # The latest started goes first, as reclaim; the other is b's within its quota.
    assert [(p.allocation_id, p.reason) for p in plan.preemptions] == [
        ("b1/0", "reclaim"),
        ("b0/0", "priority"),
    ]


# -- property: over random small cohorts, flat and as a tree --------------------------


def _random_scenario(
    rng: random.Random, *, tree: bool
) -> tuple[list[int], list[Work], list[Allocation], list[Tenant], list[Cohort]]:
    names = ["t0", "t1", "t2"]
    tenants = []
    for i, name in enumerate(names):
        limit: dict[AcceleratorKind, int] = {"npu": rng.randint(0, 2)} if rng.random() < 0.4 else {}
        tenants.append(
            Tenant(
                name=name,
                cohort=(("left" if i % 2 == 0 else "right") if tree else "lab"),
                nominal={"npu": rng.randint(0, 3)},
                borrowing_limit=limit,
            )
        )
    ceiling = {t.name: t.nominal["npu"] + t.borrowing_limit.get("npu", 1 << 20) for t in tenants}
    nodes = [rng.choice((1, 2, 2, 4)) for _ in range(rng.randint(2, 4))]
    held: list[Allocation] = []
    usage = dict.fromkeys(names, 0)
    total_nominal = sum(t.nominal["npu"] for t in tenants)
    for node, count in enumerate(nodes):
        free = count
        while free and rng.random() < 0.9:
            npus = 2 if free >= 2 and rng.random() < 0.2 else 1
            free -= npus
            tenant = rng.choice([*names, "x"])  # x: unmanaged
            if tenant in usage:
                over = usage[tenant] + npus > ceiling[tenant]
                if over or sum(usage.values()) + npus > total_nominal:
                    continue  # the pass starts within every quota
                usage[tenant] += npus
            held.append(
                npu_replica(
                    f"run-{node}-{free}/0",
                    f"e{node}",
                    npus,
                    tenant=tenant,
                    priority=rng.choice(PRIORITIES),
                    started_at=NOW - rng.randint(1, 3600),
                )
            )
    queue: list[Work] = [
        deployment(
            f"q{i}",
            tenant=rng.choice([*names, "x"]),
            priority=rng.choice(PRIORITIES),
            kinds=("npu",),
            replicas=rng.randint(1, 2),
            accelerators_per_replica=rng.choice((1, 2, 2, 3)),
            submitted_at=NOW - rng.randint(1, 3600),
        )
        for i in range(rng.randint(1, 5))
    ]
    return nodes, queue, held, tenants, TREE if tree else []


def _still_borrowing(
    victim: str, reclaimer: str, held: dict[str, int], tenants: Sequence[Tenant], tree: bool
) -> bool:
    """The rule, modelled apart from the scheduler's tree: the victim's tenant borrows,
    or (in the tree) its cohort does, where the reclaimer is under the other cohort."""
    cohort_of = {t.name: t.cohort for t in tenants}
    nominal = {t.name: t.nominal["npu"] for t in tenants}
    if held[victim] > nominal[victim]:
        return True
    if not tree or cohort_of[victim] == cohort_of[reclaimer]:
        return False
    members = [t for t in tenants if t.cohort == cohort_of[victim]]
    return sum(held[t.name] for t in members) > sum(nominal[t.name] for t in members)


@pytest.mark.parametrize("tree", [False, True], ids=["flat", "tree"])
def test_quotas_hold_and_reclaim_stops_at_nominal_over_random_cohorts(tree: bool) -> None:
    rng = random.Random(20261207 + tree)
    reclaims = denied_placements = 0
    for case in range(600):
        nodes, queue, held, tenants, cohorts = _random_scenario(rng, tree=tree)
        plan = plan_on_npus(nodes, queue, held, tenants, cohorts)
        context = (case, nodes, held, queue, plan.preemptions, plan.placements)
        names = [t.name for t in tenants]
        by_id = {a.allocation_id: a for a in held}
        work_tenant = {w.work_id: w.tenant for w in queue}
        # Replayed in the order they were decided: every reclaimed replica's tenant
        # still borrowed with the work it held before the pass, less what went before.
        still_held = dict.fromkeys(names, 0)
        for alloc in held:
            if alloc.tenant in still_held:
                still_held[alloc.tenant] += alloc.accelerators
        for preemption in plan.preemptions:
            victim = by_id[preemption.allocation_id]
            if preemption.reason == "reclaim":
                reclaims += 1
                reclaimer = work_tenant[preemption.preempted_by]
                assert _still_borrowing(victim.tenant, reclaimer, still_held, tenants, tree), (
                    context
                )
            if victim.tenant in still_held:
                still_held[victim.tenant] -= victim.accelerators
        # The pass started within every quota, and ends so.
        for tenant in tenants:
            after = _npus_after(plan, held, (tenant.name,))
            limit = tenant.borrowing_limit.get("npu")
            if limit is not None:
                assert after <= tenant.nominal["npu"] + limit, context
        # The cohort's (flat) or the root's (tree) nominal total: the members' sum.
        total = sum(t.nominal["npu"] for t in tenants)
        assert _npus_after(plan, held, names) <= total, context
        denied_placements += sum(1 for p in plan.preemptions if p.reason == "quota")
    assert reclaims > 0  # the scenarios do reach reclaim
    assert denied_placements > 0  # and tenants over quota making room
