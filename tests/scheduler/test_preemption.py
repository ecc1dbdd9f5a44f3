"""Behaviour 5: minimal, ordered preemption of strictly lower-priority work; reclaim."""

from __future__ import annotations

import dataclasses

import pytest

from cloud.scheduler import AcceleratorPool, Plan, Policy, Tenant

from .builders import GIB, NOW, deployment, edge_node, gpu_node, job, nodes_of, plan_for, running


def victims(plan: Plan) -> list[str]:
    return [p.allocation_id for p in plan.preemptions]


def test_minimal_set_after_reprieve() -> None:
    allocations = [
        running("late-2", "n0", 2, started_at=NOW - 100),
        running("mid-4", "n0", 4, started_at=NOW - 200),
        running("early-2", "n0", 2, started_at=NOW - 300),
    ]
    plan = plan_for([gpu_node("n0")], [job("j", 4, priority="p1")], allocations)
    # Greedy order takes late-2 then mid-4; the reprieve gives late-2 back.
    assert victims(plan) == ["mid-4"]
    assert nodes_of(plan, "j") == ["n0"]
    assert plan.preemptions[0].reason == "priority"
    assert plan.preemptions[0].preempted_by == "j"


def test_node_with_fewest_victims_wins() -> None:
    allocations = [running(f"small-{i}", "n0", 2) for i in range(4)]
    allocations += [
        running("big", "n1", 4),
        running("pinned", "n1", 4, priority="p1", preemptible=False),
    ]
    plan = plan_for([gpu_node("n0"), gpu_node("n1")], [job("j", 4, priority="p1")], allocations)
    assert victims(plan) == ["big"]
    assert nodes_of(plan, "j") == ["n1"]


def test_victims_lowest_priority_then_latest_started() -> None:
    allocations = [
        running("p1-latest", "n0", 2, priority="p1", started_at=NOW - 10),
        running("p2-old", "n0", 2, priority="p2", started_at=NOW - 900),
        running("p2-new", "n0", 2, priority="p2", started_at=NOW - 100),
        running("p1-old", "n0", 2, priority="p1", started_at=NOW - 800),
    ]
    plan = plan_for([gpu_node("n0")], [job("j", 2, priority="p0")], allocations)
    assert victims(plan) == ["p2-new"]
    plan = plan_for([gpu_node("n0")], [job("j", 6, priority="p0")], allocations)
    assert sorted(victims(plan)) == ["p1-latest", "p2-new", "p2-old"]


def test_victim_order_ignores_borrowing_when_nothing_is_reclaimed() -> None:
    # The same order with a borrower present: its p1 work is not taken before p2 work.
    tenants = [
        Tenant(name="lender", cohort="lab", nominal={"gpu": 8}),
        Tenant(name="borrower", cohort="lab", nominal={"gpu": 0}),
    ]
    allocations = [
        running("borrower-p1", "n0", 2, tenant="borrower", priority="p1", started_at=NOW - 10),
        running("p2-old", "n0", 2, tenant="other", priority="p2", started_at=NOW - 900),
        running("p2-new", "n0", 2, tenant="other", priority="p2", started_at=NOW - 100),
        running("p1-old", "n0", 2, tenant="other", priority="p1", started_at=NOW - 800),
    ]
    plan = plan_for(
        [gpu_node("n0")], [job("j", 2, tenant="other", priority="p0")], allocations, tenants
    )
    assert victims(plan) == ["p2-new"]
    plan = plan_for(
        [gpu_node("n0")], [job("j", 6, tenant="other", priority="p0")], allocations, tenants
    )
    assert sorted(victims(plan)) == ["borrower-p1", "p2-new", "p2-old"]


def test_never_equal_or_higher_priority_nor_non_preemptible() -> None:
    allocations = [
        running("same", "n0", 4, priority="p1"),
        running("pinned", "n0", 4, priority="p2", preemptible=False),
    ]
    plan = plan_for([gpu_node("n0")], [job("j", 2, priority="p1")], allocations)
    assert plan.preemptions == ()
    pending = plan.pending_for("j")
    assert pending is not None
    assert pending.code == "capacity"
    assert "no lower-priority work to evict" in pending.message


def test_preemption_can_be_switched_off() -> None:
    allocations = [running("low", "n0", 8)]
    plan = plan_for(
        [gpu_node("n0")], [job("j", 8, priority="p0")], allocations, policy=Policy(preemption=False)
    )
    assert plan.preemptions == ()
    assert plan.placements == ()


