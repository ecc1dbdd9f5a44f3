"""The grid as a node sees it over a run window: mean carbon intensity or price.

``window_means`` gives, per candidate node, the time-weighted mean of its zone's
series over [start, end) (vectorised: one numpy call per zone). A zone without a
usable series must never look good, so it gets a **conservative fallback**: the
highest mean over the same window among all zones the snapshot does know, or the
zone's static-table value (``cloud.signals.static``: 2022 annual mean intensity,
2023 mean price) when that is higher. Candidates on the fallback are flagged. If
nothing at all is known the value is NaN, which the scheduler's normalisation
ranks worst.

A series is unusable for price when any of its hours lacks a price or its
currency is not the one asked for (prices in different currencies do not compare).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Literal

import numpy as np

from cloud.scheduler import Snapshot
from cloud.scheduler.arrays import BoolArray, FloatArray, IntArray
from cloud.signals.grid import GridSignals, ZoneSeries, extended_values, integral_beyond_h
from cloud.signals.static import builtin_static_table

Quantity = Literal["carbon", "price"]

HOUR_S = 3600.0


class ZoneWindows:
    """Time-weighted window means of one ``ZoneSeries``, with the same semantics
    (hourly steps; the first value held before the series, its last day repeated past
    it: ``cloud.signals.grid``) but built for many small calls: one cumulative sum per
    quantity, then a handful of numpy operations per call."""

    __slots__ = ("_carbon", "_carbon_knots", "_hours", "_price", "_price_knots", "series")

    def __init__(self, series: ZoneSeries) -> None:
        self.series = series
        self._hours = series.carbon_g_per_kwh.size
        self._carbon = series.carbon_g_per_kwh
        self._price = np.nan_to_num(series.price_per_mwh, nan=0.0)
        self._carbon_knots = np.concatenate(([0.0], np.cumsum(self._carbon)))
        self._price_knots = np.concatenate(([0.0], np.cumsum(self._price)))

    def _integral_h(self, values: FloatArray, knots: FloatArray, at_s: FloatArray) -> FloatArray:
        """∫ value dt in value·hours from the series start to ``at_s``."""
        offset = (at_s - self.series.start_s) / HOUR_S
        inside = np.minimum(np.maximum(offset, 0.0), float(self._hours))
        index = np.minimum(inside.astype(np.int64), self._hours - 1)
        result: FloatArray = knots[index] + (inside - index) * values[index]
        if offset.size and offset.min() < 0:
            result = result + np.minimum(offset, 0.0) * values[0]
        if offset.size and offset.max() > self._hours:
            result = result + integral_beyond_h(values, offset - self._hours)
        return result

    def mean(self, quantity: Quantity, start_s: FloatArray, end_s: FloatArray) -> FloatArray:
        """Mean over [start, end) per element (the value at start where end == start)."""
        values, knots = (
            (self._carbon, self._carbon_knots)
            if quantity == "carbon"
            else (self._price, self._price_knots)
        )
        start = np.asarray(start_s, dtype=np.float64)
        end = np.asarray(end_s, dtype=np.float64)
        span_h = (end - start) / HOUR_S
        total = self._integral_h(values, knots, end) - self._integral_h(values, knots, start)
        positive = span_h > 0
        if positive.all():
            result: FloatArray = total / span_h
            return result
        at_start = extended_values(values, (start - self.series.start_s) // HOUR_S)
        return np.where(positive, total / np.where(positive, span_h, 1.0), at_start)


class GridWindows:
    """``ZoneWindows`` for every zone of a ``GridSignals`` snapshot."""

    __slots__ = ("_zones", "signals")

    def __init__(self, signals: GridSignals) -> None:
        self.signals = signals
        self._zones = {zone: ZoneWindows(series) for zone, series in signals.zones.items()}

    def zone(self, zone: str) -> ZoneWindows | None:
        return self._zones.get(zone)

    def usable(self, zone: str, quantity: Quantity, currency: str) -> ZoneWindows | None:
        """The zone's windows, or None when its series cannot answer for ``quantity``."""
        found = self._zones.get(zone)
        return found if found is not None and usable(found.series, quantity, currency) else None

    @property
    def all(self) -> tuple[ZoneWindows, ...]:
        return tuple(self._zones.values())


