"""A gang that runs one worker per node (group ``g`` among its own anti_affinity_groups)
reserves the nodes it waits for, so long work cannot backfill ahead of it."""

from __future__ import annotations

from cloud.scheduler import Policy, TrainingJob

from .builders import NOW, gpu_node, job, nodes_of, plan_for, running

# n1 is held for an hour by work nothing may evict; n2 is free.
NODES = [gpu_node("n1", 4), gpu_node("n2", 4)]
BLOCKER = [running("blk", "n1", 4, priority="p0", preemptible=False, expected_end=NOW + 3600)]


def one_per_node_gang() -> TrainingJob:
    return job("gang", 2, workers=2, group="g", anti_affinity_groups=("g",), submitted_at=0)


def test_one_per_node_gang_reserves_a_node_each_when_the_blocker_ends() -> None:
    plan = plan_for(NODES, [one_per_node_gang()], BLOCKER)
    (reservation,) = plan.reservations
    assert reservation.work_id == "gang"
    assert reservation.start_at == NOW + 3600
    assert sorted(reservation.nodes) == ["n1", "n2"]
    assert reservation.accelerators == (2, 2)


def test_long_work_is_held_back_rather_than_delay_the_one_per_node_gang() -> None:
    queue = [
        one_per_node_gang(),
        job("long", 4, submitted_at=1, duration_s=86400),
    ]
    plan = plan_for(NODES, queue, BLOCKER)
    assert nodes_of(plan, "long") == []
    pending = plan.pending_for("long")
    assert pending is not None
    assert pending.code == "reserved"
    assert pending.message.startswith("Held back so an earlier job's reservation")


def test_short_work_still_backfills_beside_the_one_per_node_gang() -> None:
    queue = [
        one_per_node_gang(),
        job("short", 4, submitted_at=1, duration_s=600),
    ]
    plan = plan_for(NODES, queue, BLOCKER)
    assert nodes_of(plan, "short") == ["n2"]
    assert [r.work_id for r in plan.reservations] == ["gang"]


def test_waiting_one_per_node_gang_says_one_worker_fits_per_node() -> None:
    plan = plan_for(NODES, [one_per_node_gang()], BLOCKER)
    pending = plan.pending_for("gang")
    assert pending is not None
    assert "only 1 of 2 workers fit (at most 1 per node)" in pending.message


def test_one_per_node_gang_mixes_speed_classes_when_waiting_for_one_would_finish_later() -> None:
    # Mixed now (fast-2 + slow, at the A100 pace): done at NOW+3600. Both H100 nodes are
    # needed for one worker each, and fast-1 is busy until NOW+3000: done at NOW+4800.
    # fast-2's 4 free GPUs hold one worker of this gang, not two.
    nodes = [
        gpu_node("fast-1", 4, model="H100", speed=2.0),
        gpu_node("fast-2", 4, model="H100", speed=2.0),
        gpu_node("slow", 4, model="A100", speed=1.0),
    ]
    busy = [running("busy", "fast-1", 4, priority="p0", preemptible=False, expected_end=NOW + 3000)]
    gang = job(
        "gang",
        2,
        workers=2,
        duration_s=3600,
        topology="any",
        group="g",
        anti_affinity_groups=("g",),
    )
    plan = plan_for(nodes, [gang], busy, policy=Policy(preemption=False))
    assert sorted(nodes_of(plan, "gang")) == ["fast-2", "slow"]
