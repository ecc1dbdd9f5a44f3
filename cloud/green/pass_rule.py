"""One scheduling pass with migration: schedule the queue, then move running training
to cleaner capacity, unless the pass preempted anything.

The live loop (cloud/loop/loop.py) and the evaluation's simulation
(cloud/eval/simulation.py) both run a pass through `schedule_then_move`, so what
the evaluation measures is the rule the control plane follows:

1. the scheduler core places the queue (nothing queued: an empty plan);
2. a pass that preempted anything moves nothing: its victims are queued again and
   the next pass looks at a settled cluster;
2a. the power capper (`PowerCapper.cap`, where the policy caps) holds new training
   to a lower GPU power limit where the energy saved is worth the longer run;
3. otherwise the migrator (`Migrator.propose`) looks for moves on the cluster as
   the plan leaves it, so a move only takes capacity no queued work could start on
   now;
4. and the room maker (`RoomMaker.propose`, room.py), on the cluster those moves
   leave, moves small checkpointing jobs off a node where that lets a worker that
   waits for room fit (the next pass places it).

Pure: snapshot, policy, migrator and running jobs in; the plan and the moves out.
The caller applies both (the loop commits them in one transaction; the simulator
starts the placements, then stops and resumes the moved jobs).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cloud.scheduler import Plan, Policy, Snapshot, schedule

from .migration import JobMove, Migrator, RunningJob
from .power_capping import PowerCapper
from .room import RoomMaker

# The cluster as a plan without preemptions leaves it: (snapshot before, plan) -> after.
ClusterAfter = Callable[[Snapshot, Plan], Snapshot]


def with_placements(snapshot: Snapshot, plan: Plan) -> Snapshot:
    """The snapshot with the plan's placements running too and telemetry (utilisation)
    as it was: what the control plane knows until agents report again."""
    return snapshot.with_work(
        allocations=[*snapshot.allocations, *(p.to_allocation() for p in plan.placements)]
    )


@dataclass(frozen=True, slots=True)
class PassDecision:
    plan: Plan
    moves: tuple[JobMove, ...] = ()


def schedule_then_move(
    snapshot: Snapshot,
    policy: Policy,
    migrator: Migrator | None,
    running: Sequence[RunningJob],
    *,
    cluster_after: ClusterAfter = with_placements,
    capper: PowerCapper | None = None,
    room_maker: RoomMaker | None = None,
    max_decisions: int | None = None,
) -> PassDecision:
    """Schedule ``snapshot``'s queue under ``policy``; then, unless the plan preempts,
    the moves ``migrator`` proposes among the ``running`` jobs (None: the policy does
    not migrate, or it is not time to look). ``cluster_after`` is where moves are
    looked for (the simulation also updates utilisation, as telemetry would);
    ``capper`` caps the plan's new training where the policy caps power;
    ``room_maker`` makes room for work waiting for it (looked for with the migrator's
    moves, so None as well when the migrator is);
    ``max_decisions`` bounds the queue looked at (core.schedule)."""
    if snapshot.queue:
        plan = schedule(snapshot, policy, max_decisions=max_decisions)
        if capper is not None and plan.placements:
            plan = capper.cap(snapshot, plan)
    else:
        plan = Plan(
            now=snapshot.now, placements=(), preemptions=(), pending=(), reservations=(), order=()
        )
    if plan.preemptions or migrator is None or not running:
        return PassDecision(plan)
    after = cluster_after(snapshot, plan)
    moves = migrator.propose(after, running, policy)
    if room_maker is None or not plan.pending:
        return PassDecision(plan, tuple(moves))
    stopped = {allocation_id for move in moves for allocation_id in move.stop}
    moved = {move.work_id for move in moves}
    after = after.with_work(
        allocations=[
            *(a for a in after.allocations if a.allocation_id not in stopped),
            *(p.to_allocation() for move in moves for p in move.placements),
        ]
    )
    rest = [entry for entry in running if entry.job.work_id not in moved]
    moves += room_maker.propose(after, snapshot.queue, plan, rest, policy)
    return PassDecision(plan, tuple(moves))