@dataclass(frozen=True, slots=True)
class WindowMeans:
    values: FloatArray  # per candidate: gCO2eq/kWh or currency/MWh
    fallback: BoolArray  # per candidate: its zone had no usable series


@cache
def static_carbon_g_per_kwh() -> Mapping[str, float]:
    return {zone: entry.carbon_g_per_kwh for zone, entry in builtin_static_table().items()}


@cache
def static_price_per_mwh() -> Mapping[str, float]:
    return {
        zone: entry.price_per_mwh
        for zone, entry in builtin_static_table().items()
        if entry.price_per_mwh is not None and entry.currency == "USD"
    }


def usable(series: ZoneSeries | None, quantity: Quantity, currency: str) -> bool:
    if series is None:
        return False
    return quantity == "carbon" or (series.has_price and series.currency == currency)


def unknown_zones(
    signals: GridSignals, zones: tuple[str, ...], quantity: Quantity, currency: str = "USD"
) -> tuple[str, ...]:
    """The zones among ``zones`` that would get the fallback."""
    return tuple(z for z in zones if not usable(signals.series(z), quantity, currency))


def window_means(
    grid: GridWindows | GridSignals,
    snapshot: Snapshot,
    nodes: IntArray,
    start_s: FloatArray,
    end_s: FloatArray,
    quantity: Quantity,
    *,
    currency: str = "USD",
    static_fallback: Mapping[str, float] | None = None,
) -> WindowMeans:
    """Mean of ``quantity`` over [start_s, end_s) for each candidate node (arrays
    aligned with ``nodes``)."""
    table = snapshot.nodes
    return zone_window_means(
        grid,
        table.zones,
        table.zone_code[nodes],
        start_s,
        end_s,
        quantity,
        currency=currency,
        static_fallback=static_fallback,
    )


def zone_window_means(
    grid: GridWindows | GridSignals,
    zones: Sequence[str],
    zone_codes: IntArray,
    start_s: FloatArray,
    end_s: FloatArray,
    quantity: Quantity,
    *,
    currency: str = "USD",
    static_fallback: Mapping[str, float] | None = None,
) -> WindowMeans:
    """Mean of ``quantity`` over [start_s, end_s) for each row, whose zone is
    ``zones[zone_codes[row]]``."""
    if isinstance(grid, GridSignals):
        grid = GridWindows(grid)
    values = np.full(zone_codes.size, np.nan)
    fallback = np.zeros(zone_codes.size, dtype=np.bool_)
    for code in np.unique(zone_codes).tolist():
        windows = grid.usable(zones[code], quantity, currency)
        if windows is None:
            fallback |= zone_codes == code
        elif code == zone_codes[0] and (zone_codes == code).all():
            values = windows.mean(quantity, start_s, end_s)
        else:
            mask = zone_codes == code
            values[mask] = windows.mean(quantity, start_s[mask], end_s[mask])
    if fallback.any():
        values[fallback] = _fallback(
            grid,
            [zones[c] for c in zone_codes[fallback].tolist()],
            start_s[fallback],
            end_s[fallback],
            quantity,
            currency,
            static_fallback,
        )
    return WindowMeans(values, fallback)


def _fallback(
    grid: GridWindows,
    zones: list[str],
    start_s: FloatArray,
    end_s: FloatArray,
    quantity: Quantity,
    currency: str,
    static_fallback: Mapping[str, float] | None,
) -> FloatArray:
    highest = np.full(len(zones), -np.inf)
    for windows in grid.all:
        if usable(windows.series, quantity, currency):
            highest = np.maximum(highest, windows.mean(quantity, start_s, end_s))
    if static_fallback is None:
        if quantity == "carbon":
            static_fallback = static_carbon_g_per_kwh()
        else:
            static_fallback = static_price_per_mwh() if currency == "USD" else {}
    static = np.array([static_fallback.get(zone, -np.inf) for zone in zones])
    result: FloatArray = np.maximum(highest, static)
    result[~np.isfinite(result)] = np.nan
    return result
