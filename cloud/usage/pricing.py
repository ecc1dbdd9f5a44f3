"""Metered energy into hourly usage rows: kWh, gCO2eq, cost and the counterfactual's
gCO2eq, from the grid as it was recorded (pure).

Each increment is split at UTC hour boundaries (its energy shared in proportion to
time). Emissions and cost use `cloud.green.window.zone_window_means` over the
increment's own interval: the zone's recorded values, never the forecast the
scheduler decided on, with the same conservative fallback as `greenfed eval` (the
row is flagged). Cost is in the zone's own currency. The counterfactual emits, for
each kWh the work used, the baseline's kWh per zone (`zone_factors`, decided at
placement with the energy model) at those zones' recorded intensity over the same
interval.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from cloud.green.energy import J_PER_KWH
from cloud.green.window import GridWindows, zone_window_means
from cloud.signals.grid import GridSignals
from cloud.store import CounterfactualRecord, UsageHour
from cloud.usage.meter import Increment

HOUR_S = 3600.0
FALLBACK_CURRENCY = "USD"  # the static table's prices


@dataclass(frozen=True, slots=True)
class Priced:
    increment: Increment
    zone: str
    work_kind: str


def _pieces(increments: Sequence[Priced]) -> list[tuple[Priced, float, float, float]]:
    """(increment, start, end, share of its energy) per UTC hour it touches."""
    result = []
    for item in increments:
        start, end = item.increment.start_s, item.increment.end_s
        span = end - start
        if span <= 0:
            continue
        hour = math.floor(start / HOUR_S) * HOUR_S
        while hour < end:
            piece_start, piece_end = max(start, hour), min(end, hour + HOUR_S)
            if piece_end > piece_start:
                result.append((item, piece_start, piece_end, (piece_end - piece_start) / span))
            hour += HOUR_S
    return result


def price(
    increments: Sequence[Priced],
    grid: GridSignals,
    counterfactuals: Mapping[str, CounterfactualRecord],
    *,
    pue: float = 1.0,
    grid_offset_s: float = 0.0,
) -> list[UsageHour]:
    """The usage rows of `increments`, summed per allocation, node and hour.
    `grid_offset_s`: the grid's clock minus the increments' (a replayed trace)."""
    pieces = _pieces(increments)
    if not pieces:
        return []
    windows = GridWindows(grid)
    zones = sorted({item.zone for item, *_ in pieces} | _cf_zones(counterfactuals))
    code = {zone: number for number, zone in enumerate(zones)}
    codes = np.array([code[item.zone] for item, *_ in pieces], dtype=np.int64)
    start = np.array([p[1] for p in pieces]) + grid_offset_s
    end = np.array([p[2] for p in pieces]) + grid_offset_s
    share = np.array([p[3] for p in pieces])
    joules = np.array([p[0].increment.energy_j for p in pieces]) * share * pue
    kwh = joules / J_PER_KWH
    carbon = zone_window_means(windows, zones, codes, start, end, "carbon")
    stale = np.array([_stale(grid, zones[c]) for c in codes.tolist()], dtype=np.bool_)
    currencies = [_currency(grid, zones[c]) for c in codes.tolist()]
    prices = np.full(len(pieces), np.nan)
    price_fallback = np.zeros(len(pieces), dtype=np.bool_)
    for currency in sorted(set(currencies)):
        rows = np.array([i for i, c in enumerate(currencies) if c == currency])
        means = zone_window_means(
            windows, zones, codes[rows], start[rows], end[rows], "price", currency=currency
        )
        prices[rows] = means.values
        price_fallback[rows] = means.fallback
    carbon_values = np.nan_to_num(carbon.values, nan=0.0)
    fallback = carbon.fallback | price_fallback | stale | ~np.isfinite(carbon.values)
    fallback |= ~np.isfinite(prices)
    gco2 = kwh * carbon_values
    cost = kwh * np.nan_to_num(prices, nan=0.0) / 1000.0
    baseline = _counterfactual_gco2(pieces, kwh, start, end, windows, zones, counterfactuals)

    rows_by_key: dict[tuple[str, int, str, float], UsageHour] = {}
    for i, (item, piece_start, _, part) in enumerate(pieces):
        allocation = item.increment.allocation
        hour = math.floor(piece_start / HOUR_S) * HOUR_S
        row = UsageHour(
            work_id=allocation.work_id,
            member_index=allocation.member_index,
            node_id=allocation.node_id,
            hour_start=hour,
            tenant_id=allocation.tenant_id,
            work_kind=item.work_kind,
            zone=item.zone,
            accelerator_kind=allocation.accelerator_kind,
            energy_j=float(joules[i]),
            measured_j=item.increment.measured_j * part * pue,
            gap_s=item.increment.gap_s * part,
            gco2_g=float(gco2[i]),
            cost=float(cost[i]),
            currency=currencies[i],
            counterfactual_gco2_g=None if math.isnan(baseline[i]) else float(baseline[i]),
            fallback=bool(fallback[i]),
        )
        key = (row.work_id, row.member_index, row.node_id, hour)
        rows_by_key[key] = add_rows(rows_by_key[key], row) if key in rows_by_key else row
    return list(rows_by_key.values())


def add_rows(first: UsageHour, second: UsageHour) -> UsageHour:
    """Two rows of one key summed (a counterfactual only where both have one)."""
    baseline = (
        None
        if first.counterfactual_gco2_g is None or second.counterfactual_gco2_g is None
        else first.counterfactual_gco2_g + second.counterfactual_gco2_g
    )
    return UsageHour(
        work_id=first.work_id,
        member_index=first.member_index,
        node_id=first.node_id,
        hour_start=first.hour_start,
        tenant_id=first.tenant_id,
        work_kind=first.work_kind,
        zone=first.zone,
        accelerator_kind=first.accelerator_kind,
        energy_j=first.energy_j + second.energy_j,
        measured_j=first.measured_j + second.measured_j,
        gap_s=first.gap_s + second.gap_s,
        gco2_g=first.gco2_g + second.gco2_g,
        cost=first.cost + second.cost,
        currency=first.currency,
        counterfactual_gco2_g=baseline,
        fallback=first.fallback or second.fallback,
    )


def _cf_zones(counterfactuals: Mapping[str, CounterfactualRecord]) -> set[str]:
    return {
        zone
        for record in counterfactuals.values()
        if record.zone_factors is not None
        for zone in record.zone_factors
    }


def _counterfactual_gco2(
    pieces: Sequence[tuple[Priced, float, float, float]],
    kwh: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    windows: GridWindows,
    zones: Sequence[str],
    counterfactuals: Mapping[str, CounterfactualRecord],
) -> np.ndarray:
    """Per piece: the baseline's gCO2eq for the same energy and interval (NaN: none)."""
    result = np.full(len(pieces), np.nan)
    code = {zone: number for number, zone in enumerate(zones)}
    factors_by_zone: dict[str, list[tuple[int, float]]] = {}
    for i, (item, *_) in enumerate(pieces):
        record = counterfactuals.get(item.increment.allocation.work_id)
        if record is None or record.zone_factors is None:
            continue
        result[i] = 0.0
        for zone, factor in record.zone_factors.items():
            factors_by_zone.setdefault(zone, []).append((i, factor))
    for zone, entries in factors_by_zone.items():
        rows = np.array([i for i, _ in entries])
        factors = np.array([f for _, f in entries])
        means = zone_window_means(
            windows,
            zones,
            np.full(rows.size, code[zone], dtype=np.int64),
            start[rows],
            end[rows],
            "carbon",
        )
        result[rows] += kwh[rows] * factors * np.nan_to_num(means.values, nan=0.0)
    return result


def _stale(grid: GridSignals, zone: str) -> bool:
    series = grid.series(zone)
    return series is None or series.stale


def _currency(grid: GridSignals, zone: str) -> str:
    series = grid.series(zone)
    return series.currency if series is not None and series.has_price else FALLBACK_CURRENCY
