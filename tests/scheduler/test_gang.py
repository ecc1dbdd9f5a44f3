"""Behaviour 4: gangs all-or-nothing via a tentative Statement; replica spread."""

from __future__ import annotations

import numpy as np

from cloud.scheduler import Scheduler, Tenant
from cloud.scheduler.state import ClusterState
from cloud.scheduler.statement import Statement

from .builders import (
    NOW,
    deployment,
    edge_node,
    gpu_node,
    job,
    nodes_of,
    plan_for,
    running,
    snapshot,
)


def test_gang_spans_nodes_when_it_fits() -> None:
    plan = plan_for([gpu_node(f"n{i}") for i in range(4)], [job("gang", 8, workers=3)])
    assert sorted(nodes_of(plan, "gang")) == ["n0", "n1", "n2"]
    assert [p.member for p in plan.placements] == [0, 1, 2]


def test_gang_is_all_or_nothing() -> None:
    nodes = [gpu_node(f"n{i}") for i in range(3)]
    allocations = [running("r", "n2", 1, priority="p0", preemptible=False)]
    plan = plan_for(
        nodes, [job("gang", 8, workers=3), job("small", 1, submitted_at=1)], allocations
    )
    assert plan.placements_for("gang") == ()
    pending = plan.pending_for("gang")
    assert pending is not None
    assert "only 2 of 3 workers fit" in pending.message
    # The discarded tentative members left nothing behind: "small" saw all nodes free.
    assert nodes_of(plan, "small") == ["n2"]


def test_gang_workers_may_share_a_node() -> None:
    plan = plan_for([gpu_node("n0")], [job("gang", 2, workers=4)])
    assert nodes_of(plan, "gang") == ["n0"] * 4


def test_statement_discard_restores_state_exactly() -> None:
    snap = snapshot(
        [gpu_node("n0"), gpu_node("n1")], allocations=[running("r", "n0", 3, priority="p2")]
    )
    state = ClusterState(snap)
    free_before = [f.copy() for f in state.free]
    usage_before = {t: list(u) for t, u in state.tenant_usage.items()}
    stmt = Statement(state)
    stmt.evict("r", "priority")
    stmt.allocate(running("x", "n0", 8, tenant="t"), 0)
    stmt.discard()
    stmt.discard()  # idempotent
    assert all(np.array_equal(a, b) for a, b in zip(free_before, state.free, strict=True))
    assert {t: u for t, u in state.tenant_usage.items() if any(u)} == usage_before
    assert set(state.allocations) == {"r"}
    assert state.evictable_accelerators_total[0][2] == 3


def test_replicas_spread_across_nodes_and_regions() -> None:
    nodes = [
        edge_node("a1", region="a", count=4),
        edge_node("a2", region="a", count=4),
        edge_node("b1", region="b", count=4),
        edge_node("c1", region="c", count=4),
    ]
    plan = plan_for(nodes, [deployment("d", replicas=3, kinds=("npu",))])
    placed = nodes_of(plan, "d")
    assert len(set(placed)) == 3  # one replica per node
    regions = {n[0] for n in placed}
    assert regions == {"a", "b", "c"}


def test_spread_follows_traffic() -> None:
    nodes = [edge_node(f"{r}{i}", region=r) for r in "ab" for i in range(3)]
    plan = plan_for(
        nodes, [deployment("d", replicas=3, kinds=("npu",), traffic_by_region={"a": 0.6, "b": 0.4})]
    )
    regions = sorted(n[0] for n in nodes_of(plan, "d"))
    assert regions == ["a", "a", "b"]


def test_existing_replicas_count_for_spread() -> None:
    nodes = [edge_node("a1", region="a"), edge_node("a2", region="a"), edge_node("b1", region="b")]
    existing = [
        running(
            "d/0",
            "a1",
            1,
            kind="npu",
            work_id="d",
            work_kind="inference",
            expected_end=None,
            priority="p0",
        )
    ]
    plan = plan_for(nodes, [deployment("d", replicas=1, kinds=("npu",))], existing)
    assert nodes_of(plan, "d") == ["b1"]
    assert plan.placements[0].allocation_id == "d/1"


