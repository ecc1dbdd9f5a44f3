"""Reclaim judges a borrower on the work it held when the pass started: what a tenant
placed earlier in the same pass (never evicted in that pass) must not make its older
work within its nominal quota reclaimable (cloud/scheduler/quota.py, preemption.py)."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

import pytest

from cloud.scheduler import (
    AcceleratorPool,
    Allocation,
    Cohort,
    Node,
    Scheduler,
    Snapshot,
    Tenant,
    Work,
)
from cloud.scheduler.hierarchy import CohortTree
from shared.messages import AcceleratorKind
from shared.work_literals import PriorityClass

from .builders import GIB, NOW, deployment, npu_replica, plan_on_npus, running

PRIORITIES: tuple[PriorityClass, ...] = ("p0", "p1", "p2")


# The reviewer's repro: b holds its nominal 1 NPU (p0); its p1 deployment borrows d's
# idle NPU earlier in the pass; d's p2 deployment, within d's nominal, comes next.
FLAT_TENANTS = [
    Tenant(name="b", cohort="lab", nominal={"npu": 1}),
    Tenant(name="d", cohort="lab", nominal={"npu": 1}),
]
TREE_TENANTS = [
    Tenant(name="b", cohort="lab", nominal={"npu": 1}),
    Tenant(name="d", cohort="other", nominal={"npu": 1}),
]
TREE = [Cohort(name="lab", parent="org"), Cohort(name="other", parent="org")]
B_OLD = npu_replica("b-old/0", "e0", tenant="b", priority="p0")
QUEUE = [
    deployment("b-new", tenant="b", priority="p1", kinds=("npu",), submitted_at=NOW - 20),
    deployment("d-job", tenant="d", priority="p2", kinds=("npu",), submitted_at=NOW - 10),
]


@pytest.mark.parametrize(
    ("tenants", "cohorts"), [(FLAT_TENANTS, []), (TREE_TENANTS, TREE)], ids=["flat", "tree"]
)
def test_work_placed_in_the_pass_does_not_make_older_work_within_nominal_reclaimable(
    tenants: list[Tenant], cohorts: list[Cohort]
) -> None:
    first = plan_on_npus([1, 1], QUEUE, [B_OLD], tenants, cohorts)
    assert [(p.work_id, p.borrowed) for p in first.placements] == [("b-new", True)]
    assert first.preemptions == ()  # b-old is within b's nominal quota: it stays
    pending = first.pending_for("d-job")
    assert pending is not None
    assert pending.code == "quota"
    assert pending.quota is not None
    assert pending.quota.mode == "reclaim"

    # The next pass: b-new is running borrowed capacity now, and is what d takes back.
    b_new = npu_replica("b-new/0", "e1", tenant="b", priority="p1", started_at=NOW)
    second = plan_on_npus([1, 1], QUEUE[1:], [B_OLD, b_new], tenants, cohorts)
    assert [(p.allocation_id, p.reason) for p in second.preemptions] == [("b-new/0", "reclaim")]
    assert [(p.work_id, p.node_id) for p in second.placements] == [("d-job", "e1")]


def test_work_evicted_earlier_in_the_pass_no_longer_counts_as_borrowed() -> None:
    # b held 2 NPUs at the start (nominal 1, borrowing 1): its p1 deployment takes the
    # place of its own p2 replica, so it still holds 2, but only 1 of the work it held
    # before the pass (b-keep, p0). d's deployment within nominal must not reclaim it.
    tenants = [
        Tenant(name="b", cohort="lab", nominal={"npu": 1}, borrowing_limit={"npu": 1}),
        Tenant(name="d", cohort="lab", nominal={"npu": 1}),
    ]
    held = [
        npu_replica("b-keep/0", "e0", tenant="b", priority="p0"),
        npu_replica("b-low/0", "e1", tenant="b", priority="p2"),
    ]
    queue = [
        deployment("b-high", tenant="b", priority="p1", kinds=("npu",), submitted_at=NOW - 20),
        deployment("d-job", tenant="d", priority="p2", kinds=("npu",), submitted_at=NOW - 10),
    ]
    plan = plan_on_npus([1, 1], queue, held, tenants)
    assert [(p.allocation_id, p.reason) for p in plan.preemptions] == [("b-low/0", "priority")]
    assert [p.work_id for p in plan.placements] == ["b-high"]
    pending = plan.pending_for("d-job")
    assert pending is not None
    assert pending.code == "quota"


def test_a_tenant_borrowing_before_the_pass_is_still_reclaimed_from() -> None:
    # b borrowed d's NPU before the pass: d, within nominal, takes it back at once,
    # the least important of b's work, whichever node it is on.
    held = [
        npu_replica("b-old/0", "e0", tenant="b", priority="p0"),
        npu_replica("b-borrowed/0", "e1", tenant="b", priority="p1"),
    ]
    queue = [deployment("d-job", tenant="d", priority="p2", kinds=("npu",))]
    plan = plan_on_npus([1, 1], queue, held, FLAT_TENANTS)
    assert [(p.allocation_id, p.reason) for p in plan.preemptions] == [("b-borrowed/0", "reclaim")]
    assert [p.work_id for p in plan.placements] == ["d-job"]


# -- property: over random small cohorts, flat and as a tree --------------------------


def _random_scenario(
    rng: random.Random, *, tree: bool
) -> tuple[list[int], list[Work], list[Allocation], list[Tenant], list[Cohort]]:
    names = ["t0", "t1", "t2"][: rng.randint(2, 3)]
    tenants = [
        Tenant(
            name=name,
            cohort=(("left" if i % 2 == 0 else "right") if tree else "lab"),
            nominal={"npu": rng.randint(0, 2)},
        )
        for i, name in enumerate(names)
    ]
    cohorts = (
        [Cohort(name="left", parent="org"), Cohort(name="right", parent="org")] if tree else []
    )
    nodes = [rng.randint(1, 2) for _ in range(rng.randint(2, 4))]
    held: list[Allocation] = []
    for node, count in enumerate(nodes):
        for slot in range(count):
            if rng.random() < 0.6:
                held.append(
                    npu_replica(
                        f"run-{node}-{slot}/0",
                        f"e{node}",
                        tenant=rng.choice(names),
                        priority=rng.choice(PRIORITIES),
                        started_at=NOW - rng.randint(1, 3600),
                    )
                )
    queue: list[Work] = [
        deployment(
            f"q{i}",
            tenant=rng.choice(names),
            priority=rng.choice(PRIORITIES),
            kinds=("npu",),
            replicas=rng.randint(1, 2),
            submitted_at=NOW - rng.randint(1, 3600),
        )
        for i in range(rng.randint(1, 4))
    ]
    return nodes, queue, held, tenants, cohorts


def _borrowing_at_start(
    tenant: str,
    held: Sequence[Allocation],
    tenants: Sequence[Tenant],
    cohorts: Sequence[Cohort],
) -> bool:
    """Whether ``tenant``, or (in a tree) a cohort between it and the root, held more
    than its nominal quota with the work running when the pass started."""
    usage: dict[str, int] = {}
    for alloc in held:
        usage[alloc.tenant] = usage.get(alloc.tenant, 0) + alloc.accelerators
    by_name = {t.name: t for t in tenants}
    if usage.get(tenant, 0) > by_name[tenant].nominal.get("npu", 0):
        return True
    if not cohorts:
        return False
    tree = CohortTree(by_name, {c.name: c for c in cohorts})
    npu = 1  # KINDS index of "npu"
    below_root = tree.path[tenant][:-1]
    return any(
        tree.borrowing(tree.node(cohort), npu, lambda name: usage.get(name, 0))
        for cohort in below_root
    )


@pytest.mark.parametrize("tree", [False, True], ids=["flat", "tree"])
def test_reclaim_only_takes_from_tenants_that_borrowed_before_the_pass(tree: bool) -> None:
    rng = random.Random(20240611 + tree)
    reclaims = 0
    for case in range(400):
        nodes, queue, held, tenants, cohorts = _random_scenario(rng, tree=tree)
        plan = plan_on_npus(nodes, queue, held, tenants, cohorts)
        nominal = {t.name: t.nominal.get("npu", 0) for t in tenants}
        reclaimed = {p.allocation_id for p in plan.preemptions if p.reason == "reclaim"}
        for preemption in plan.preemptions:
            if preemption.reason != "reclaim":
                continue
            reclaims += 1
            victim = next(a for a in held if a.allocation_id == preemption.allocation_id)
            context = (case, nodes, held, queue, plan.preemptions)
            assert _borrowing_at_start(victim.tenant, held, tenants, cohorts), context
            if not tree:
                # Flat: reclaim stops once the tenant is back within its nominal quota
                # (what it held before, less what was reclaimed); only the replica that
                # crosses it may take it below.
                kept = sum(
                    a.accelerators
                    for a in held
                    if a.tenant == victim.tenant and a.allocation_id not in reclaimed
                )
                assert kept + victim.accelerators > nominal[victim.tenant], context
    assert reclaims > 0  # the scenarios do reach reclaim


# -- what "held before the pass" counts ------------------------------------------------

WHOLE = "NVIDIA A100-SXM4-80GB"
SLICE = "NVIDIA A100-SXM4-80GB MIG 1g.10gb"


def test_work_held_before_the_pass_is_counted_as_quota_usage_is() -> None:
    # Cores beside GPUs count toward a ``cpu`` quota only where the tenant has one, and
    # slices toward their profile's quota, not the gpu quota, only where it has that:
    # after evictions (nothing placed), what each tenant held before the pass and still
    # holds is its usage, kind by kind.
    node = Node(
        node_id="n1",
        site="cloud",
        zone="DE",
        region="eu",
        host_memory_bytes=64 * GIB,
        pools=(
            AcceleratorPool(kind="gpu", count=4, model=WHOLE, memory_bytes=80 * GIB),
            AcceleratorPool(
                kind="gpu", count=7, model=SLICE, memory_bytes=10 * GIB, relative_speed=1 / 7
            ),
            AcceleratorPool(kind="cpu", count=32, model="x86", memory_bytes=64 * GIB),
        ),
    )
    tenants = [
        Tenant(name="a", cohort="lab", nominal={"gpu": 1, "cpu": 4}, mig_nominal={"1g.10gb": 7}),
        Tenant(name="b", cohort="lab", nominal={"gpu": 1}),
    ]

    def held(
        aid: str,
        count: int,
        tenant: str,
        model: str,
        *,
        kind: AcceleratorKind = "gpu",
        cpu_cores: int = 0,
    ) -> Allocation:
        alloc = running(
            aid, "n1", count, tenant=tenant, kind=kind, work_kind="inference", cpu_cores=cpu_cores
        )
        return dataclasses.replace(alloc, accelerator_model=model)

    allocations = [
        held("a-whole", 1, "a", WHOLE, cpu_cores=4),
        held("a-whole2", 1, "a", WHOLE, cpu_cores=2),
        held("a-slices", 2, "a", SLICE),
        held("a-cpu", 3, "a", "x86", kind="cpu"),
        held("b-whole", 1, "b", WHOLE, cpu_cores=2),
        held("b-slices", 2, "b", SLICE),
        held("b-slice", 1, "b", SLICE),
    ]
    scheduler = Scheduler(
        Snapshot.build(now=NOW, nodes=[node], allocations=allocations, tenants=tenants)
    )
    state, quota = scheduler.state, scheduler.quota
    columns = range(len(state.column_kinds))

    def agree() -> None:
        for tenant in ("a", "b"):
            for column in columns:
                assert quota.held_before_pass(state, tenant, column) == state.usage(
                    tenant, column
                ), (tenant, column)

    agree()
    for evicted in ("a-whole", "a-slices", "a-cpu", "b-slice"):
        state.evict(evicted)
        agree()
