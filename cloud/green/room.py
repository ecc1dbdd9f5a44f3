"""Making room: move running, checkpointing training off a node so that a worker
waiting for room fits there.

A gang member needs all its accelerators on one node. A fleet can have 14 GPUs
free and still no node with 8: each 8-GPU server holds a small job or two, and an
8-GPU worker waits until one of them empties by chance. In the 14-day evaluation
(2023-06-01, seed 2023) green's 1×8 and 2×4 jobs waited 3-7 h beside 7-14 free
GPUs where the baseline started them within the hour, and those waits were most of
green's excess over the baseline's mean wait. Kubernetes' descheduler and FGD's
authors (Weng et al., ATC '23) call the cure defragmentation; here it is done by
moving the small jobs, as the migrator moves work to cleaner capacity: they resume
from their newest checkpoint on another node.

``RoomMaker.propose`` runs after a pass (and after the migrator's moves), on the
cluster they leave, for the training the pass left waiting for room (pending
``capacity``) for at least ``min_wait_s`` since its submission, in queue order:

1. the nodes that could ever hold one of its workers (its static filters: model,
   taints, labels, isolation...) with too few free accelerators are tried cleanest
   first (``Migrator.work_rate``: energy per unit of work × the zone's mean
   intensity over the job's run);
2. on each, the running jobs there that may move (``TrainingJob.movable``: they
   checkpoint and may be stopped; running at least the migrator's ``cooldown_s``)
   are taken smallest first until the worker fits; what they hold there must be
   fewer accelerators than the worker needs, so a move frees more than it
   displaces, and two small jobs never trade places forever;
3. it stands only if the scheduler core (the policy's own scoring, no preemption,
   no shifting), on the cluster without them, places the waiting job whole in one of
   its shapes *and* then every moved job whole elsewhere, each before its deadline.

Nothing is placed here: the moves free the room and the next pass places the job
(the live loop's next pass; the simulator's, a second later), so what is decided
about queued work stays the core's, in queue order. At most ``max_jobs_per_pass``
jobs get room per pass, and at most ``max_trials_per_pass`` trial pairs are tried.

Pure, like the migrator: snapshot, plan and running jobs in, ``JobMove`` records
out (``room_for`` names the job each one makes room for).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from cloud.scheduler import (
    Allocation,
    Placement,
    Plan,
    Policy,
    Snapshot,
    TrainingJob,
    Work,
    schedule,
)
from cloud.scheduler.filters import PASS, static_filters
from cloud.scheduler.model import KIND_INDEX
from cloud.scheduler.shape import make_shape

from .migration import JobMove, Migrator, RunningJob, apply_move, trial_policy


@dataclass(frozen=True, slots=True)
class RoomMaker:
    migrator: Migrator  # its signals, energy model, restart cost and cooldown
    # Waiting this long for room since submission, others move: long enough to let a
    # worker that arrives as a job ends take its room, short enough that a burst of
    # 8-GPU work does not queue behind free GPUs spread over nodes (the 54-scenario
    # matrix: no scenario over 1.5x the baseline's wait at 60 s and 4 a pass; 1 at
    # 600 s and 2, 4 with a 60 min patience on top: benchmarks/RESULTS.md).
    min_wait_s: float = 60.0
    max_jobs_per_pass: int = 4
    max_trials_per_pass: int = 8  # (waiting job, node) pairs tried with the core, per pass
    # Waiting jobs looked at per pass, the queue's head first: a pass can leave
    # thousands waiting, and each look costs a pass over the nodes.
    max_waiting_per_pass: int = 32

    def __post_init__(self) -> None:
        if not self.min_wait_s >= 0:
            raise ValueError("min_wait_s must be >= 0")
        if min(self.max_jobs_per_pass, self.max_trials_per_pass, self.max_waiting_per_pass) < 0:
            raise ValueError("the per-pass limits must not be negative")

    def propose(
        self,
        cluster: Snapshot,
        queue: Sequence[Work],
        plan: Plan,
        running: Sequence[RunningJob],
        policy: Policy,
    ) -> list[JobMove]:
        """Moves that make room now for the jobs ``plan`` left waiting for room.
        ``cluster`` is the cluster as the plan and the pass's other moves leave it;
        ``queue`` is the pass's queue; ``running`` the runs that may still move."""
        now = cluster.now
        queued = {work.work_id: work for work in queue if isinstance(work, TrainingJob)}
        waiting = [
            queued[pending.work_id]
            for pending in plan.pending
            if pending.code == "capacity"
            and pending.work_id in queued
            and now - queued[pending.work_id].submitted_at >= self.min_wait_s
        ][: self.max_waiting_per_pass]
        runs = {entry.job.work_id: entry for entry in running if self.migrator.may_move(entry, now)}
        if not waiting or not runs or not self.max_jobs_per_pass:
            return []
        trial = trial_policy(policy)
        allocations = {a.allocation_id: a for a in cluster.allocations}
        moves: list[JobMove] = []
        served = 0
        trials = self.max_trials_per_pass
        current = cluster
        movable = _movable_by_node(allocations, runs)
        # Where the jobs given room will go: later trials must not take that room.
        reserved: list[Allocation] = []
        for job in waiting:
            if served >= self.max_jobs_per_pass or not trials:
                break
            for node_id, chosen in self._candidates(current, job, movable, trial):
                if not trials:
                    break
                trials -= 1
                made, placed = self._trial(
                    current, job, node_id, chosen, allocations, reserved, runs, trial
                )
                if not made:
                    continue
                served += 1
                moves.extend(made)
                reserved.extend(p.to_allocation() for p in placed)
                for move in made:
                    apply_move(allocations, move)
                    del runs[move.work_id]
                current = cluster.with_work(allocations=[*allocations.values(), *reserved])
                movable = _movable_by_node(allocations, runs)
                break
        return moves

    def _candidates(
        self,
        current: Snapshot,
        job: TrainingJob,
        movable: dict[str, dict[str, int]],
        policy: Policy,
    ) -> Iterator[tuple[str, list[str]]]:
        """(node, the jobs to move off it) that would let one worker of ``job`` fit
        there, cleanest node first. ``current`` holds the cluster with the room made
        for other jobs this pass; ``movable`` is ``_movable_by_node`` of it."""
        worker = job.accelerators_per_worker
        table = current.nodes
        gpus = table.kind("gpu")
        static = static_filters(current, make_shape(job, policy), KIND_INDEX["gpu"], None)
        has_movable = np.zeros(len(table.node_ids), dtype=bool)
        has_movable[[table.index[node_id] for node_id in movable if node_id in table.index]] = True
        rows = np.flatnonzero(
            (static.codes == PASS) & (gpus.capacity >= worker) & (gpus.free < worker) & has_movable
        )
        if not rows.size:
            return
        rates = self.migrator.work_rate(
            current, "gpu", rows, job.duration_s / gpus.relative_speed[rows]
        )
        order = sorted(
            range(rows.size),
            key=lambda i: (float(rates[i]) if np.isfinite(rates[i]) else math.inf, int(rows[i])),
        )
        for i in order:
            row = int(rows[i])
            node_id = table.node_ids[row]
            deficit = worker - int(gpus.free[row])
            chosen: list[str] = []
            freed = 0
            for work_id, count in sorted(
                movable[node_id].items(), key=lambda item: (item[1], item[0])
            ):
                if freed >= deficit:
                    break
                chosen.append(work_id)
                freed += count
            if deficit <= freed < worker:  # else too little movable, or as much as it frees
                yield node_id, chosen

    def _trial(
        self,
        cluster: Snapshot,
        job: TrainingJob,
        node_id: str,
        chosen: Sequence[str],
        allocations: dict[str, Allocation],
        reserved: Sequence[Allocation],
        runs: dict[str, RunningJob],
        policy: Policy,
    ) -> tuple[list[JobMove], tuple[Placement, ...]]:
        """The moves of ``chosen`` off ``node_id`` and where ``job`` would run if,
        without them, the core places ``job`` whole with a worker on ``node_id`` and
        then each of them whole on other nodes before its deadline; else none."""
        now = cluster.now
        nothing: tuple[list[JobMove], tuple[Placement, ...]] = ([], ())
        moved = set(chosen)
        others = [a for a in allocations.values() if a.work_id not in moved]
        others.extend(reserved)
        first = schedule(cluster.with_work(allocations=others, queue=[job]), policy)
        placed = first.placements_for(job.work_id)
        if sum(p.accelerators for p in placed) != job.shape.accelerators or node_id not in {
            p.node_id for p in placed
        }:
            return nothing  # not whole, or not in the room made for it
        resumed = [self.migrator.resumed(runs[work_id], now) for work_id in chosen]
        after = cluster.with_work(
            allocations=[*others, *(p.to_allocation() for p in placed)], queue=resumed
        )
        second = schedule(after, policy)
        moves: list[JobMove] = []
        for entry in resumed:
            placements = second.placements_for(entry.work_id)
            if sum(p.accelerators for p in placements) != entry.shape.accelerators:
                return nothing
            if any(p.node_id == node_id for p in placements):
                return nothing  # back where room is being made: no move at all
            end = max(p.expected_end or math.inf for p in placements)
            if entry.deadline is not None and end > entry.deadline:
                return nothing
            held = [a for a in allocations.values() if a.work_id == entry.work_id]
            remaining = runs[entry.work_id].remaining_s(now)
            quantity, unit = self.migrator.quantity
            moves.append(
                JobMove(
                    work_id=entry.work_id,
                    stop=tuple(sorted(a.allocation_id for a in held)),
                    from_nodes=tuple(sorted({a.node_id for a in held})),
                    resumed=entry,
                    placements=placements,
                    expected_stay=self.migrator.run_total(cluster, held, remaining),
                    expected_move=self.migrator.run_total(
                        after, [p.to_allocation() for p in placements], None
                    ),
                    quantity=quantity,
                    unit=unit,
                    room_for=job.work_id,
                )
            )
        return moves, placed


def _movable_by_node(
    allocations: dict[str, Allocation], runs: dict[str, RunningJob]
) -> dict[str, dict[str, int]]:
    """Node id -> the GPUs each job that may move holds there, by work id."""
    movable: dict[str, dict[str, int]] = {}
    for allocation in allocations.values():
        if allocation.work_id in runs and allocation.accelerator_kind == "gpu":
            held = movable.setdefault(allocation.node_id, {})
            held[allocation.work_id] = held.get(allocation.work_id, 0) + allocation.accelerators
    return movable
