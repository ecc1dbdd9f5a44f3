"""A gang spread over speed classes runs in lockstep at its slowest member's pace, so
every member holds its accelerators until the gang's end: each placement says so, and
reservations and deadline rescues plan on it."""

from __future__ import annotations

import dataclasses

from cloud.scheduler import Policy

from .builders import NOW, gpu_node, job, nodes_of, plan_for, running

# A 2-worker gang of 4 GPUs each fits only mixed: one worker on each node. Alone, a
# worker would take 1800 s on the H100s and 3600 s on the A100s.
FAST = gpu_node("fast", 4, model="H100", speed=2.0)
SLOW = gpu_node("slow", 4, model="A100", speed=1.0)
GANG = job("gang", 4, workers=2, duration_s=3600, topology="any")


def test_every_member_of_a_mixed_gang_ends_with_the_gang() -> None:
    plan = plan_for([FAST, SLOW], [GANG], policy=Policy(preemption=False))
    assert sorted(nodes_of(plan, "gang")) == ["fast", "slow"]
    assert [p.expected_end for p in plan.placements] == [NOW + 3600] * 2


def test_a_reservation_behind_a_mixed_gang_starts_when_the_gang_ends() -> None:
    later = job("later", 4, submitted_at=1, accelerator_models=("H100",))
    plan = plan_for([FAST, SLOW], [GANG, later], policy=Policy(preemption=False))
    pending = plan.pending_for("later")
    assert pending is not None
    assert pending.reservation is not None
    assert pending.reservation.nodes == ("fast",)
    assert pending.reservation.start_at == NOW + 3600


def test_a_deadline_rescue_sees_the_fast_node_held_until_the_gang_ends() -> None:
    # "other" runs checkpointing work without a deadline until NOW+20000. The urgent job
    # (deadline NOW+5000) would make it on "fast" from NOW+1800 if the gang's member
    # there ended then; it ends with the gang at NOW+3600, too late: rescue on "other".
    other = gpu_node("other", 4, model="A100", speed=1.0)
    nodes = [FAST, SLOW, other]
    checkpointing = dataclasses.replace(
        running("ck", "other", 4, priority="p1", expected_end=NOW + 20000), checkpointing=True
    )
    first = plan_for(nodes, [GANG], [checkpointing])
    held = [checkpointing, *(p.to_allocation() for p in first.placements)]
    urgent = job("urgent", 4, duration_s=3600, deadline=NOW + 5000, submitted_at=NOW)
    plan = plan_for(nodes, [urgent], held, policy=Policy(deadline_preemption=True))
    assert [(p.allocation_id, p.reason) for p in plan.preemptions] == [("ck", "deadline")]
    assert nodes_of(plan, "urgent") == ["other"]


def test_a_mixed_gang_does_not_run_into_a_reservation_at_its_pace() -> None:
    # The head job (H100s only) reserves "fast" from NOW+3000, when the 2 GPUs busy
    # there free. A gang member of 2 GPUs alone would leave "fast" at NOW+2000, before
    # that; in lockstep with its A100 partner it holds them until NOW+4000, so the gang
    # waits instead of pushing the head job back.
    fast = gpu_node("fast", 4, model="H100", speed=2.0)
    slow = gpu_node("slow", 2, model="A100", speed=1.0)
    busy = [running("busy", "fast", 2, priority="p0", preemptible=False, expected_end=NOW + 3000)]
    head = job("head", 4, accelerator_models=("H100",))
    gang = job("gang", 2, workers=2, duration_s=4000, topology="any", submitted_at=1)
    plan = plan_for([fast, slow], [head, gang], busy, policy=Policy(preemption=False))
    head_pending = plan.pending_for("head")
    assert head_pending is not None
    assert head_pending.reservation is not None
    assert head_pending.reservation.start_at == NOW + 3000
    assert plan.placements_for("gang") == ()
