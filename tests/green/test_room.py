"""Making room (cloud/green/room.py): a worker that waits for a node with room gets one
when moving small checkpointing jobs frees it, and only then: never by displacing as
much as it frees, never jobs that cannot resume, never before the job has waited,
never where a moved job would find no place or miss its deadline."""

from __future__ import annotations

import dataclasses

import pytest

from cloud.green.energy import EnergyModel
from cloud.green.latency import default_latency_estimator
from cloud.green.migration import Migrator, RunningJob
from cloud.green.pass_rule import schedule_then_move
from cloud.green.policies import GreenInputs, build_policy
from cloud.green.room import RoomMaker
from cloud.scheduler import (
    Allocation,
    Node,
    Plan,
    Policy,
    Snapshot,
    Taint,
    Toleration,
    TrainingJob,
    schedule,
)
from cloud.signals.grid import ZoneSeries

from .builders import HOUR, T0, flat, gpu_server, grid, running_on

NOW = T0 + 2 * HOUR
ZONES = (flat("CLEAN", 60.0), flat("DIRTY", 600.0))
LATENCY = default_latency_estimator()


def job(
    work_id: str,
    gpus: int,
    *,
    checkpoint_s: float | None = 1800.0,
    submitted_at: float = T0,
    deadline: float | None = None,
) -> TrainingJob:
    return TrainingJob(
        work_id=work_id,
        tenant="t",
        submitted_at=submitted_at,
        accelerators_per_worker=gpus,
        duration_s=10 * HOUR,
        checkpoint_interval_s=checkpoint_s,
        deadline=deadline,
    )


def green(*zones: ZoneSeries) -> Policy:
    return build_policy("green", GreenInputs(signals=grid(*zones, now=NOW), latency=LATENCY))


def maker(**options: float) -> RoomMaker:
    return RoomMaker(Migrator(grid(*ZONES, now=NOW), EnergyModel()), **options)  # type: ignore[arg-type]


def fragmented(
    small: list[TrainingJob], nodes: list[Node] | None = None, placed_on: list[str] | None = None
) -> tuple[list[Node], list[Allocation], list[RunningJob]]:
    """Two clean 8-GPU servers, one small job on each (or as ``placed_on`` says)."""
    nodes = nodes or [
        gpu_server("a", "CLEAN", count=8),
        gpu_server("b", "CLEAN", count=8),
    ]
    where = placed_on or ["a", "b"]
    allocations = [running_on(node_id, entry) for node_id, entry in zip(where, small, strict=True)]
    running = [RunningJob(job=entry, started_s=T0, speed=1.0) for entry in small]
    return nodes, allocations, running


def pass_of(
    nodes: list[Node], allocations: list[Allocation], queue: list[TrainingJob]
) -> tuple[Snapshot, Plan]:
    snap = Snapshot.build(now=NOW, nodes=nodes, allocations=allocations, queue=queue)
    return snap, schedule(snap, green(*ZONES))


def test_small_jobs_are_moved_together_so_a_waiting_8_gpu_worker_fits() -> None:
    # 8 of 16 GPUs free, 4 on each server: the 1x8 job waits for room.
    nodes, allocations, running = fragmented([job("s1", 4), job("s2", 4)])
    waiting = job("big", 8, submitted_at=NOW - HOUR)
    snap, plan = pass_of(nodes, allocations, [waiting])
    pending = plan.pending_for("big")
    assert pending is not None
    assert pending.code == "capacity"

    [move] = maker().propose(snap, [waiting], plan, running, green(*ZONES))

    assert move.room_for == "big"
    assert move.work_id in ("s1", "s2")
    (to_node,) = {p.node_id for p in move.placements}
    assert move.from_nodes != (to_node,)
    # It resumes from its newest checkpoint (2 h in: 4 of them) plus the restart.
    assert move.resumed.duration_s == pytest.approx(8 * HOUR + 300)
    assert "to make room for big" in move.explain()
    # With the move made, the next pass places the waiting job whole on the freed node.
    after = [a for a in allocations if a.allocation_id not in move.stop]
    after += [p.to_allocation() for p in move.placements]
    _, replan = pass_of(nodes, after, [waiting])
    assert [p.node_id for p in replan.placements_for("big")] == [move.from_nodes[0]]