def test_evicting_a_gang_worker_evicts_the_gang() -> None:
    allocations = [
        running("g/0", "n0", 8, work_id="g"),
        running("g/1", "n1", 8, work_id="g"),
    ]
    plan = plan_for([gpu_node("n0"), gpu_node("n1")], [job("j", 8, priority="p1")], allocations)
    assert sorted(victims(plan)) == ["g/0", "g/1"]
    assert len(plan.placements) == 1


def test_gang_preemption_is_all_or_nothing() -> None:
    allocations = [
        running("low", "n0", 8),
        running("pinned", "n1", 8, priority="p0", preemptible=False),
    ]
    plan = plan_for(
        [gpu_node("n0"), gpu_node("n1")], [job("gang", 8, workers=2, priority="p1")], allocations
    )
    assert plan.preemptions == ()  # evicting "low" alone would not seat both workers
    assert plan.placements == ()


COHORT = [
    Tenant(name="owner", cohort="lab", nominal={"gpu": 8}),
    Tenant(name="borrower", cohort="lab", nominal={"gpu": 8}),
]


def test_reclaim_evicts_borrowers_of_any_priority() -> None:
    allocations = [
        running("b-big", "n0", 8, tenant="borrower", priority="p1", started_at=NOW - 900),
        running("b-half", "n1", 4, tenant="borrower", priority="p1", started_at=NOW - 100),
        running("o-half", "n1", 4, tenant="owner", priority="p2"),
    ]
    # owner: 4 + 4 <= nominal 8, but the cohort (16) is full of the borrower's 12.
    plan = plan_for(
        [gpu_node("n0"), gpu_node("n1")],
        [job("mine", 4, tenant="owner", priority="p2")],
        allocations,
        tenants=COHORT,
    )
    assert victims(plan) == ["b-half"]
    assert plan.preemptions[0].reason == "reclaim"
    assert nodes_of(plan, "mine") == ["n1"]


def test_borrowers_are_evicted_before_lower_priority_owners_work() -> None:
    # Cohort lab: owner nominal 4, borrower nominal 2. n0 (6 GPUs) is full: the owner's
    # own p2 work (2) and the borrower's p1 work (4, of which 2 borrowed from the owner).
    tenants = [
        Tenant(name="owner", cohort="lab", nominal={"gpu": 4}),
        Tenant(name="borrower", cohort="lab", nominal={"gpu": 2}),
    ]
    allocations = [
        running("owner-p2", "n0", 2, tenant="owner", priority="p2", started_at=NOW - 10),
        running("borrowed", "n0", 4, tenant="borrower", priority="p1", started_at=NOW - 900),
    ]
    # The owner asks for 2 within its nominal 4: the cohort (6) is over by the loan, so
    # this is a reclaim, and the borrower goes first although the owner's work is p2.
    plan = plan_for(
        [gpu_node("n0", 6)],
        [job("mine", 2, tenant="owner", priority="p1")],
        allocations,
        tenants=tenants,
    )
    assert victims(plan) == ["borrowed"]
    assert plan.preemptions[0].reason == "reclaim"
    assert nodes_of(plan, "mine") == ["n0"]


def test_borrowing_does_not_make_work_a_victim_outside_reclaim() -> None:
    # B borrows in cohort c; D is unmanaged p2 work. E (unmanaged, p0) is not reclaiming
    # anything, so victims follow priority: the p2 work goes, the borrower's p1 stays.
    tenants = [
        Tenant(name="B", cohort="c", nominal={"gpu": 0}),
        Tenant(name="F", cohort="c", nominal={"gpu": 4}),
    ]
    allocations = [
        running("X", "n1", 1, tenant="B", priority="p1"),
        running("Y", "n1", 1, tenant="D", priority="p2"),
    ]
    plan = plan_for(
        [gpu_node("n1", 2)], [job("J", 1, tenant="E", priority="p0")], allocations, tenants
    )
    assert victims(plan) == ["Y"]
    assert plan.preemptions[0].reason == "priority"


def test_preemption_frees_host_memory_when_it_is_the_obstacle() -> None:
    # 7 of 8 GPUs are free, but the p2 job holds all the host memory.
    low = running("low", "n1", 1, priority="p2", host_memory_bytes=100 * GIB)
    hi = job("hi", 1, priority="p0", host_memory_bytes=50 * GIB)
    plan = plan_for([gpu_node("n1", 8, host_memory_gib=100)], [hi], [low])
    assert victims(plan) == ["low"]
    assert nodes_of(plan, "hi") == ["n1"]


