"""Waiting for cleaner capacity: a training job may be held a little while when clean
nodes that are full now will free up soon.

Under load the clean pools fill first and the overflow starts on dirty (and often
slow) nodes, although the clean ones free within minutes as their jobs end. The
offline optimum (cloud/eval/bound.py) keeps the clean pools full all the time; a
scheduler that starts every job at once leaves them idle between a job's end and the
next arrival. ``CapacityWaiter`` is a ``StartAdvisor`` that holds any training job
up to ``patience_s`` after its submission, and no longer than ``patience_share`` of
its own run (``Policy.patience_s``; the scheduler core never lets it hold one longer)
when:

* the best place it could start now emits E_now (energy of the whole job there ×
  the zone's mean intensity over the run, the carbon term's figures), and
* a group of its candidates (one zone, one run time) will have room for the whole
  gang at some t ≤ the patience, counted from the expected ends of the training
  running there (inference never ends) and this pass's own placements and
  deferrals, where it would emit E_then ≤ E_now − ``min_saving`` · |E_now| (the
  absolute value for prices below zero).

It then defers to the earliest such t with the least E_then. At t the scheduler asks
again: the freed node now fits, so the job starts there (or, if another job took
it, it may wait again within its patience, then starts wherever it can). Flexible
jobs are first offered to the temporal shifter it wraps (``then``); only when that
keeps them running now are they judged here too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from cloud.scheduler import (
    Booking,
    Deferral,
    Snapshot,
    StartAdvisor,
    StartCandidates,
    TrainingJob,
)
from cloud.scheduler.arrays import IntArray
from cloud.scheduler.model import KIND_INDEX
from cloud.signals.grid import GridSignals

from .energy import EnergyModel
from .shifting import Objective, job_emission_scale, saving_words, zone_runtime_groups
from .window import GridWindows, ZoneWindows

# Wait only for at least this much less CO2 (or cost) than starting now: a wait is
# paid in queueing time, and the freed node may go to someone else.
DEFAULT_WAIT_MIN_SAVING = 0.3
# How long after its submission a training job may be held for cleaner capacity, and
# at most what share of its own run: short jobs, most of the count and little of the
# energy, barely wait (a 20-minute job 5 minutes; a 2-hour one the full 30).
DEFAULT_PATIENCE_S = 1800.0
DEFAULT_PATIENCE_SHARE = 0.25


@dataclass(slots=True)
class _Ends:
    """Per (node row, pool column): the training running there, as (end, accelerators),
    for the snapshot it was built from."""

    snapshot: Snapshot | None = None
    by_pool: dict[tuple[int, int], list[tuple[float, int]]] = field(default_factory=dict)
    # `CapacityWaiter._timeline`'s answers for this snapshot, by what they depend on.
    timelines: dict[tuple[object, ...], list[tuple[float, int]]] = field(default_factory=dict)
    promised: dict[tuple[str, int], list[tuple[float, float, int]]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CapacityWaiter:
    signals: GridSignals
    energy: EnergyModel
    patience_s: float
    min_saving: float = DEFAULT_WAIT_MIN_SAVING
    objective: Objective = "carbon"
    currency: str = "USD"
    then: StartAdvisor | None = None  # asked first for flexible jobs
    patience_share: float = DEFAULT_PATIENCE_SHARE  # of the job's reference run time
    _grid: GridWindows = field(init=False, repr=False, compare=False)
    _ends: _Ends = field(default_factory=_Ends, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_grid", GridWindows(self.signals))
        if not 0.0 <= self.min_saving < 1.0:
            raise ValueError("min_saving must be within [0, 1)")
        if not self.patience_s >= 0:
            raise ValueError("patience_s must be >= 0")

    def advise(
        self,
        snapshot: Snapshot,
        job: TrainingJob,
        options: Sequence[StartCandidates],
        booked: Sequence[Booking] = (),
    ) -> Deferral | None:
        if self.then is not None and job.flexible:
            deferral = self.then.advise(snapshot, job, options, booked)
            if deferral is not None:
                return deferral
        now = snapshot.now
        latest = job.submitted_at + min(self.patience_s, self.patience_share * job.duration_s)
        for option in options:
            if option.candidates.nodes.size:
                latest = min(latest, job.latest_start(float(option.candidates.runtime_s.max())))
        if latest <= now or not options:
            return None
        best_now = math.inf
        best: tuple[float, float, str, StartCandidates, float] | None = None
        for option in options:
            for value_now, then in self._groups(snapshot, job, option, booked, now, latest):
                best_now = min(best_now, value_now)
                if then is not None and (best is None or then[1] < best[1]):
                    best = (then[0], then[1], then[2], option, then[3])
        if best is None or not math.isfinite(best_now):
            return None  # nothing fits now (the job waits anyway), or nothing to wait for
        start, expected_then, zone, option, runtime = best
        saving = best_now - expected_then
        # Against the size of the reference, as temporal shifting judges: at negative
        # prices `min_saving * best_now` is below zero and any saving would pass. A
        # reference of 0 has no share to save (and nothing to divide by).
        if start <= now or best_now == 0 or saving <= 0:
            return None
        if saving < self.min_saving * abs(best_now):
            return None
        quantity, unit = saving_words(self.objective, self.currency)
        return Deferral(
            start_at=start,
            latest_start=latest,
            zone=zone,
            saving_fraction=saving / abs(best_now),
            expected_now=best_now,
            expected_then=expected_then,
            quantity=quantity,
            unit=unit,
            cause="capacity",
            accelerator_kind=option.candidates.kind,
            accelerators=job.workers * job.accelerators_per_worker,
            runtime_s=runtime,
        )

    def _groups(
        self,
        snapshot: Snapshot,
        job: TrainingJob,
        option: StartCandidates,
        booked: Sequence[Booking],
        now: float,
        latest: float,
    ) -> list[tuple[float, tuple[float, float, str, float] | None]]:
        """Per (zone, run time) of the option's candidates: the best value if started now
        where a member fits (inf where none does), and the earliest best wait, if any:
        (start, value then, zone, run time)."""
        candidates = option.candidates
        if not candidates.nodes.size:
            return []
        table = snapshot.nodes
        scale = job_emission_scale(self.energy, snapshot, job, candidates, self.objective)
        pools = candidates.pools(snapshot)
        column = KIND_INDEX[candidates.kind] if candidates.column is None else candidates.column
        results: list[tuple[float, tuple[float, float, str, float] | None]] = []
        for code, runtime, group, least in zone_runtime_groups(snapshot, candidates, scale):
            zone = table.zones[code]
            windows = self._grid.usable(zone, self.objective, self.currency)
            if windows is None:
                continue  # a zone without a signal is never a reason to wait
            value_now = (
                least * self._mean(windows, now, runtime)
                if bool(option.fits_now[group].any())
                else math.inf
            )
            start = self._room_at(
                snapshot, job, candidates.nodes[group], column, pools.free, booked, zone, latest
            )
            then = None
            if start is not None and start > now:
                then = (start, least * self._mean(windows, start, runtime), zone, runtime)
            results.append((value_now, then))
        return results

    def _mean(self, windows: ZoneWindows, start_s: float, runtime_s: float) -> float:
        means = windows.mean(self.objective, np.array([start_s]), np.array([start_s + runtime_s]))
        return float(means[0])

    def _room_at(
        self,
        snapshot: Snapshot,
        job: TrainingJob,
        nodes: IntArray,
        column: int,
        free_now: IntArray,
        booked: Sequence[Booking],
        zone: str,
        latest: float,
    ) -> float | None:
        """The earliest time in (now, latest] at which these nodes hold the whole gang,
        counting the training that ends there by then; None if not before latest."""
        per_member = job.accelerators_per_worker
        promised = self._promised(snapshot, booked, zone)
        for end, members in self._timeline(snapshot, nodes, column, free_now, booked, per_member):
            if end > latest:
                return None
            held = sum(a for s, e, a in promised if s <= end < e)
            if members - math.ceil(held / per_member) >= job.workers:
                return end
        return None

    def _promised(
        self, snapshot: Snapshot, booked: Sequence[Booking], zone: str
    ) -> list[tuple[float, float, int]]:
        """Deferrals into `zone` with no node yet, as (start, end, accelerators): they
        hold capacity while they run. Kept per zone and bookings so far (a pass only
        adds bookings, and asks for every queued job)."""
        self._pool_ends(snapshot)  # the cache is the snapshot's
        key = (zone, len(booked))
        found = self._ends.promised.get(key)
        if found is None:
            found = [
                (b.start_s, b.end_s, b.accelerators)
                for b in booked
                if b.node_id is None and b.zone == zone
            ]
            self._ends.promised[key] = found
        return found

    def _timeline(
        self,
        snapshot: Snapshot,
        nodes: IntArray,
        column: int,
        free_now: IntArray,
        booked: Sequence[Booking],
        per_member: int,
    ) -> list[tuple[float, int]]:
        """As the training on these nodes ends (and deferrals placed on them end): each
        end, and the members of `per_member` accelerators the nodes hold just after it.
        Alike for every queued job of the same shape, so kept for the snapshot (by the
        nodes, their free capacity and the bookings so far: a pass only adds bookings)."""
        ends = self._pool_ends(snapshot)
        key = (column, per_member, len(booked), nodes.tobytes(), free_now[nodes].tobytes())
        timelines = self._ends.timelines
        found = timelines.get(key)
        if found is not None:
            return found
        now = snapshot.now
        index = snapshot.nodes.index
        free = {int(n): float(free_now[n]) for n in nodes.tolist()}
        events: list[tuple[float, int, int]] = []  # (end, node, accelerators)
        for node in free:
            for end, accelerators in ends.get((node, column), ()):
                if now < end:
                    events.append((end, node, accelerators))
        for booking in booked:
            if booking.node_id is None:
                continue
            placed = index.get(booking.node_id)
            if placed is not None and placed in free:
                free[placed] -= booking.accelerators
                if now < booking.end_s:
                    events.append((booking.end_s, placed, booking.accelerators))

        def held_by(accelerators_free: float) -> int:  # members one node holds
            return math.floor(max(0.0, accelerators_free) / per_member)

        # Members held, kept up as each end frees a node's accelerators.
        members = sum(held_by(f) for f in free.values())
        timeline = []
        for end, node, accelerators in sorted(events):
            before = held_by(free[node])
            free[node] += accelerators
            members += held_by(free[node]) - before
            timeline.append((end, members))
        timelines[key] = timeline
        return timeline

    def _pool_ends(self, snapshot: Snapshot) -> dict[tuple[int, int], list[tuple[float, int]]]:
        """The snapshot's training with an expected end, per (node row, pool column);
        built once per snapshot (one pass asks for every job)."""
        cache = self._ends
        if cache.snapshot is not snapshot:
            table = snapshot.nodes
            by_pool: dict[tuple[int, int], list[tuple[float, int]]] = {}
            for alloc in snapshot.allocations:
                if alloc.expected_end is None:
                    continue
                node = table.index[alloc.node_id]
                column = table.column_of(node, alloc.accelerator_kind, alloc.accelerator_model)
                by_pool.setdefault((node, column), []).append(
                    (alloc.expected_end, alloc.accelerators)
                )
            cache.snapshot, cache.by_pool = snapshot, by_pool
            cache.timelines.clear()
            cache.promised.clear()
        return cache.by_pool
