"""Temporal shifting: start flexible training when the grid is cleanest.

A training job with a ``deadline`` or ``max_delay_s`` may start anywhere in
[now, latest safe start], where

    latest safe start = min(deadline − runtime on its slowest candidate node,
                            submitted_at + max_delay_s) − safety_margin_s

(the scheduler core enforces the same bound without the margin and ignores any
deferral beyond it). ``best_window`` finds, for one zone and run time, the start
with the lowest mean intensity over the whole run — the rolling-window minimum
of the Carbon Aware SDK's best-window search — over candidate starts at now and
at every hour boundary, limited to the forecast: a run must end within the
series (the recorded past plus the forecast horizon), so a job whose deadline lies
beyond the horizon can only be shifted within it, and one longer than the
horizon not at all.

``WindowShifter`` is the scheduler's ``StartAdvisor``. Per accelerator kind it
evaluates every distinct (zone, run time) of the job's candidate nodes, so the
choice is over (node, start) pairs: spatial and temporal shifting compose. It
compares

* now: the best expected emissions (energy × mean intensity) over the candidates
  with room for a member right now (over all candidates when none has room), with
* then: the best over all candidates and all allowed later starts at which the
  zone will have room for the whole gang (``_room``: demand forecast by
  persistence, minus this pass's placements and earlier deferrals, at most
  ``max_booked_share`` of a zone booked ahead),

and defers to "then" only when it saves at least ``min_saving`` (default 50 %: on the
evaluation lower thresholds bought tenths of a point for much longer waits, and
guarding the saving with the forecast's known error did no better; docs/green.md,
"When temporal shifting fires, and what it adds"). The scheduler asks again at every pass with the
latest forecast, so a deferral moves when the forecast does; at the latest safe
start the best allowed start is now, and the job starts regardless. With
``objective="price"`` the same search minimises electricity cost.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from cloud.scheduler import Booking, Candidates, Deferral, Snapshot, StartCandidates, TrainingJob
from cloud.scheduler.arrays import BoolArray, FloatArray
from cloud.signals.grid import GridSignals, ZoneSeries

from .energy import EnergyModel
from .window import GridWindows, ZoneWindows, window_means

HOUR_S = 3600.0
Objective = Literal["carbon", "price"]
# Defer only for at least half the emissions (or cost) of starting now: waiting
# crowds the clean hours, and migration (migration.py) already moves work that
# started on dirty capacity once clean capacity frees (docs/green.md, the
# min-saving table).
DEFAULT_MIN_SAVING = 0.5


def job_emission_scale(
    energy: EnergyModel,
    snapshot: Snapshot,
    job: TrainingJob,
    candidates: Candidates,
    objective: Objective,
) -> FloatArray:
    """Per candidate: what one unit of the zone's mean signal costs the whole job there
    (its kWh for gCO2eq/kWh; kWh / 1000 for currency/MWh)."""
    scale = energy.training_kwh(snapshot, job, candidates)
    return scale / 1000.0 if objective == "price" else scale


def zone_runtime_groups(
    snapshot: Snapshot, candidates: Candidates, scale: FloatArray
) -> list[tuple[int, float, BoolArray, float]]:
    """The candidates by (zone, run time), in order: (zone code, run time, which
    candidates, the least ``scale`` among them). Within a group only the zone's signal
    over the run tells starts apart."""
    zone_codes = snapshot.nodes.zone_code[candidates.nodes]
    runtimes = candidates.runtime_s
    groups = []
    for code, runtime in sorted(set(zip(zone_codes.tolist(), runtimes.tolist(), strict=True))):
        group = (zone_codes == code) & (runtimes == runtime)
        groups.append((code, runtime, group, float(scale[group].min())))
    return groups


def saving_words(objective: Objective, currency: str) -> tuple[str, str]:
    """(quantity, unit) a deferral's explanation names."""
    return ("CO2", "gCO2eq") if objective == "carbon" else ("cost", currency)


@dataclass(frozen=True, slots=True)
class Window:
    start_s: float
    mean: float  # gCO2eq/kWh (or currency/MWh) over [start, start + runtime)
    mean_now: float  # the same if started now


