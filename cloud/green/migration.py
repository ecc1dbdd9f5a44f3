"""JobMove: move running, checkpointing training to cleaner capacity as it frees.

Spatial shifting decides once, at the start. Under load the clean zones fill
during the afternoon peak and the overflow starts on dirtier (and often slower)
nodes, where it stays for its whole run although the clean nodes empty a few
hours later. A job that saves checkpoints can instead stop and resume from its
newest checkpoint elsewhere (CarbonScaler and the "suspend-resume" policies of
Let's Wait Awhile use the same property).

``Migrator.propose`` runs after a pass has placed the queue, on the capacity that
pass left free, so a move never takes what queued work could start on now (work
that temporal shifting holds back for later is not protected: it is placed when
it starts, like any arrival). For each running job that may move
(``TrainingJob.movable``: it checkpoints and may be stopped), dirtiest first:

1. **stay**: the expected emissions (or cost) of the work it has left on the nodes
   it holds: energy of the remaining run × mean intensity of each node's zone over
   it, on the same energy model and forecast as the carbon term;
2. **move**: the scheduler core places the job, resumed, on the cluster without it
   (its own policy, no preemption, no shifting): the work left at its newest
   checkpoint, plus ``restart_s`` to reload it. Progress since that checkpoint is
   lost and paid again;
3. moves when *move* is at least ``min_saving`` (default 20 %, more than
   forecast error and the lost work) below *stay*, the job still ends before its
   deadline, and it lands on other nodes. Both sides need a real signal: a zone
   the signals do not cover (which placement scores pessimistically) never takes
   part in a move.

At most ``max_per_pass`` jobs move in one pass, out of at most
``max_trials_per_pass`` trial placements; each accepted move is applied to the
working cluster before the next job is considered, so two jobs never claim the
same free accelerators. A run younger than ``cooldown_s`` (default 10 min)
is left alone, so a job is not moved back and forth by forecast noise.

A cheap filter comes first: a job is only tried where some node with room for
one of its workers would run it at least ``min_saving`` cleaner per unit of work
(power / speed × intensity over about the job's remaining run), which keeps a
pass over thousands of running jobs cheap.

The migrator is pure: snapshot and running jobs in, ``JobMove`` records out. The
caller stops the old workers and starts the new ones (the evaluation's simulator;
the workers resume from their checkpoint).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from cloud.scheduler import Allocation, Placement, Policy, Snapshot, TrainingJob, schedule
from cloud.scheduler.arrays import FloatArray, IntArray
from cloud.signals.grid import GridSignals
from shared.messages import AcceleratorKind

from .energy import J_PER_KWH, EnergyModel
from .shifting import Objective
from .window import GridWindows, window_means

HOUR_S = 3600.0


@dataclass(frozen=True, slots=True, kw_only=True)
class RunningJob:
    """A running training job and its current run.

    ``job`` is the job as this run started: its ``duration_s`` is the work the run
    has to do (reference seconds), of which ``restart_s`` resumes from a checkpoint
    rather than works; it must declare ``checkpoint_interval_s``. ``speed`` is the
    relative speed of the run's slowest node. Checkpoints are taken every interval
    of the run's wall time.
    """

    job: TrainingJob
    started_s: float
    speed: float
    restart_s: float = 0.0

    def remaining_s(self, now_s: float) -> float:
        """Reference seconds of this run still to do."""
        return max(0.0, self.job.duration_s - (now_s - self.started_s) * self.speed)

    def saved_s(self, now_s: float) -> float:
        """Work of this run kept by its newest checkpoint (reference seconds)."""
        interval = self.job.checkpoint_interval_s
        if interval is None:
            return 0.0
        checkpoints = math.floor((now_s - self.started_s) / interval)
        return min(
            self.job.duration_s - self.restart_s,
            max(0.0, checkpoints * interval * self.speed - self.restart_s),
        )

    def resume_remaining_s(self, now_s: float) -> float:
        """Work left for a run resumed from the newest checkpoint, restart excluded."""
        return self.job.duration_s - self.restart_s - self.saved_s(now_s)


@dataclass(frozen=True, slots=True, kw_only=True)
class JobMove:
    work_id: str
    stop: tuple[str, ...]  # allocation ids to stop
    from_nodes: tuple[str, ...]  # the nodes they are on
    resumed: TrainingJob  # the job as it resumes: ``duration_s`` is the work left
    placements: tuple[Placement, ...]  # where it resumes, starting now
    expected_stay: float  # gCO2eq (or cost) of the rest of the run where it is
    expected_move: float  # the same after moving, lost work and restart included
    quantity: str = "CO2"
    unit: str = "gCO2eq"
    # Set when the move makes room for a job waiting for a node with room for one of
    # its workers (room.py), not for a cleaner place: that job's id.
    room_for: str | None = None

    @property
    def saving_fraction(self) -> float:
        return 1.0 - self.expected_move / self.expected_stay if self.expected_stay else 0.0

    def explain(self) -> str:
        to_nodes = sorted({p.node_id for p in self.placements})
        if self.room_for is not None:
            return (
                f"Moved from {', '.join(self.from_nodes)} to {', '.join(to_nodes)}"
                f" to make room for {self.room_for}, which waits for a node with room for"
                f" one of its workers ({self.expected_move:.0f} instead of"
                f" {self.expected_stay:.0f} {self.unit} for the rest of the run);"
                " resumes from its newest checkpoint."
            )
        return (
            f"Moved from {', '.join(self.from_nodes)} to {', '.join(to_nodes)}"
            f" for {self.saving_fraction:.0%} less {self.quantity}"
            f" ({self.expected_move:.0f} instead of {self.expected_stay:.0f} {self.unit}"
            f" for the rest of the run); resumes from its newest checkpoint."
        )


@dataclass(frozen=True, slots=True)
class Migrator:
    signals: GridSignals
    energy: EnergyModel = field(default_factory=EnergyModel)
    objective: Objective = "carbon"
    min_saving: float = 0.2
    restart_s: float = 300.0  # reference seconds to reload a checkpoint and warm up
    max_per_pass: int = 4
    max_trials_per_pass: int = 16  # trial placements (core passes) at most, per pass
    cooldown_s: float = 600.0  # runs younger than this stay where they are
    currency: str = "USD"
    _grid: GridWindows = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_grid", GridWindows(self.signals))
        if not 0.0 <= self.min_saving < 1.0:
            raise ValueError("min_saving must be within [0, 1)")
        if not self.restart_s >= 0:
            raise ValueError("restart_s must be >= 0")
        if min(self.max_per_pass, self.max_trials_per_pass) < 0:
            raise ValueError("max_per_pass and max_trials_per_pass must not be negative")
        if not self.cooldown_s >= 0:
            raise ValueError("cooldown_s must be >= 0")

    @property
    def quantity(self) -> tuple[str, str]:
        """What moves are judged by and its unit: ("CO2", "gCO2eq") or ("cost", currency)."""
        return ("CO2", "gCO2eq") if self.objective == "carbon" else ("cost", self.currency)

    def propose(
        self, snapshot: Snapshot, running: Sequence[RunningJob], policy: Policy
    ) -> list[JobMove]:
        """Migrations worth making now, in the order they were decided."""
        if not self.max_per_pass or not running:
            return []
        trial = trial_policy(policy)
        allocations = {a.allocation_id: a for a in snapshot.allocations}
        by_work: dict[str, list[Allocation]] = {}
        for alloc in allocations.values():
            by_work.setdefault(alloc.work_id, []).append(alloc)
        now = snapshot.now
        ranked: list[tuple[float, RunningJob, float]] = []
        best_rates: dict[tuple[AcceleratorKind, int, int], float] = {}
        for entry in running:
            held = by_work.get(entry.job.work_id)
            if not held or not self.may_move(entry, now):
                continue
            remaining = entry.remaining_s(now)
            run = self._run(snapshot, held, remaining)
            if not np.isfinite(run.rates).all():
                continue  # no signal where it runs: no basis for a move
            current = float(run.rates.max())
            if not self._may_gain(
                snapshot, entry.job, held[0].accelerator_kind, current, remaining, best_rates
            ):
                continue
            stay = run.total
            if math.isfinite(stay) and stay > 0:
                ranked.append((stay / remaining, entry, stay))
        ranked.sort(key=lambda item: (-item[0], item[1].job.work_id))
        migrations: list[JobMove] = []
        for _, entry, stay in ranked[: self.max_trials_per_pass]:
            if len(migrations) >= self.max_per_pass:
                break
            work_id = entry.job.work_id
            held = by_work[work_id]
            resumed = self.resumed(entry, now)
            others = [a for a in allocations.values() if a.work_id != work_id]
            cluster = snapshot.with_work(allocations=others, queue=[resumed])
            plan = schedule(cluster, trial)
            placements = plan.placements_for(work_id)
            # Whole, in whichever of its shapes (flexible shapes: each has the same total).
            if sum(p.accelerators for p in placements) != resumed.shape.accelerators:
                continue
            if {p.node_id for p in placements} == {a.node_id for a in held}:
                continue
            end = max(p.expected_end or math.inf for p in placements)
            if resumed.deadline is not None and end > resumed.deadline:
                continue
            move = self._run(cluster, [p.to_allocation() for p in placements], None).total
            if not move <= (1.0 - self.min_saving) * stay:
                continue
            quantity, unit = self.quantity
            migrations.append(
                JobMove(
                    work_id=work_id,
                    stop=tuple(sorted(a.allocation_id for a in held)),
                    from_nodes=tuple(sorted({a.node_id for a in held})),
                    resumed=resumed,
                    placements=placements,
                    expected_stay=stay,
                    expected_move=move,
                    quantity=quantity,
                    unit=unit,
                )
            )
            apply_move(allocations, migrations[-1])
        return migrations

    def may_move(self, entry: RunningJob, now: float) -> bool:
        """The run may be stopped to resume elsewhere now: its job checkpoints and may
        be stopped, it has run at least ``cooldown_s`` and it has work left."""
        return (
            entry.job.movable
            and now - entry.started_s >= self.cooldown_s
            and entry.remaining_s(now) > 0
        )

    def resumed(self, entry: RunningJob, now: float) -> TrainingJob:
        """The job as it resumes elsewhere if stopped now: the work left at its newest
        checkpoint plus ``restart_s`` to reload it."""
        return dataclasses.replace(
            entry.job,
            duration_s=entry.resume_remaining_s(now) + self.restart_s,
            max_delay_s=None,  # it has started: only the deadline still binds
            start_window=None,
        )

    def work_rate(
        self,
        snapshot: Snapshot,
        kind: AcceleratorKind,
        nodes: IntArray,
        runtime_s: FloatArray | float,
    ) -> FloatArray:
        """Emissions (or cost) per reference second of one accelerator's work on each
        node over the next ``runtime_s`` (per node, or one for all): energy per second /
        speed × mean intensity (or price per kWh); NaN where the zone has no signal."""
        power_w = self.energy.member_power_w(
            snapshot, kind, nodes, 1, self.energy.training_utilisation
        )
        speed = snapshot.nodes.kind(kind).relative_speed[nodes]
        now = snapshot.now
        windows = window_means(
            self._grid,
            snapshot,
            nodes,
            np.full(nodes.size, now),
            now + np.broadcast_to(np.asarray(runtime_s, dtype=np.float64), (nodes.size,)),
            self.objective,
            currency=self.currency,
        )
        # A zone without a usable series gets a deliberately pessimistic stand-in for
        # placement; stopping running work needs a real signal on both sides: NaN.
        means = np.where(windows.fallback, np.nan, windows.values)
        scale = 1.0 if self.objective == "carbon" else 1.0 / 1000.0  # price is per MWh
        result: FloatArray = power_w / J_PER_KWH / speed * means * scale
        return result

    def _may_gain(
        self,
        snapshot: Snapshot,
        job: TrainingJob,
        kind: AcceleratorKind,
        current_rate: float,
        remaining_s: float,
        best_rates: dict[tuple[AcceleratorKind, int, int], float],
    ) -> bool:
        """Some node with room for one worker is at least ``min_saving`` cleaner per
        unit of work (``work_rate``) than ``current_rate``, that of the dirtiest node the
        job holds. The free nodes' best rate is computed once per pass for each (kind,
        worker size, whole hours of work left), so this costs a dictionary lookup per
        running job, not a pass over the cluster. A filter: with the time left rounded
        up to whole hours for the free nodes it may, rarely, turn away a move the full
        comparison would make."""
        table = snapshot.nodes
        columns = table.kind(kind)
        hours = max(1, math.ceil(remaining_s / HOUR_S))
        key = (kind, job.accelerators_per_worker, hours)
        best = best_rates.get(key)
        if best is None:
            room = np.flatnonzero(
                (columns.free >= job.accelerators_per_worker) & table.healthy & table.approved
            )
            rates = self.work_rate(
                snapshot, kind, room, hours * HOUR_S / columns.relative_speed[room]
            )
            rates = rates[np.isfinite(rates)]
            best = best_rates[key] = float(rates.min()) if rates.size else math.inf
        return best <= (1.0 - self.min_saving) * current_rate

    def run_total(
        self, snapshot: Snapshot, held: Sequence[Allocation], remaining_s: float | None
    ) -> float:
        """Emissions (or cost) of a gang's run from now (``_run``)."""
        return self._run(snapshot, held, remaining_s).total

    def _run(
        self, snapshot: Snapshot, held: Sequence[Allocation], remaining_s: float | None
    ) -> _GangRun:
        """A gang's run from now: ``remaining_s`` reference seconds at the speed of its
        slowest node, or, when None, until the allocations' expected end."""
        table = snapshot.nodes
        # A gang's workers share one kind; its main pool's figures stand for all of them
        # (migration judges training, which runs on whole GPUs).
        kind = held[0].accelerator_kind
        index = np.array([table.index[a.node_id] for a in held])
        speed = table.kind(kind).relative_speed[index]
        if remaining_s is None:
            runtime = max((a.expected_end or math.inf) for a in held) - snapshot.now
        else:
            runtime = remaining_s / float(speed.min())
        if not math.isfinite(runtime):
            return _GangRun(np.full(index.size, np.nan), speed, runtime)
        accelerators = np.array([a.accelerators for a in held], dtype=np.float64)
        return _GangRun(
            self.work_rate(snapshot, kind, index, runtime), accelerators * speed, runtime
        )


def trial_policy(policy: Policy) -> Policy:
    """``policy`` for a what-if placement of running work: where it would go now, on
    free capacity only (no start advice, preemption of any kind, deadline rescues
    included, backfill or runners-up)."""
    return dataclasses.replace(
        policy,
        start_advisor=None,
        preemption=False,
        deadline_preemption=False,
        backfill=False,
        runners_up=0,
    )


def apply_move(allocations: dict[str, Allocation], move: JobMove) -> None:
    """``allocations`` (by id) as they stand once ``move`` is made."""
    for allocation_id in move.stop:
        del allocations[allocation_id]
    for placement in move.placements:
        allocation = placement.to_allocation()
        allocations[allocation.allocation_id] = allocation


class _GangRun(NamedTuple):
    """Per member: emissions (or cost) per reference second of one accelerator's work
    (``Migrator.work_rate``) and reference seconds of work per second of wall time
    (accelerators × speed); and how long the run lasts."""

    rates: FloatArray
    work_per_s: FloatArray
    runtime_s: float

    @property
    def total(self) -> float:
        """Emissions (or cost) of the whole run (power is linear in the accelerators)."""
        return float((self.rates * self.work_per_s).sum() * self.runtime_s)
