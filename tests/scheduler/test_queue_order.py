"""Behaviour 1: priority class, then DRF share against quota, then submission time."""

from __future__ import annotations

from cloud.scheduler import Policy, Scheduler, Tenant, schedule

from .builders import NOW, gpu_node, job, plan_for, running, snapshot


def test_priority_class_comes_first() -> None:
    plan = plan_for(
        [gpu_node("n1")],
        [
            job("low", priority="p2", submitted_at=NOW - 900),
            job("high", priority="p0", submitted_at=NOW - 10),
            job("mid", priority="p1", submitted_at=NOW - 500),
        ],
    )
    assert plan.order == ("high", "mid", "low")


def test_lower_dominant_share_goes_first_within_a_class() -> None:
    tenants = [
        Tenant(name="busy", nominal={"gpu": 8}),
        Tenant(name="idle", nominal={"gpu": 8}),
    ]
    plan = plan_for(
        [gpu_node("n1"), gpu_node("n2")],
        [
            job("busy-old", tenant="busy", submitted_at=NOW - 900),
            job("idle-new", tenant="idle", submitted_at=NOW - 10),
        ],
        allocations=[running("r1", "n1", 6, tenant="busy", priority="p1")],
        tenants=tenants,
    )
    assert plan.order == ("idle-new", "busy-old")


def test_share_is_relative_to_quota() -> None:
    # Same usage, but "big" has four times the quota, so a smaller share.
    tenants = [Tenant(name="big", nominal={"gpu": 16}), Tenant(name="small", nominal={"gpu": 4})]
    plan = plan_for(
        [gpu_node("n1"), gpu_node("n2")],
        [
            job("s", tenant="small", submitted_at=NOW - 100),
            job("b", tenant="big", submitted_at=NOW),
        ],
        allocations=[
            running("r1", "n1", 2, tenant="big", priority="p1"),
            running("r2", "n2", 2, tenant="small", priority="p1"),
        ],
        tenants=tenants,
    )
    assert plan.order == ("b", "s")


def test_submission_time_breaks_ties_then_work_id() -> None:
    plan = plan_for(
        [gpu_node("n1")],
        [
            job("c", submitted_at=NOW - 5),
            job("b", submitted_at=NOW - 50),
            job("a", submitted_at=NOW - 5),
        ],
    )
    assert plan.order == ("b", "a", "c")


def test_shares_update_after_each_placement() -> None:
    # Equal tenants: their jobs alternate because each placement raises the share.
    tenants = [Tenant(name="x", nominal={"gpu": 8}), Tenant(name="y", nominal={"gpu": 8})]
    queue = [job(f"x{i}", tenant="x", submitted_at=NOW - 100 + i) for i in range(3)]
    queue += [job(f"y{i}", tenant="y", submitted_at=NOW - 50 + i) for i in range(3)]
    plan = plan_for([gpu_node("n1"), gpu_node("n2")], queue, tenants=tenants)
    assert plan.order == ("x0", "y0", "x1", "y1", "x2", "y2")


def test_starvation_guard_puts_old_work_first_in_its_class() -> None:
    tenants = [Tenant(name="busy", nominal={"gpu": 8}), Tenant(name="idle", nominal={"gpu": 8})]
    queue = [
        job("ancient", tenant="busy", submitted_at=NOW - 7200),
        job("fresh", tenant="idle", submitted_at=NOW - 5),
    ]
    allocations = [running("r1", "n1", 6, tenant="busy", priority="p1")]
    nodes = [gpu_node("n1"), gpu_node("n2")]
    guarded = plan_for(nodes, queue, allocations, tenants, Policy(starvation_guard_s=3600))
    plain = plan_for(nodes, queue, allocations, tenants, Policy(starvation_guard_s=None))
    assert guarded.order == ("ancient", "fresh")
    assert plain.order == ("fresh", "ancient")


def test_a_bounded_pass_decides_the_head_of_the_queue_in_order_and_names_the_rest() -> None:
    """A quick pass (`max_decisions`) decides the first items in queue order, exactly as
    a full pass would decide them, and leaves the rest undecided, not pending."""
    queue = [
        job("p2-old", priority="p2", submitted_at=NOW - 900),
        job("p0", priority="p0", submitted_at=NOW - 10),
        *(job(f"p1-{index}", gpus=4, submitted_at=NOW - 500 + index) for index in range(4)),
    ]
    whole = schedule(snapshot([gpu_node("n1")], queue), Policy())
    head = schedule(snapshot([gpu_node("n1")], queue), Policy(), max_decisions=3)
    assert head.order == whole.order[:3] == ("p0", "p1-0", "p1-1")
    assert head.placements == tuple(p for p in whole.placements if p.work_id in head.order)
    assert head.undecided == frozenset(whole.order[3:])
    assert {p.work_id for p in head.pending}.isdisjoint(head.undecided)
    assert not whole.undecided


def test_deciding_until_some_work_is_decided_gives_it_the_whole_pass_s_decision() -> None:
    """What a baseline counterfactual needs (cloud/green/accounting.py): the decisions of
    a few items, without deciding the queue behind them."""
    queue = [job(f"j{index}", gpus=4, submitted_at=NOW - 100 + index) for index in range(6)]
    whole = schedule(snapshot([gpu_node("n1")], queue), Policy())
    until = Scheduler(snapshot([gpu_node("n1")], queue), Policy()).run_until(["j1", "j2"])
    assert until.order == whole.order[:3]
    for work_id in ("j1", "j2"):
        assert until.placements_for(work_id) == whole.placements_for(work_id)
        assert until.pending_for(work_id) == whole.pending_for(work_id)