def candidate_starts(
    now_s: float, runtime_s: float, latest_start_s: float, horizon_end_s: float
) -> FloatArray:
    """Now, then every hour boundary up to the latest start whose run still ends
    within the forecast."""
    last = min(latest_start_s, horizon_end_s - runtime_s)
    first_boundary = math.floor(now_s / HOUR_S) * HOUR_S + HOUR_S
    if last < first_boundary:
        return np.array([now_s])
    boundaries = np.arange(first_boundary, last + 1e-6, HOUR_S)
    result: FloatArray = np.concatenate(([now_s], boundaries))
    return result


def best_window(
    series: ZoneSeries | ZoneWindows,
    now_s: float,
    runtime_s: float,
    latest_start_s: float,
    objective: Objective = "carbon",
    *,
    room: Callable[[FloatArray], BoolArray] | None = None,
) -> Window:
    """The start with the lowest mean over [start, start + runtime); ties: earliest.

    ``room(starts)`` (optional) says at which later starts there is capacity for the
    job; starts without it are not chosen (now always counts, as the reference).
    """
    windows = series if isinstance(series, ZoneWindows) else ZoneWindows(series)
    starts = candidate_starts(now_s, runtime_s, latest_start_s, windows.series.end_s)
    means = windows.mean(objective, starts, starts + runtime_s)
    if room is not None and starts.size > 1:
        allowed = room(starts)
        allowed[0] = True
        best = int(np.argmin(np.where(allowed, means, np.inf)))
    else:
        best = int(np.argmin(means))
    return Window(float(starts[best]), float(means[best]), float(means[0]))


