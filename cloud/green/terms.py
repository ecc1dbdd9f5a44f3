"""The green score terms: carbon, price and latency, plugged into the scheduler's
``ScoreTerm`` hook.

Each term carries the ``GridSignals`` (and energy model, latency estimator) it was
built with; the control plane or simulator builds fresh terms for every pass (or
every hour: the signals change hourly). All are lower-is-better raw values per
candidate node:

==========  ===================================================  ==========
term        raw value                                            unit
==========  ===================================================  ==========
carbon      kWh × mean intensity of the node's zone over the     gCO2eq
            run window [now, now + runtime]
price       kWh × mean price over the same window / 1000         currency
latency     traffic-weighted RTT + compute (``ServingLatency``)  ms
==========  ===================================================  ==========

For a training job kWh is the whole job's (``EnergyModel.training_kwh``) and
runtime is ``duration_s / relative_speed`` on that node; for an inference
deployment it is ``inference_window_s`` (default 24 h) of all its replicas at the
expected load. Latency applies to deployments only; for training every node gets
0, which carries no preference.

Normalisation: relative to the largest value among the job's candidates of one
accelerator kind, ``bounds=(min(0, lowest), highest)``, so that the score is
``1 − raw / highest``: a node emitting half as much scores 0.5 higher whatever
the job's size, and small differences stay small (unlike min–max, which would
stretch a 2 % difference to the full weight). A zone without a series gets the
conservative fallback of ``window.window_means`` and so is never favoured.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from cloud.scheduler import Candidates, InferenceDeployment, Snapshot, TermValues, Work
from cloud.scheduler.arrays import FloatArray
from cloud.signals.grid import GridSignals

from .energy import EnergyModel
from .latency import ServingLatency
from .window import GridWindows, Quantity, WindowMeans, unknown_zones, window_means

DEFAULT_INFERENCE_WINDOW_S = 24 * 3600.0


def relative_bounds(raw: FloatArray) -> tuple[float, float] | None:
    finite = raw[np.isfinite(raw)]
    if finite.size == 0:
        return None
    return (min(0.0, float(finite.min())), float(finite.max()))


def run_window(
    snapshot: Snapshot, candidates: Candidates, inference_window_s: float
) -> tuple[FloatArray, FloatArray]:
    start = np.full(candidates.nodes.size, snapshot.now)
    runtime = np.where(np.isfinite(candidates.runtime_s), candidates.runtime_s, inference_window_s)
    return start, start + runtime


# Window means a term keeps (`_GridTerm._means`): a pass meets a few shapes per kind.
_MEMO_ENTRIES = 1024


@dataclass(frozen=True, slots=True)
class _GridTerm:
    signals: GridSignals
    energy: EnergyModel = field(default_factory=EnergyModel)
    inference_window_s: float = DEFAULT_INFERENCE_WINDOW_S
    currency: str = "USD"
    _grid: GridWindows = field(init=False, repr=False, compare=False)
    # The means already computed, by what they depend on (`_means`).
    _memo: dict[tuple[object, ...], tuple[FloatArray, WindowMeans]] = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "_grid", GridWindows(self.signals))
        object.__setattr__(self, "_memo", {})

    def _means(
        self, snapshot: Snapshot, candidates: Candidates, quantity: Quantity
    ) -> tuple[FloatArray, WindowMeans]:
        """The grid's mean over each candidate's run window. Work alike in a queue asks
        for the same candidates and run times again and again, and the windows are most
        of a term's cost: the answers are kept, by value (the candidates' zones and run
        times), for the life of the term (a scheduling pass builds its own)."""
        table = snapshot.nodes
        key = (  # everything window_means reads
            quantity,
            snapshot.now,
            table.zones,
            table.zone_code[candidates.nodes].tobytes(),
            candidates.runtime_s.tobytes(),
        )
        found = self._memo.get(key)
        if found is not None:
            return found
        start, end = run_window(snapshot, candidates, self.inference_window_s)
        means = window_means(
            self._grid, snapshot, candidates.nodes, start, end, quantity, currency=self.currency
        )
        for shared in (start, means.values, means.fallback):
            shared.setflags(write=False)  # handed out again: nobody may change them
        if len(self._memo) >= _MEMO_ENTRIES:
            self._memo.clear()
        self._memo[key] = (start, means)
        return start, means


@dataclass(frozen=True, slots=True)
class CarbonTerm(_GridTerm):
    """Estimated emissions (gCO2eq) of the work on each candidate."""

    @property
    def name(self) -> str:
        return "carbon"

    def grams(self, snapshot: Snapshot, work: Work, candidates: Candidates) -> FloatArray:
        kwh = self.energy.work_kwh(snapshot, work, candidates, self.inference_window_s)
        _, means = self._means(snapshot, candidates, "carbon")
        result: FloatArray = kwh * means.values
        return result

    def evaluate(self, snapshot: Snapshot, work: Work, candidates: Candidates) -> TermValues:
        raw = self.grams(snapshot, work, candidates)
        return TermValues(self.name, raw, higher_is_better=False, bounds=relative_bounds(raw))

    def fallback_zones(self, snapshot: Snapshot) -> tuple[str, ...]:
        """Zones of the snapshot scored on the conservative fallback (no series)."""
        return unknown_zones(self.signals, snapshot.nodes.zones, "carbon")


@dataclass(frozen=True, slots=True)
class PriceTerm(_GridTerm):
    """Estimated electricity cost (in ``currency``) of the work on each candidate."""

    @property
    def name(self) -> str:
        return "price"

    def cost(self, snapshot: Snapshot, work: Work, candidates: Candidates) -> FloatArray:
        kwh = self.energy.work_kwh(snapshot, work, candidates, self.inference_window_s)
        _, means = self._means(snapshot, candidates, "price")
        result: FloatArray = kwh * means.values / 1000.0
        return result

    def evaluate(self, snapshot: Snapshot, work: Work, candidates: Candidates) -> TermValues:
        raw = self.cost(snapshot, work, candidates)
        return TermValues(self.name, raw, higher_is_better=False, bounds=relative_bounds(raw))

    def fallback_zones(self, snapshot: Snapshot) -> tuple[str, ...]:
        return unknown_zones(self.signals, snapshot.nodes.zones, "price", self.currency)


# How far ahead clean capacity is valued: about the run of a typical training job.
CAPACITY_HORIZON_S = 4 * 3600.0


@dataclass(frozen=True, slots=True)
class CleanCapacity:
    """The scheduler's ``CapacityValue`` for green placement: a node's capacity is
    worth what a unit of work emits less there than on the dirtiest node of the same
    pool column, over the next ``horizon_s``: 1 − e/e_max, with e = the zone's mean
    intensity (or price) × the device's power per unit of speed. Shape fit weighs
    fragmentation by it, so that a clean 8-GPU node stays whole for an 8-GPU worker
    while the same member fits a clean 4-GPU node; fragmenting dirty capacity costs
    next to nothing. A zone without a series is worth 0 (placement already scores it
    pessimistically)."""

    signals: GridSignals
    energy: EnergyModel = field(default_factory=EnergyModel)
    quantity: Quantity = "carbon"
    horizon_s: float = CAPACITY_HORIZON_S
    currency: str = "USD"

    def node_values(self, snapshot: Snapshot, column: int) -> FloatArray:
        table = snapshot.nodes
        pools = table.kinds[column]
        rows = np.flatnonzero(pools.capacity > 0)
        values = np.zeros(snapshot.node_count)
        if rows.size == 0:
            return values
        start = np.full(rows.size, snapshot.now)
        means = window_means(
            self.signals,
            snapshot,
            rows,
            start,
            start + self.horizon_s,
            self.quantity,
            currency=self.currency,
        )
        power_w = self.energy.member_power_w(
            snapshot, pools.kind, rows, 1, self.energy.training_utilisation, column=column
        )
        per_work = np.where(
            means.fallback, np.nan, means.values * power_w / pools.relative_speed[rows]
        )
        finite = np.isfinite(per_work)
        if not finite.any():
            return values
        worst = float(per_work[finite].max())
        if worst > 0:
            values[rows[finite]] = 1.0 - per_work[finite] / worst
        return values


@dataclass(frozen=True, slots=True)
class LatencyTerm:
    """Estimated request latency (ms) of a deployment's replica on each candidate."""

    estimator: ServingLatency

    @property
    def name(self) -> str:
        return "latency"

    def evaluate(self, snapshot: Snapshot, work: Work, candidates: Candidates) -> TermValues:
        if isinstance(work, InferenceDeployment):
            raw = np.asarray(self.estimator.estimate_ms(snapshot, work, candidates))
        else:
            raw = np.zeros(candidates.nodes.size)
        return TermValues(self.name, raw, higher_is_better=False, bounds=relative_bounds(raw))