def test_partial_deployment_with_min_replicas() -> None:
    plan = plan_for(
        [edge_node("e1"), edge_node("e2")],
        [deployment("d", replicas=3, min_replicas=2, kinds=("npu",))],
    )
    assert len(plan.placements_for("d")) == 2
    pending = plan.pending_for("d")
    assert pending is not None
    assert pending.code == "partial"
    assert (pending.members_placed, pending.members_needed) == (2, 1)


def test_scheduler_steps_one_decision_at_a_time() -> None:
    sched = Scheduler(snapshot([gpu_node("n0")], [job("a", 1), job("b", 1, submitted_at=1)]))
    assert sched.step()
    assert [p.work_id for p in sched.plan().placements] == ["a"]
    assert sched.step()
    assert not sched.step()
    assert len(sched.plan().placements) == 2


def _state_matches_plan(sched: Scheduler) -> None:
    """Everything the scheduler's working state holds is in the plan, and nothing more."""
    plan = sched.plan()
    evicted = {p.allocation_id for p in plan.preemptions}
    running_ids = {a.allocation_id for a in sched.snapshot.allocations}
    expected = (running_ids - evicted) | {p.allocation_id for p in plan.placements}
    assert set(sched.state.allocations) == expected


def test_statement_rolls_back_to_a_mark_and_keeps_earlier_changes() -> None:
    snap = snapshot(
        [gpu_node("n0"), gpu_node("n1")],
        allocations=[running("r0", "n0", 2), running("r1", "n1", 2)],
    )
    state = ClusterState(snap)
    stmt = Statement(state)
    stmt.allocate(running("keep", "n0", 1, tenant="t"), 0)
    mark = stmt.mark()
    stmt.evict("r1", "priority")
    stmt.allocate(running("drop", "n1", 8, tenant="t"), 1)
    stmt.rollback_to(mark)
    assert set(state.allocations) == {"r0", "r1", "keep"}
    assert [a.allocation_id for a, _ in stmt.allocated] == ["keep"]
    assert stmt.evicted == []
    assert int(state.free[0][1]) == 6
    stmt.discard()
    assert set(state.allocations) == {"r0", "r1"}


def test_a_restated_member_is_what_the_state_holds_and_is_undone_like_any() -> None:
    snap = snapshot([gpu_node("n0"), gpu_node("n1")], allocations=[running("r1", "n1", 2)])
    state = ClusterState(snap)
    free_before = [f.copy() for f in state.free]
    stmt = Statement(state)
    stmt.allocate(running("m0", "n0", 4, tenant="t", expected_end=NOW + 1800), 0)
    stmt.evict("r1", "priority")
    stmt.allocate(running("m1", "n1", 4, tenant="t", expected_end=NOW + 3600), 1)
    stmt.restate(running("m0", "n0", 4, tenant="t", expected_end=NOW + 3600), 0)
    assert state.allocations["m0"].expected_end == NOW + 3600
    assert [(a.allocation_id, a.expected_end) for a, _ in stmt.allocated] == [
        ("m0", NOW + 3600),
        ("m1", NOW + 3600),
    ]
    assert int(state.free[0][0]) == 4
    stmt.discard()
    assert set(state.allocations) == {"r1"}
    assert all(np.array_equal(a, b) for a, b in zip(free_before, state.free, strict=True))


def test_a_member_whose_quota_cannot_be_released_leaves_nothing_behind() -> None:
    # T (nominal 2, no cohort) runs a p2 replica. D wants 3 replicas, accepts 1: the
    # second fits by evicting T's own p2 work, the third cannot be brought within quota.
    tenants = [Tenant(name="T", nominal={"gpu": 2})]
    low = running(
        "t-low", "n1", 1, tenant="T", priority="p2", work_kind="inference", expected_end=None
    )
    d = deployment(
        "D", tenant="T", replicas=3, min_replicas=1, kinds=("gpu",), max_replicas_per_node=3
    )
    e = deployment("E", tenant="U", priority="p1", kinds=("gpu",), accelerators_per_replica=2)
    sched = Scheduler(snapshot([gpu_node("n1", 4, site="edge")], [d, e], [low], tenants))
    plan = sched.run()
    assert [p.allocation_id for p in plan.placements_for("D")] == ["D/0", "D/1"]
    _state_matches_plan(sched)
    assert sched.state.usage("T", 0) == 2
    # The GPUs the phantom third replica held are really free: E gets them.
    assert nodes_of(plan, "E") == ["n1"]


