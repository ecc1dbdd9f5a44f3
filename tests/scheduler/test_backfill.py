"""Behaviour 6: the blocked head reserves the earliest slot; backfill cannot delay it."""

from __future__ import annotations

from cloud.scheduler import Policy

from .builders import GIB, NOW, gpu_node, job, nodes_of, plan_for, running

# n0 has 4 of 8 GPUs busy until NOW+1000; nothing is preemptible.
NODES = [gpu_node("n0")]
BUSY = [running("r", "n0", 4, priority="p0", preemptible=False, expected_end=NOW + 1000)]


def test_blocked_head_reserves_the_earliest_slot() -> None:
    plan = plan_for(NODES, [job("big", 8)], BUSY)
    (reservation,) = plan.reservations
    assert reservation.work_id == "big"
    assert reservation.start_at == NOW + 1000
    assert reservation.nodes == ("n0",)
    assert reservation.accelerators == (8,)
    pending = plan.pending_for("big")
    assert pending is not None
    assert pending.reservation == reservation
    assert "reserved 8 GPU on 1 node(s) from 2023-11-14T22:30Z" in pending.message


def test_short_job_backfills_long_job_waits() -> None:
    queue = [
        job("big", 8, submitted_at=0),
        job("long", 4, submitted_at=1, duration_s=7200),
        job("short", 4, submitted_at=2, duration_s=600),
    ]
    plan = plan_for(NODES, queue, BUSY)
    assert nodes_of(plan, "short") == ["n0"]
    (short,) = plan.placements
    assert short.expected_end is not None
    assert short.expected_end <= plan.reservations[0].start_at
    long_pending = plan.pending_for("long")
    assert long_pending is not None
    assert long_pending.code == "reserved"
    assert long_pending.rejections == {"reserved": 1}
    assert long_pending.message.startswith("Held back so an earlier job's reservation")


def test_without_backfill_the_long_job_would_delay_the_head() -> None:
    queue = [job("big", 8, submitted_at=0), job("long", 4, submitted_at=1, duration_s=7200)]
    plan = plan_for(NODES, queue, BUSY, policy=Policy(backfill=False))
    assert nodes_of(plan, "long") == ["n0"]
    assert plan.reservations == ()


def test_slack_lets_long_work_use_capacity_the_reservation_does_not_need() -> None:
    nodes = [gpu_node("n0")]
    busy = [running("r", "n0", 6, priority="p0", preemptible=False, expected_end=NOW + 1000)]
    queue = [
        job("head", 4, submitted_at=0),
        job("long", 2, submitted_at=1, duration_s=9000),
        job("long2", 2, submitted_at=2, duration_s=9000),
    ]
    plan = plan_for(nodes, queue, busy)
    # head needs 4 at NOW+1000 when 8 will be free: 4 spare, of which 2 are free now.
    assert nodes_of(plan, "long") == ["n0"]
    assert plan.reservations[0].start_at == NOW + 1000


def test_gang_reservation_waits_for_enough_nodes() -> None:
    nodes = [gpu_node("n0"), gpu_node("n1"), gpu_node("n2")]
    busy = [
        running("a", "n0", 8, priority="p0", preemptible=False, expected_end=NOW + 500),
        running("b", "n1", 8, priority="p0", preemptible=False, expected_end=NOW + 2000),
        running("c", "n2", 8, priority="p0", preemptible=False, expected_end=NOW + 9000),
    ]
    plan = plan_for(nodes, [job("gang", 8, workers=2)], busy)
    (reservation,) = plan.reservations
    assert reservation.start_at == NOW + 2000
    assert sorted(reservation.nodes) == ["n0", "n1"]


def test_reservations_are_capped_per_pass() -> None:
    queue = [job(f"big{i}", 8, submitted_at=i) for i in range(4)]
    plan = plan_for(NODES, queue, BUSY, policy=Policy(max_reservations=2))
    assert [r.work_id for r in plan.reservations] == ["big0", "big1"]
    # The second waits for the first to finish on the only node.
    assert plan.reservations[1].start_at == NOW + 1000 + 3600


def test_backfill_cannot_take_the_host_memory_a_reservation_needs() -> None:
    # head needs 4 GPUs and 80 GiB at NOW+3600; a long job asking for 90 GiB would
    # leave it without host memory then, however many GPUs are free.
    nodes = [gpu_node("n1", 8, host_memory_gib=100)]
    busy = [running("r", "n1", 6, priority="p1", preemptible=False, expected_end=NOW + 3600)]
    queue = [
        job("head", 4, submitted_at=0, host_memory_bytes=80 * GIB),
        job("greedy", 1, submitted_at=10, duration_s=36000, host_memory_bytes=90 * GIB),
        job("modest", 1, submitted_at=20, duration_s=36000, host_memory_bytes=20 * GIB),
    ]
    plan = plan_for(nodes, queue, busy, policy=Policy(max_reservations=1))
    (reservation,) = plan.reservations
    assert (reservation.work_id, reservation.start_at) == ("head", NOW + 3600)
    assert reservation.host_memory_bytes == (80 * GIB,)
    pending = plan.pending_for("greedy")
    assert pending is not None
    assert pending.code == "reserved"
    assert nodes_of(plan, "modest") == ["n1"]  # within the host-memory slack


def test_reservation_waits_for_host_memory_to_free_up() -> None:
    # GPUs are free now, host memory only when "r" ends: that is the earliest slot.
    nodes = [gpu_node("n1", 8, host_memory_gib=100)]
    busy = [
        running(
            "r",
            "n1",
            1,
            priority="p1",
            preemptible=False,
            expected_end=NOW + 1800,
            host_memory_bytes=90 * GIB,
        )
    ]
    plan = plan_for(nodes, [job("head", 4, host_memory_bytes=50 * GIB)], busy)
    (reservation,) = plan.reservations
    assert reservation.start_at == NOW + 1800
