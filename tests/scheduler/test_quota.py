"""Tenants and quotas: nominal, borrowing within a limit, cohorts, explanations."""

from __future__ import annotations

import pytest

from cloud.scheduler import Allocation, Policy, Snapshot, Tenant, Work, schedule
from cloud.scheduler.plan import Plan

from .builders import NOW, deployment, gpu_node, job, plan_for, running

NODES = [gpu_node(f"n{i}") for i in range(4)]  # 32 GPUs


def test_within_nominal_is_admitted_not_borrowed() -> None:
    tenants = [Tenant(name="a", cohort="c", nominal={"gpu": 8})]
    plan = plan_for(NODES, [job("j", 8, tenant="a")], tenants=tenants)
    assert [p.borrowed for p in plan.placements] == [False]


def test_borrowing_idle_cohort_capacity_up_to_the_limit() -> None:
    tenants = [
        Tenant(name="a", cohort="c", nominal={"gpu": 8}, borrowing_limit={"gpu": 8}),
        Tenant(name="b", cohort="c", nominal={"gpu": 16}),
    ]
    queue = [job(f"j{i}", 8, tenant="a", submitted_at=i) for i in range(3)]
    plan = plan_for(NODES, queue, tenants=tenants)
    assert [p.work_id for p in plan.placements] == ["j0", "j1"]
    assert [p.borrowed for p in plan.placements] == [False, True]
    pending = plan.pending_for("j2")
    assert pending is not None
    assert pending.code == "quota"
    assert pending.quota is not None
    assert (pending.quota.usage, pending.quota.nominal, pending.quota.borrowing_limit) == (16, 8, 8)
    assert "Over quota: tenant a uses 16 GPU (nominal 8, borrowing limit 8" in pending.message


def test_borrowing_only_what_the_cohort_has_idle() -> None:
    tenants = [
        Tenant(name="a", cohort="c", nominal={"gpu": 8}),  # no limit: whatever is idle
        Tenant(name="b", cohort="c", nominal={"gpu": 8}),
    ]
    allocations = [running("b1", "n0", 6, tenant="b", priority="p1", preemptible=False)]
    queue = [job(f"j{i}", 2, tenant="a", submitted_at=i) for i in range(6)]
    plan = plan_for(NODES, queue, allocations, tenants=tenants)
    # cohort nominal 16, b uses 6: a gets 10 (8 nominal + 2 borrowed), not more.
    assert len(plan.placements) == 5


def test_tenant_without_cohort_never_exceeds_nominal() -> None:
    tenants = [Tenant(name="a", nominal={"gpu": 4})]
    plan = plan_for(
        NODES, [job("j1", 4, tenant="a"), job("j2", 1, tenant="a", submitted_at=1)], tenants=tenants
    )
    assert [p.work_id for p in plan.placements] == ["j1"]
    assert plan.pending_for("j2") is not None


def test_unmanaged_tenants_have_no_quota() -> None:
    tenants = [Tenant(name="a", nominal={"gpu": 4})]
    plan = plan_for(NODES, [job("j", 8, workers=4, tenant="someone-else")], tenants=tenants)
    assert len(plan.placements) == 4


def test_a_gangs_quota_reason_counts_only_what_the_tenant_holds() -> None:
    # Two workers of 8, nominal 8 in a cohort whose other 8 are in use: the first worker
    # is admitted, the second cannot borrow, and the first is undone. Nothing of the
    # tenant runs, and the job asks for 16.
    tenants = [
        Tenant(name="research", cohort="lab", nominal={"gpu": 8}),
        Tenant(name="other", cohort="lab", nominal={"gpu": 8}),
    ]
    held = [running("o1", "n0", 8, tenant="other", priority="p0", preemptible=False)]
    plan = plan_for(NODES, [job("gang", 8, workers=2, tenant="research")], held, tenants)
    assert plan.placements == ()
    (pending,) = plan.pending
    assert pending.code == "quota"
    assert pending.quota is not None
    assert (pending.quota.usage, pending.quota.requested, pending.quota.cohort_usage) == (
        0,
        16,
        8,
    )
    assert "Over quota: tenant research uses 0 GPU (nominal 8" in pending.message
    assert "cohort lab 8/16) and asks for 16 more" in pending.message


def test_a_lowered_quota_evicts_no_more_than_the_new_job_takes() -> None:
    # The tenant's quota went from 4 to 2 while it ran 2 jobs of 2 GPUs. Nothing is
    # evicted for the lowering; a higher-priority job of its own takes the place of one
    # of them (what it would have done at its quota), never of both.
    tenants = [Tenant(name="a", nominal={"gpu": 2})]
    held = [running(f"r{i}", f"n{i}", 2, tenant="a", priority="p2") for i in range(2)]
    assert plan_for(NODES, [], held, tenants).preemptions == ()
    plan = plan_for(NODES, [job("urgent", 1, tenant="a", priority="p0")], held, tenants)
    assert [p.work_id for p in plan.placements] == ["urgent"]
    assert len(plan.preemptions) == 1
    assert {p.reason for p in plan.preemptions} == {"quota"}