def test_host_memory_of_other_kinds_work_can_be_freed() -> None:
    # The host memory is held by lower-priority CPU work on the same node.
    node = gpu_node("n1", 8, host_memory_gib=64)
    node = dataclasses.replace(
        node, pools=(*node.pools, AcceleratorPool(kind="cpu", count=16, model="x86"))
    )
    cpu_low = running("cpu-low", "n1", 4, kind="cpu", priority="p2", host_memory_bytes=64 * GIB)
    plan = plan_for([node], [job("hi", 1, priority="p1", host_memory_bytes=32 * GIB)], [cpu_low])
    assert victims(plan) == ["cpu-low"]
    assert nodes_of(plan, "hi") == ["n1"]


@pytest.mark.parametrize("blocked", [15, 16, 40])
def test_preemption_looks_past_nodes_it_cannot_use(blocked: int) -> None:
    # The nodes that need the least freed all hold the group J avoids; only "z" is usable.
    nodes, allocations = [], []
    for i in range(blocked):
        node_id = f"a{i:02d}"
        nodes.append(gpu_node(node_id, 8))
        allocations.append(
            running(f"g{i}", node_id, 1, group="g", preemptible=False, priority="p1")
        )
        allocations.append(running(f"low{i}", node_id, 7, priority="p2"))
    nodes.append(gpu_node("z", 8))
    allocations.append(running("lowz", "z", 8, priority="p2"))
    plan = plan_for(nodes, [job("J", 1, priority="p0", anti_affinity_groups=("g",))], allocations)
    assert nodes_of(plan, "J") == ["z"]
    assert victims(plan) == ["lowz"]


def test_preemption_looks_past_nodes_at_their_replica_limit() -> None:
    # d already has a replica on each of 20 nodes that need little freed; "z" needs more.
    nodes, allocations = [], []
    for i in range(20):
        node_id = f"a{i:02d}"
        nodes.append(edge_node(node_id, count=2))
        allocations.append(
            running(
                f"d/{i}",
                node_id,
                1,
                kind="npu",
                work_id="d",
                tenant="team-a",
                priority="p0",
                work_kind="inference",
                expected_end=None,
            )
        )
        allocations.append(
            running(f"low{i}", node_id, 1, kind="npu", work_kind="inference", expected_end=None)
        )
    nodes.append(edge_node("z", count=2))
    allocations.append(
        running("lowz", "z", 2, kind="npu", work_kind="inference", expected_end=None)
    )
    plan = plan_for(nodes, [deployment("d", kinds=("npu",))], allocations)
    assert nodes_of(plan, "d") == ["z"]
    assert victims(plan) == ["lowz"]


def test_training_never_evicts_p0_inference_even_to_reclaim() -> None:
    tenants = [
        Tenant(name="owner", cohort="lab", nominal={"npu": 1}),
        Tenant(name="borrower", cohort="lab", nominal={"npu": 0}),
    ]
    serving = [
        running(
            "serving",
            "e1",
            1,
            kind="npu",
            tenant="borrower",
            priority="p0",
            work_kind="inference",
            expected_end=None,
        )
    ]
    training = job(
        "train", 1, tenant="owner", priority="p0", accelerator_kind="npu", sites=("edge",)
    )
    plan = plan_for([edge_node("e1")], [training], serving, tenants=tenants)
    assert plan.preemptions == ()
    # An inference deployment of the owner may reclaim it.
    plan = plan_for(
        [edge_node("e1")],
        [deployment("mine", tenant="owner", kinds=("npu",))],
        serving,
        tenants=tenants,
    )
    assert victims(plan) == ["serving"]


def test_own_lower_priority_work_makes_room_in_quota() -> None:
    tenants = [Tenant(name="solo", nominal={"gpu": 8})]
    allocations = [running("mine-low", "n0", 8, tenant="solo", priority="p2")]
    plan = plan_for(
        [gpu_node("n0"), gpu_node("n1")],
        [job("mine-high", 8, tenant="solo", priority="p1")],
        allocations,
        tenants=tenants,
    )
    assert victims(plan) == ["mine-low"]
    assert plan.preemptions[0].reason == "quota"
    assert len(plan.placements) == 1
