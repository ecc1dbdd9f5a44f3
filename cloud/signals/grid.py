"""GridSignals: the immutable, hourly view of carbon and price that scoring reads.

The scheduler core does no I/O, so before each pass the control plane (or the
simulator) freezes what it knows into a `GridSignals`: per zone, hourly values
from some point in the past through the forecast horizon. Scores then ask for
time-weighted means over a job's run window, vectorised over candidate nodes.

Beyond the last known hour a series repeats its last day (`CYCLE_HOURS`, or all of
it where it is shorter): a seasonal-naive extension, so that a window reaching past the
forecast horizon (a job that runs for days) is scored by the zone's daily cycle, not by
whichever hour of the day the horizon happened to end on. Before its first hour it holds
its first value. Unknown zones have no series: callers decide what that means (the
carbon term uses a documented fallback intensity).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np
import numpy.typing as npt

from cloud.signals.model import SignalType

FloatArray = npt.NDArray[np.float64]

HOUR_S = 3600.0
# The period a series repeats beyond its last hour: one day, the grid's strongest cycle.
CYCLE_HOURS = 24


def extended_values(values: FloatArray, hours: npt.ArrayLike) -> FloatArray:
    """``values`` at hour indices ``hours``, extended as the module docstring says:
    the first value before index 0, the last day repeated past the end."""
    index = np.asarray(hours, dtype=np.int64)
    period = min(CYCLE_HOURS, values.size)
    past = index - values.size
    cycled = values.size - period + np.mod(past, period)
    result: FloatArray = values[np.where(index < 0, 0, np.where(past >= 0, cycled, index))]
    return result


def integral_beyond_h(values: FloatArray, excess_h: FloatArray) -> FloatArray:
    """∫ value dt in value·hours over the first ``excess_h`` hours (>= 0) past the end
    of ``values``, which repeat their last day there (`extended_values`)."""
    period = min(CYCLE_HOURS, values.size)
    cycle = values[values.size - period :]
    cycle_knots = np.concatenate(([0.0], np.cumsum(cycle)))
    excess = np.maximum(np.asarray(excess_h, dtype=np.float64), 0.0)
    whole = np.floor(excess / period)
    rest = excess - whole * period
    step = np.minimum(rest.astype(np.int64), period - 1)
    result: FloatArray = whole * cycle_knots[-1] + cycle_knots[step] + (rest - step) * cycle[step]
    return result


def _read_only(values: npt.ArrayLike) -> FloatArray:
    array = np.array(values, dtype=np.float64)
    array.setflags(write=False)
    return array


@dataclass(frozen=True, slots=True, eq=False)
class ZoneSeries:
    """Hourly carbon intensity and price of one zone; hour i starts at start_s + i·3600."""

    zone: str
    start_s: float
    carbon_g_per_kwh: FloatArray
    price_per_mwh: FloatArray  # NaN where no price is known
    signal_type: SignalType = "average"
    currency: str = "USD"
    stale: bool = False
    source: str = ""
    # Running integrals at every hour boundary, for O(log n) window means.
    _carbon_knots: FloatArray = field(init=False, repr=False)
    _price_knots: FloatArray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        carbon = _read_only(self.carbon_g_per_kwh)
        price = _read_only(self.price_per_mwh)
        if carbon.ndim != 1 or carbon.size == 0:
            raise ValueError(f"{self.zone}: a series needs at least one hourly value")
        if price.shape != carbon.shape:
            raise ValueError(f"{self.zone}: price and carbon series differ in length")
        if not np.all(np.isfinite(carbon)) or np.any(carbon < 0):
            raise ValueError(f"{self.zone}: carbon intensity must be finite and >= 0")
        object.__setattr__(self, "carbon_g_per_kwh", carbon)
        object.__setattr__(self, "price_per_mwh", price)
        object.__setattr__(self, "_carbon_knots", self._knots(carbon))
        object.__setattr__(self, "_price_knots", self._knots(np.nan_to_num(price, nan=0.0)))

    @staticmethod
    def _knots(values: FloatArray) -> FloatArray:
        return _read_only(np.concatenate(([0.0], np.cumsum(values * HOUR_S))))

    @property
    def end_s(self) -> float:
        return self.start_s + self.carbon_g_per_kwh.size * HOUR_S

    @property
    def has_price(self) -> bool:
        return bool(np.all(np.isfinite(self.price_per_mwh)))

    def _integral(self, knots: FloatArray, values: FloatArray, at_s: FloatArray) -> FloatArray:
        """∫ value dt from start_s to at_s, the series extended outside its hours as the
        module docstring says."""
        offset = at_s - self.start_s
        inside = np.interp(offset, np.arange(knots.size) * HOUR_S, knots)
        before = np.minimum(offset, 0.0) * values[0]
        after = HOUR_S * integral_beyond_h(values, (offset - values.size * HOUR_S) / HOUR_S)
        result: FloatArray = inside + before + after
        return result

    def mean_carbon_g_per_kwh(
        self, start_s: float | FloatArray, end_s: float | FloatArray
    ) -> FloatArray:
        """Time-weighted mean intensity over [start, end) (the value at start if end == start)."""
        return self._mean(self._carbon_knots, self.carbon_g_per_kwh, start_s, end_s)

    def mean_price_per_mwh(
        self, start_s: float | FloatArray, end_s: float | FloatArray
    ) -> FloatArray:
        prices = np.nan_to_num(self.price_per_mwh, nan=0.0)
        return self._mean(self._price_knots, prices, start_s, end_s)

    def _mean(
        self,
        knots: FloatArray,
        values: FloatArray,
        start_s: float | FloatArray,
        end_s: float | FloatArray,
    ) -> FloatArray:
        start = np.asarray(start_s, dtype=np.float64)
        end = np.asarray(end_s, dtype=np.float64)
        span = end - start
        if np.any(span < 0):
            raise ValueError("a window must not end before it starts")
        total = self._integral(knots, values, end) - self._integral(knots, values, start)
        at_start = extended_values(values, (start - self.start_s) // HOUR_S)
        result: FloatArray = np.where(span > 0, total / np.where(span > 0, span, 1.0), at_start)
        return result

    def carbon_at(self, at_s: float) -> float:
        return float(self.mean_carbon_g_per_kwh(at_s, at_s))


@dataclass(frozen=True, slots=True)
class GridSignals:
    """Everything a scheduling pass knows about the grid at `now_s` (UTC epoch seconds)."""

    now_s: float
    zones: Mapping[str, ZoneSeries] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "zones", MappingProxyType(dict(self.zones)))

    def series(self, zone: str) -> ZoneSeries | None:
        return self.zones.get(zone)

    @property
    def stale_zones(self) -> tuple[str, ...]:
        return tuple(sorted(zone for zone, series in self.zones.items() if series.stale))