def test_the_cleanest_node_is_freed_first() -> None:
    nodes = [gpu_server("dirty", "DIRTY", count=8), gpu_server("clean", "CLEAN", count=8)]
    nodes.append(gpu_server("spare", "DIRTY", count=4))
    small = [job("on-dirty", 4), job("on-clean", 4)]
    nodes, allocations, running = fragmented(small, nodes, ["dirty", "clean"])
    waiting = job("big", 8, submitted_at=NOW - HOUR)
    snap, plan = pass_of(nodes, allocations, [waiting])

    [move] = maker().propose(snap, [waiting], plan, running, green(*ZONES))

    assert move.from_nodes == ("clean",)
    assert move.work_id == "on-clean"


def test_nothing_moves_for_a_job_that_has_not_waited_long_enough() -> None:
    nodes, allocations, running = fragmented([job("s1", 4), job("s2", 4)])
    fresh = job("big", 8, submitted_at=NOW - 60)
    snap, plan = pass_of(nodes, allocations, [fresh])
    assert maker(min_wait_s=600).propose(snap, [fresh], plan, running, green(*ZONES)) == []
    assert len(maker(min_wait_s=30).propose(snap, [fresh], plan, running, green(*ZONES))) == 1


def test_jobs_that_cannot_resume_are_not_moved() -> None:
    small = [job("s1", 4, checkpoint_s=None), job("s2", 4, checkpoint_s=None)]
    nodes, allocations, running = fragmented(small)
    waiting = job("big", 8, submitted_at=NOW - HOUR)
    snap, plan = pass_of(nodes, allocations, [waiting])
    assert maker().propose(snap, [waiting], plan, running, green(*ZONES)) == []


def test_a_move_never_displaces_as_much_as_it_frees() -> None:
    # "a" holds a 6-GPU job that could move to "spare" (tainted: only it tolerates
    # that), which would free room for a 4-GPU worker, by displacing 6: never.
    spare = dataclasses.replace(gpu_server("spare", "CLEAN", count=8), taints=(Taint("reserved"),))
    nodes = [gpu_server("a", "CLEAN", count=8), spare]
    big = dataclasses.replace(job("s1", 6), tolerations=(Toleration("reserved"),))
    small = dataclasses.replace(job("s2", 2), tolerations=(Toleration("reserved"),))
    for moved, waiting in ((big, job("four", 4, submitted_at=NOW - HOUR)), (small, None)):
        _, allocations, running = fragmented([moved], nodes, ["a"])
        if waiting is None:  # the control: moving 2 GPUs for a 7-GPU worker may happen
            waiting = job("seven", 7, submitted_at=NOW - HOUR)
        snap, plan = pass_of(nodes, allocations, [waiting])
        assert plan.pending_for(waiting.work_id) is not None
        moves = maker().propose(snap, [waiting], plan, running, green(*ZONES))
        assert [m.work_id for m in moves] == ([] if moved is big else ["s2"])


def test_no_move_when_the_moved_job_has_nowhere_to_go() -> None:
    # One 8-GPU server with a 4-GPU job, and nowhere else for that job to run.
    nodes, allocations, running = fragmented(
        [job("s1", 4), job("s2", 4)],
        [gpu_server("a", "CLEAN", count=8)],
        ["a", "a"],
    )
    waiting = job("big", 8, submitted_at=NOW - HOUR)
    snap, plan = pass_of(nodes, allocations, [waiting])
    assert maker().propose(snap, [waiting], plan, running, green(*ZONES)) == []