def _gpus_after(plan: Plan, allocations: list[Allocation], tenant: str) -> int:
    evicted = {p.allocation_id for p in plan.preemptions}
    kept = sum(a.accelerators for a in allocations if a.tenant == tenant)
    kept -= sum(
        a.accelerators for a in allocations if a.allocation_id in evicted and a.tenant == tenant
    )
    return kept + sum(p.accelerators for p in plan.placements if p.tenant == tenant)


def test_reclaiming_from_a_borrower_never_takes_a_gang_past_the_cohorts_total() -> None:
    # c (nominal 4) holds 2 and asks for 2 × 2: its first worker reclaims b's borrowed 4,
    # its second would take c to 6 in a cohort whose total is 4. The cohort held 6 when
    # the pass started (b's borrowing), which is no room for c to grow into: the gang
    # waits, and b, whose GPUs c cannot use, keeps them.
    tenants = [
        Tenant(name="b", cohort="co", nominal={"gpu": 0}),
        Tenant(name="c", cohort="co", nominal={"gpu": 4}),
    ]
    nodes = [gpu_node("n0", 4), gpu_node("n1", 4)]
    held = [
        running("borrowed", "n0", 4, tenant="b", priority="p2"),
        running("c-old", "n1", 2, tenant="c", priority="p1"),
    ]
    gang = job("c-new", 2, workers=2, tenant="c", topology="any")
    plan = plan_for(nodes, [gang], held, tenants)
    assert plan.placements == ()
    assert plan.preemptions == ()
    pending = plan.pending_for("c-new")
    assert pending is not None
    assert pending.code == "quota"
    # Its figures are the cluster's as it stands, not the discarded attempt's (which
    # had evicted b's 4 for the first worker: "cohort co 2/4").
    assert pending.quota is not None
    assert (pending.quota.usage, pending.quota.cohort_usage) == (2, 6)
    assert "cohort co 6/4" in pending.message


def test_room_another_eviction_frees_in_an_over_full_cohort_is_not_borrowed() -> None:
    # a's quota was lowered (it holds 6 of a nominal 4; the cohort 8 of 4). A p0 job of
    # another team evicts a's 6: the cohort is then at 2 of 4, and b (nominal 0, holding
    # 2) may grow to the cohort's total, no further: its new 4 take the place of its own
    # lower-priority 2.
    tenants = [
        Tenant(name="a", cohort="co", nominal={"gpu": 4}),
        Tenant(name="b", cohort="co", nominal={"gpu": 0}),
    ]
    nodes = [gpu_node("n0", 8), gpu_node("n1", 8)]
    held = [
        running("old", "n0", 6, tenant="a", priority="p2"),
        running("b1", "n1", 2, tenant="b", priority="p1"),
    ]
    queue: list[Work] = [
        job("urgent", 8, tenant="ops", priority="p0", submitted_at=-20),
        job("greedy", 4, tenant="b", priority="p0", submitted_at=-10),
    ]
    plan = plan_for(nodes, queue, held, tenants)
    assert {p.work_id for p in plan.placements} == {"urgent", "greedy"}
    assert _gpus_after(plan, held, "a") + _gpus_after(plan, held, "b") <= 4


def _with_running_limits(
    queue: list[Work], allocations: list[Allocation], limits: dict[str, int]
) -> Plan:
    snapshot = Snapshot.build(
        now=NOW, nodes=NODES, allocations=allocations, queue=queue, running_limits=limits
    )
    return schedule(snapshot, Policy())


def test_max_running_lets_no_more_work_items_hold_placements() -> None:
    held = [running("r1", "n0", 1, tenant="a", priority="p1")]
    queue: list[Work] = [job(f"j{i}", 1, tenant="a", submitted_at=i) for i in range(3)]
    queue.append(job("other", 1, tenant="b", submitted_at=9))
    plan = _with_running_limits(queue, held, {"a": 2})
    assert sorted(p.work_id for p in plan.placements) == ["j0", "other"]
    waiting = {p.work_id: p for p in plan.pending}
    assert set(waiting) == {"j1", "j2"}
    for pending in waiting.values():
        assert pending.code == "quota"
        assert pending.message == (
            "Over quota: tenant a runs 2 jobs and deployments, its max_running of 2; this "
            "waits until one of them ends."
        )
    assert plan.preemptions == ()  # a higher priority is no reason either
    urgent = _with_running_limits([job("p0", 1, tenant="a", priority="p0")], held, {"a": 1})
    assert (urgent.placements, urgent.preemptions) == ((), ())


def test_max_running_still_places_the_missing_replicas_of_a_running_deployment() -> None:
    nodes = [gpu_node("n0"), gpu_node("n1")]  # a replica per node
    held = [running("d/0", "n0", 1, tenant="a", work_id="d", work_kind="inference", priority="p0")]
    missing = deployment("d", replicas=1, tenant="a", kinds=("gpu",), sites=("cloud",))
    snapshot = Snapshot.build(
        now=NOW, nodes=nodes, allocations=held, queue=[missing], running_limits={"a": 1}
    )
    plan = schedule(snapshot, Policy())
    assert [p.work_id for p in plan.placements] == ["d"]