@dataclass(frozen=True, slots=True)
class WindowShifter:
    signals: GridSignals
    energy: EnergyModel = field(default_factory=EnergyModel)
    objective: Objective = "carbon"
    min_saving: float = DEFAULT_MIN_SAVING
    safety_margin_s: float = 3600.0
    currency: str = "USD"
    _grid: GridWindows = field(init=False, repr=False, compare=False)
    max_booked_share: float = 0.5
    # The policy also migrates (migration.py): a job it may move (checkpoints, may be
    # stopped) is not held back; it starts now and is moved once cleaner capacity frees
    # (docs/green.md shows why).
    migrating: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "_grid", GridWindows(self.signals))
        if not 0.0 <= self.min_saving < 1.0:
            raise ValueError("min_saving must be within [0, 1)")
        if not self.safety_margin_s >= 0:
            raise ValueError("safety_margin_s must be >= 0")
        if not 0.0 < self.max_booked_share <= 1.0:
            raise ValueError("max_booked_share must be within (0, 1]")

    def latest_safe_start(self, job: TrainingJob, slowest_runtime_s: float) -> float:
        return job.latest_start(slowest_runtime_s) - self.safety_margin_s

    def advise(
        self,
        snapshot: Snapshot,
        job: TrainingJob,
        options: Sequence[StartCandidates],
        booked: Sequence[Booking] = (),
    ) -> Deferral | None:
        now = snapshot.now
        if not options or (self.migrating and job.movable):
            return None
        slowest = max(
            (float(o.candidates.runtime_s.max()) for o in options if o.candidates.nodes.size),
            default=0.0,
        )
        latest = self.latest_safe_start(job, slowest)
        if latest <= now:
            return None  # the latest safe start has come: start regardless
        need = job.workers * job.accelerators_per_worker
        best_now = math.inf  # among candidates with room now
        any_now = math.inf  # among all candidates, for when none has room
        best_then = math.inf
        best: tuple[float, str, StartCandidates, float] = (now, "", options[0], 0.0)
        zones = snapshot.nodes.zones
        for option in options:
            candidates = option.candidates
            if not candidates.nodes.size:
                continue
            scale = job_emission_scale(self.energy, snapshot, job, candidates, self.objective)
            for code, runtime, group, least in zone_runtime_groups(snapshot, candidates, scale):
                room = self._room(snapshot, booked, code, candidates, job)
                window = self._zone_window(snapshot, zones[code], runtime, latest, room)
                now_value = least * window.mean_now
                any_now = min(any_now, now_value)
                if bool(option.fits_now[group].any()):
                    best_now = min(best_now, now_value)
                then_value = least * window.mean
                if then_value < best_then or (then_value == best_then and window.start_s < best[0]):
                    best_then = then_value
                    best = (window.start_s, zones[code], option, runtime)
        start, zone, option, runtime = best
        reference = best_now if math.isfinite(best_now) else any_now
        # A price of exactly 0 now (negative ones are real) leaves no share to save: the
        # minimum saving is a share of it, and waiting is never worth it by that rule.
        if (
            not (math.isfinite(reference) and math.isfinite(best_then))
            or start <= now
            or reference == 0
        ):
            return None
        saving = reference - best_then
        if saving <= self.min_saving * abs(reference) or saving <= 0:
            return None
        quantity, unit = saving_words(self.objective, self.currency)
        return Deferral(
            start_at=start,
            latest_start=latest,
            zone=zone,
            saving_fraction=saving / abs(reference),
            expected_now=reference,
            expected_then=best_then,
            quantity=quantity,
            unit=unit,
            accelerator_kind=option.candidates.kind,
            accelerators=need,
            runtime_s=runtime,
        )

    def _room(
        self,
        snapshot: Snapshot,
        booked: Sequence[Booking],
        zone_code: int,
        candidates: Candidates,
        job: TrainingJob,
    ) -> Callable[[FloatArray], BoolArray]:
        """At which later starts the zone can take the whole gang.

        Demand is forecast by persistence: the zone stays as busy as it is now (work
        that ends is replaced by new arrivals), plus what this pass placed there, plus
        the deferrals this pass already booked into the zone at that time. Counted in
        whole workers per candidate node. Deferred work may also book at most
        ``max_booked_share`` of the zone's capacity, leaving the rest for work that
        cannot wait. Optimistic forecasts (only counting work that will still run)
        let every flexible job wait for the same clean hour and push the work that
        arrives then to dirty zones."""
        nodes = snapshot.nodes
        kind = candidates.kind
        per_member = job.accelerators_per_worker
        columns = candidates.pools(snapshot)
        in_zone = candidates.nodes[nodes.zone_code[candidates.nodes] == zone_code]
        free = columns.free[in_zone].astype(np.float64)
        position = {nodes.node_ids[n]: i for i, n in enumerate(in_zone.tolist())}
        zone = nodes.zones[zone_code]
        deferred: list[Booking] = []
        for booking in booked:
            if booking.accelerator_kind != kind:
                continue
            if booking.node_id is None:
                if booking.zone == zone:
                    deferred.append(booking)
            elif booking.node_id in position:
                free[position[booking.node_id]] -= booking.accelerators
        members = float(np.floor(np.maximum(free, 0.0) / per_member).sum())
        need = job.workers * per_member
        limit = self.max_booked_share * float(columns.capacity[in_zone].sum())

        def room(starts: FloatArray) -> BoolArray:
            promised = np.zeros(starts.size)
            for booking in deferred:
                promised += booking.accelerators * (
                    (booking.start_s <= starts) & (starts < booking.end_s)
                )
            left = members - np.ceil(promised / per_member)
            result: BoolArray = (left >= job.workers) & (promised + need <= limit)
            return result

        return room

    def _zone_window(
        self,
        snapshot: Snapshot,
        zone: str,
        runtime_s: float,
        latest_s: float,
        room: Callable[[FloatArray], BoolArray],
    ) -> Window:
        """The best window (with the mean if started now) for one zone and run time."""
        now = snapshot.now
        windows = self._grid.usable(zone, self.objective, self.currency)
        if windows is not None:
            return best_window(windows, now, runtime_s, latest_s, self.objective, room=room)
        # No usable series: the conservative fallback, taken as flat in time, so an
        # unknown zone is never a reason to wait (nor a clean place to wait for).
        index = int(np.flatnonzero(np.asarray(snapshot.nodes.zones) == zone)[0])
        node = np.flatnonzero(snapshot.nodes.zone_code == index)[:1]
        fallback = window_means(
            self._grid,
            snapshot,
            node,
            np.array([now]),
            np.array([now + runtime_s]),
            self.objective,
            currency=self.currency,
        )
        value = float(fallback.values[0])
        if not math.isfinite(value):
            value = math.inf
        return Window(now, value, value)
