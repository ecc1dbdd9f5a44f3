"""Deadline rescue (``Policy.deadline_preemption``): a job that would miss its deadline
or maximum delay evicts checkpointing work without a deadline of its own, and only then."""

from __future__ import annotations

import dataclasses

from cloud.scheduler import Allocation, Plan, Policy, TrainingJob

from .builders import NOW, gpu_node, job, nodes_of, plan_for, running

HOUR = 3600.0
RESCUE = Policy(deadline_preemption=True)


def held(
    allocation_id: str,
    node_id: str,
    *,
    checkpointing: bool = True,
    deadline_bound: bool = False,
    priority: str = "p1",
    expected_end: float = NOW + 10 * HOUR,
    work_kind: str = "training",
) -> Allocation:
    """Every GPU of an 8-GPU node, held by one running job."""
    allocation = running(
        allocation_id,
        node_id,
        8,
        priority=priority,  # type: ignore[arg-type]
        expected_end=expected_end,
        work_kind=work_kind,
    )
    return dataclasses.replace(
        allocation, checkpointing=checkpointing, deadline_bound=deadline_bound
    )


def late_job() -> TrainingJob:
    """8 GPUs for an hour, due in three: nothing frees in time on a busy fleet."""
    return job("late", 8, submitted_at=NOW - 60, deadline=NOW + 3 * HOUR)


def evicted(plan: Plan) -> list[tuple[str, str]]:
    return [(p.allocation_id, p.reason) for p in plan.preemptions]


def test_a_job_that_would_miss_its_deadline_evicts_checkpointing_work_without_one() -> None:
    plan = plan_for([gpu_node("n0")], [late_job()], [held("ckpt", "n0")], policy=RESCUE)
    assert nodes_of(plan, "late") == ["n0"]
    assert evicted(plan) == [("ckpt", "deadline")]
    assert plan.preemptions[0].preempted_by == "late"
    [placement] = plan.placements
    assert placement.expected_end is not None
    assert placement.expected_end <= NOW + 3 * HOUR


def test_the_rescue_is_off_unless_the_policy_asks_for_it() -> None:
    plan = plan_for([gpu_node("n0")], [late_job()], [held("ckpt", "n0")], policy=Policy())
    assert plan.placements == ()
    assert plan.preemptions == ()
    assert plan.pending[0].code == "capacity"


def test_no_eviction_while_capacity_frees_in_time() -> None:
    # The running job ends in an hour: the late job then runs an hour and ends by +2 h.
    frees = held("ckpt", "n0", expected_end=NOW + HOUR)
    plan = plan_for([gpu_node("n0")], [late_job()], [frees], policy=RESCUE)
    assert plan.preemptions == ()
    assert plan.pending[0].code == "capacity"
    # Ending past the latest start (+2 h) it would miss: then it is rescued.
    too_late = held("ckpt", "n0", expected_end=NOW + 2.5 * HOUR)
    plan = plan_for([gpu_node("n0")], [late_job()], [too_late], policy=RESCUE)
    assert evicted(plan) == [("ckpt", "deadline")]


def test_what_a_rescue_never_evicts() -> None:
    nodes = [gpu_node(f"n{i}") for i in range(4)]
    protected = [
        held("no-checkpoints", "n0", checkpointing=False),
        held("own-deadline", "n1", deadline_bound=True),
        held("higher-priority", "n2", priority="p0"),
        held("serving", "n3", work_kind="inference"),
    ]
    plan = plan_for(nodes, [late_job()], protected, policy=RESCUE)
    assert plan.placements == ()
    assert plan.preemptions == ()


def test_lower_priority_work_goes_first_as_ever() -> None:
    # Priority preemption is tried before a rescue and needs no deadline at all.
    nodes = [gpu_node("n0"), gpu_node("n1")]
    allocations = [held("same-priority", "n0"), held("p2", "n1", priority="p2")]
    plan = plan_for(nodes, [late_job()], allocations, policy=RESCUE)
    assert evicted(plan) == [("p2", "priority")]