# One node of 8 GPUs. In cohort lab, a (nominal 6) holds 7: 4 that cannot be evicted
# and a preemptible job of 3, which borrows 1 of b's nominal 2.
LAB_NODE = [gpu_node("n0")]
A_BORROWS_ONE = [
    running("a-fixed", "n0", 4, tenant="a", priority="p1", preemptible=False),
    running("a-job", "n0", 3, tenant="a", priority="p1"),
]


def _lab(idle_nominal: int) -> list[Tenant]:
    """a and b, and c holding nothing with ``idle_nominal``: with 0 the cohort's total is
    the node's 8, so b's first GPUs are a reclaim; with 2 the cohort has room for them
    and only the node is short (the preemption search reclaims there)."""
    return [
        Tenant(name="a", cohort="lab", nominal={"gpu": 6}),
        Tenant(name="b", cohort="lab", nominal={"gpu": 2}),
        Tenant(name="c", cohort="lab", nominal={"gpu": idle_nominal}),
    ]


@pytest.mark.parametrize("workers", [1, 2])
def test_work_beyond_its_tenants_nominal_quota_reclaims_nothing(workers: int) -> None:
    # b asks for 4 GPUs, as one worker or as a gang of 2 × 2: beyond its nominal 2
    # either way, so it may only borrow, and a's work is no reclaim of b's. A gang's
    # first worker alone (2 of nominal 2) must not make it a reclaim.
    gang = job("b-4", 4 // workers, workers=workers, tenant="b")
    plan = plan_for(LAB_NODE, [gang], A_BORROWS_ONE, _lab(0))
    assert plan.preemptions == ()
    assert plan.placements == ()
    pending = plan.pending_for("b-4")
    assert pending is not None
    assert pending.code == "quota"
    assert pending.message.startswith("Over quota: tenant b uses 0 GPU (nominal 2")
    assert "asks for 4 more" in pending.message


def test_a_gang_beyond_nominal_reclaims_nothing_where_only_the_node_is_short() -> None:
    # The cohort has room for the first worker (9 of 10), not the node: the search for
    # victims must not take a's job as a reclaim for it either.
    gang = job("b-4", 2, workers=2, tenant="b")
    plan = plan_for(LAB_NODE, [gang], A_BORROWS_ONE, _lab(2))
    assert plan.preemptions == ()
    assert plan.placements == ()
    assert plan.pending_for("b-4") is not None


@pytest.mark.parametrize("idle_nominal", [0, 2])
def test_a_gang_within_its_tenants_nominal_quota_reclaims_from_a_borrower(
    idle_nominal: int,
) -> None:
    # 2 × 1 is within b's nominal 2: its second worker takes back what a borrowed.
    plan = plan_for(
        LAB_NODE, [job("b-2", 1, workers=2, tenant="b")], A_BORROWS_ONE, _lab(idle_nominal)
    )
    assert [(p.allocation_id, p.reason) for p in plan.preemptions] == [("a-job", "reclaim")]
    assert len(plan.placements_for("b-2")) == 2


def test_a_deployment_whose_min_replicas_exceed_nominal_reclaims_nothing() -> None:
    # min_replicas 3 of 1 GPU each: it cannot run within b's nominal 2, so it reclaims
    # nothing (it would have evicted a's 3 for 2 replicas, then borrowed for the third).
    held = [
        running("a-fixed", "n0", 5, tenant="a", priority="p1", preemptible=False),
        running("a-job", "n0", 3, tenant="a", priority="p1"),
    ]
    serving = deployment(
        "b-serve",
        replicas=4,
        min_replicas=3,
        tenant="b",
        priority="p1",
        kinds=("gpu",),
        sites=("cloud",),
        max_replicas_per_node=4,  # all on the one node
    )
    plan = plan_for(LAB_NODE, [serving], held, _lab(0))
    assert plan.preemptions == ()
    assert plan.placements == ()
    pending = plan.pending_for("b-serve")
    assert pending is not None
    assert pending.code == "quota"


def test_a_deployment_reclaims_for_the_replicas_it_needs_within_nominal() -> None:
    # min_replicas 1: each replica within b's nominal 2 may take back what a borrowed.
    serving = deployment(
        "b-serve",
        replicas=2,
        min_replicas=1,
        tenant="b",
        priority="p1",
        kinds=("gpu",),
        sites=("cloud",),
        max_replicas_per_node=4,  # all on the one node
    )
    plan = plan_for(LAB_NODE, [serving], A_BORROWS_ONE, _lab(0))
    assert [(p.allocation_id, p.reason) for p in plan.preemptions] == [("a-job", "reclaim")]
    assert len(plan.placements_for("b-serve")) == 2
