"""A deployment's `min_available`: preemption (tidal sharing included) never takes it
below its budget, and takes what the budget allows."""

from __future__ import annotations

import dataclasses

from cloud.scheduler import Allocation, Plan, Tenant

from .builders import deployment, gpu_node, job, nodes_of, plan_for, running


def replicas(
    deployment_id: str, count: int, *, min_available: int, priority: str = "p1"
) -> list[Allocation]:
    """`count` replicas of one deployment, one per node n0.., one GPU each."""
    return [
        dataclasses.replace(
            running(
                f"{deployment_id}-{i}",
                f"n{i}",
                1,
                work_id=deployment_id,
                work_kind="inference",
                priority=priority,  # type: ignore[arg-type]
                expected_end=None,
            ),
            min_available=min_available,
        )
        for i in range(count)
    ]


def evicted(plan: Plan) -> list[str]:
    return sorted(p.allocation_id for p in plan.preemptions)


def full_nodes(count: int) -> list:  # type: ignore[type-arg]
    return [gpu_node(f"n{i}", 1) for i in range(count)]


def test_preemption_never_takes_a_deployment_below_min_available() -> None:
    # Three replicas, a budget of two: one of them may go, and only one.
    serving = replicas("detector", 3, min_available=2)
    plan = plan_for(
        full_nodes(3), [job("a", 1, priority="p0"), job("b", 1, priority="p0")], serving
    )
    assert len(evicted(plan)) == 1
    placed = [work for work in ("a", "b") if nodes_of(plan, work)]
    assert placed == ["a"]
    waiting = {p.work_id: p for p in plan.pending}
    assert "b" in waiting


def test_a_budget_equal_to_the_replicas_protects_every_replica() -> None:
    serving = replicas("detector", 2, min_available=2)
    plan = plan_for(full_nodes(2), [job("a", 1, priority="p0")], serving)
    assert evicted(plan) == []
    assert nodes_of(plan, "a") == []


def test_without_a_budget_every_replica_may_go() -> None:
    serving = replicas("detector", 2, min_available=0)
    plan = plan_for(
        full_nodes(2), [job("a", 1, priority="p0"), job("b", 1, priority="p0")], serving
    )
    assert evicted(plan) == ["detector-0", "detector-1"]


def test_two_replicas_on_one_node_are_not_both_taken_past_the_budget() -> None:
    # Two replicas share a 2-GPU node, a third runs elsewhere; a 2-GPU job may take
    # the shared node only by evicting both, which would leave one replica (budget 2).
    serving = [
        dataclasses.replace(
            running(
                f"detector-{i}",
                node,
                1,
                work_id="detector",
                work_kind="inference",
                priority="p1",
                expected_end=None,
            ),
            min_available=2,
        )
        for i, node in enumerate(("n0", "n0", "n1"))
    ]
    nodes = [gpu_node("n0", 2), gpu_node("n1", 1)]
    plan = plan_for(nodes, [job("big", 2, priority="p0")], serving)
    assert evicted(plan) == []
    assert nodes_of(plan, "big") == []


def test_tidal_training_takes_only_the_replicas_the_budget_allows() -> None:
    # Training reclaiming GPUs its tenant lent to a borrowing deployment (tidal
    # sharing across tenants) stops at the deployment's budget too.
    tenants = [
        Tenant(name="training", cohort="gpus", nominal={"gpu": 4}),
        Tenant(name="serving", cohort="gpus", nominal={"gpu": 0}),
    ]
    serving = [
        dataclasses.replace(alloc, tenant="serving")
        for alloc in replicas("detector", 4, min_available=3, priority="p1")
    ]
    queue = [job(f"train-{i}", 1, tenant="training", priority="p2") for i in range(4)]
    plan = plan_for(full_nodes(4), queue, serving, tenants)
    assert len(evicted(plan)) == 1
    assert all(p.reason == "reclaim" for p in plan.preemptions)
    assert sum(1 for i in range(4) if nodes_of(plan, f"train-{i}")) == 1


def test_a_deployment_with_a_budget_still_preempts_for_itself() -> None:
    # The budget protects the deployment's replicas, not others' work from it.
    serving = replicas("detector", 1, min_available=1)
    plan = plan_for(
        [gpu_node("n0", 1), gpu_node("n1", 1)],
        [deployment("other", kinds=("gpu",), priority="p0", sites=("cloud",))],
        [*serving, running("batch", "n1", 1, priority="p2")],
    )
    assert evicted(plan) == ["batch"]