def test_no_move_that_would_make_the_moved_job_miss_its_deadline() -> None:
    # Room on "a" means moving its 4-GPU job; the only place left for it is a slow
    # server ("b" holds a job that cannot move), where it would end too late.
    nodes = [
        gpu_server("a", "CLEAN", count=8),
        gpu_server("b", "CLEAN", count=8),
        gpu_server("slow", "CLEAN", count=4, speed=0.25),
    ]
    waiting = job("big", 8, submitted_at=NOW - HOUR)
    for deadline, moves_expected in ((NOW + 12 * HOUR, 0), (None, 1)):
        small = job("small", 4, deadline=deadline)
        blocker = job("blocker", 6, checkpoint_s=None)
        _, allocations, running = fragmented([small, blocker], nodes, ["a", "b"])
        snap, plan = pass_of(nodes, allocations, [waiting])
        moves = maker().propose(snap, [waiting], plan, running, green(*ZONES))
        assert len(moves) == moves_expected
        assert all(p.node_id == "slow" for m in moves for p in m.placements)


def test_the_pass_rule_makes_room_after_the_queue_is_placed() -> None:
    nodes, allocations, running = fragmented([job("s1", 4), job("s2", 4)])
    waiting = job("big", 8, submitted_at=NOW - HOUR)
    snap = Snapshot.build(now=NOW, nodes=nodes, allocations=allocations, queue=[waiting])
    policy = green(*ZONES)
    migrator = Migrator(grid(*ZONES, now=NOW), EnergyModel())
    without = schedule_then_move(snap, policy, migrator, running)
    assert without.moves == ()
    decision = schedule_then_move(snap, policy, migrator, running, room_maker=RoomMaker(migrator))
    assert decision.plan.pending_for("big") is not None
    assert [m.room_for for m in decision.moves] == ["big"]


def test_room_maker_refuses_bad_settings() -> None:
    migrator = Migrator(grid(*ZONES, now=NOW), EnergyModel())
    with pytest.raises(ValueError, match="min_wait_s"):
        RoomMaker(migrator, min_wait_s=-1)
    with pytest.raises(ValueError, match="must not be negative"):
        RoomMaker(migrator, max_jobs_per_pass=-1)
    nodes, allocations, running = fragmented([job("s1", 4), job("s2", 4)])
    waiting = job("big", 8, submitted_at=NOW - HOUR)
    snap, plan = pass_of(nodes, allocations, [waiting])
    idle = dataclasses.replace(RoomMaker(migrator), max_jobs_per_pass=0)
    assert idle.propose(snap, [waiting], plan, running, green(*ZONES)) == []


def test_room_made_for_one_job_is_not_taken_for_the_next() -> None:
    # Three 8-GPU servers, half used by a 4-GPU job each; two 8-GPU jobs wait. Room
    # for the first: its node's job moves beside another. The second could only get
    # room by moving the last small job into the room just made: it waits instead.
    nodes = [gpu_server(name, "CLEAN", count=8) for name in ("x", "y", "z")]
    small = [job("on-x", 4), job("on-y", 4), job("on-z", 4)]
    nodes, allocations, running = fragmented(small, nodes, ["x", "y", "z"])
    first = job("first", 8, submitted_at=NOW - 2 * HOUR)
    second = job("second", 8, submitted_at=NOW - HOUR)
    snap, plan = pass_of(nodes, allocations, [first, second])

    moves = maker().propose(snap, [first, second], plan, running, green(*ZONES))

    assert [m.room_for for m in moves] == ["first"]
    [move] = moves
    freed = move.from_nodes[0]
    landed = {p.node_id for p in move.placements}
    assert freed not in landed
    after = [a for a in allocations if a.allocation_id not in move.stop]
    after += [p.to_allocation() for p in move.placements]
    _, replan = pass_of(nodes, after, [first, second])
    assert [p.node_id for p in replan.placements_for("first")] == [freed]
    assert replan.placements_for("second") == ()