def test_victims_of_a_rolled_back_member_are_not_evicted() -> None:
    # T may run one GPU only; D's second replica could evict U's work on n2, but could
    # never be within quota, so nothing may be evicted for it.
    nodes = [gpu_node("n1", 1, site="edge"), gpu_node("n2", 1, site="edge")]
    u = running(
        "u-low", "n2", 1, tenant="U", priority="p2", work_kind="inference", expected_end=None
    )
    d = deployment("D", tenant="T", replicas=2, min_replicas=1, kinds=("gpu",))
    sched = Scheduler(snapshot(nodes, [d], [u], [Tenant(name="T", nominal={"gpu": 1})]))
    plan = sched.run()
    assert nodes_of(plan, "D") == ["n1"]
    assert plan.preemptions == ()
    _state_matches_plan(sched)


def test_a_replica_limit_does_not_strand_later_jobs_of_the_same_shape() -> None:
    # A fills both nodes (one replica each) and cannot place its third replica; B has
    # the same shape and must still see the GPUs that are free on both nodes.
    nodes = [gpu_node("n1", 4, site="edge"), gpu_node("n2", 4, site="edge")]
    a = deployment("A", replicas=3, min_replicas=2, kinds=("gpu",), submitted_at=0)
    b = deployment("B", replicas=1, kinds=("gpu",), submitted_at=1)
    plan = plan_for(nodes, [a, b])
    assert sorted(nodes_of(plan, "A")) == ["n1", "n2"]
    assert len(nodes_of(plan, "B")) == 1
    assert plan.pending_for("B") is None


def test_gang_keeps_to_one_speed_class_when_one_holds_it_as_fast() -> None:
    # Mixed, the gang would run at the V100s' pace and hold the H100s that long.
    nodes = [
        gpu_node("h100", 2, model="H100", speed=2.5),
        gpu_node("v100", 4, model="V100", speed=0.45),
    ]
    plan = plan_for(nodes, [job("gang", 1, workers=4)])
    assert nodes_of(plan, "gang") == ["v100"] * 4
    assert len({p.expected_end for p in plan.placements}) == 1
    # The H100s stay free for the next job.
    plan = plan_for(nodes, [job("gang", 1, workers=4), job("next", 2, submitted_at=1)])
    assert nodes_of(plan, "next") == ["h100"]


def test_gang_mixes_classes_rather_than_run_slower() -> None:
    nodes = [
        gpu_node("h100", 4, model="H100", speed=2.5),
        gpu_node("a100", 2, model="A100", speed=1.0),
        gpu_node("v100", 8, model="V100", speed=0.45),
    ]
    # No class as fast as the mixed placement (A100 pace) holds five workers; the
    # V100s could, at less than half the pace.
    plan = plan_for(nodes, [job("gang", 1, workers=5)])
    assert sorted(nodes_of(plan, "gang")) == ["a100"] + ["h100"] * 4
    # In lockstep at the A100's pace: the H100 workers end with the gang.
    assert {p.expected_end for p in plan.placements} == {NOW + 3600.0}


def test_one_speed_class_among_many_faster_nodes() -> None:
    # More faster nodes than the scheduler rejects one by one before it filters them all.
    nodes = [gpu_node(f"h{i:02}", 1, model="H100", speed=2.5) for i in range(17)]
    nodes += [gpu_node(f"v{i:02}", 1, model="V100", speed=0.45) for i in range(18)]
    plan = plan_for(nodes, [job("gang", 1, workers=18)])
    assert sorted(nodes_of(plan, "gang")) == [f"v{i:02}" for i in range(18)]