def test_no_eviction_when_the_job_would_miss_anyway() -> None:
    # At a quarter of the speed the hour of work takes four: past the deadline in three.
    plan = plan_for(
        [gpu_node("slow", speed=0.25)], [late_job()], [held("ckpt", "slow")], policy=RESCUE
    )
    assert plan.preemptions == ()
    assert plan.placements == ()


def test_a_maximum_delay_is_rescued_like_a_deadline() -> None:
    # Submitted 10 min ago, it may wait 30: the running job ends in an hour.
    ends_in_an_hour = held("ckpt", "n0", expected_end=NOW + HOUR)
    waiting = job("delayed", 8, submitted_at=NOW - 600, max_delay_s=1800.0)
    plan = plan_for([gpu_node("n0")], [waiting], [ends_in_an_hour], policy=RESCUE)
    assert evicted(plan) == [("ckpt", "deadline")]
    # With two hours of delay allowed it waits for the hour instead.
    patient = job("delayed", 8, submitted_at=NOW - 600, max_delay_s=2 * HOUR)
    plan = plan_for([gpu_node("n0")], [patient], [ends_in_an_hour], policy=RESCUE)
    assert plan.preemptions == ()


def test_with_preemption_off_a_rescue_still_evicts_only_its_own_victims() -> None:
    nodes = [gpu_node("n0"), gpu_node("n1")]
    allocations = [held("p2-no-checkpoints", "n0", priority="p2", checkpointing=False)]
    allocations.append(held("ckpt", "n1"))
    policy = Policy(deadline_preemption=True, preemption=False)
    plan = plan_for(nodes, [late_job()], allocations, policy=policy)
    assert evicted(plan) == [("ckpt", "deadline")]
    assert nodes_of(plan, "late") == ["n1"]


def test_a_placed_job_records_whether_it_checkpoints_and_has_a_deadline() -> None:
    # What a later pass's rescue reads off the running work.
    checkpointing = job("a", 1, checkpoint_interval_s=1800.0)
    bound = job("b", 1, deadline=NOW + 5 * HOUR)
    plan = plan_for([gpu_node("n0")], [checkpointing, bound])
    by_work = {p.work_id: p.to_allocation() for p in plan.placements}
    assert by_work["a"].checkpointing
    assert not by_work["a"].deadline_bound
    assert by_work["b"].deadline_bound
    assert not by_work["b"].checkpointing


def test_a_job_too_late_on_any_node_evicts_nothing() -> None:
    # Due in 30 min with an hour of work: no eviction can save it.
    hopeless = job("hopeless", 8, submitted_at=NOW - 60, deadline=NOW + 1800)
    plan = plan_for([gpu_node("n0")], [hopeless], [held("ckpt", "n0")], policy=RESCUE)
    assert plan.preemptions == ()


def test_with_a_deadline_guard_the_rescue_waits_until_the_guard() -> None:
    # Latest start on the node: 2 h from now (due in 3 h, an hour's run). A 30-min guard
    # waits for capacity that may yet free early; a 2-hour guard rescues now.
    waits = Policy(deadline_preemption=True, deadline_guard_s=1800.0)
    plan = plan_for([gpu_node("n0")], [late_job()], [held("ckpt", "n0")], policy=waits)
    assert plan.preemptions == ()
    plan = plan_for(
        [gpu_node("n0")], [late_job()], [held("ckpt", "n0")], policy=waits, now=NOW + 1.6 * HOUR
    )
    assert evicted(plan) == [("ckpt", "deadline")]
    rescues = Policy(deadline_preemption=True, deadline_guard_s=2 * HOUR)
    plan = plan_for([gpu_node("n0")], [late_job()], [held("ckpt", "n0")], policy=rescues)
    assert evicted(plan) == [("ckpt", "deadline")]
