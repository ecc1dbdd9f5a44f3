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

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import msgspec
import numpy as np

from cloud.green.energy import J_PER_KWH
from cloud.green.window import GridWindows, zone_window_means
from cloud.signals.grid import HOUR_S, GridSignals
from cloud.store import CounterfactualRecord, UsageHour
from cloud.usage.meter import Increment

FALLBACK_CURRENCY = "USD"  # the static table's prices


class Priced(msgspec.Struct, frozen=True):
    """An increment and its node's zone (one per sample metered: a struct, cheap to make)."""

    increment: Increment
    zone: str


@dataclass(slots=True)
class Piece:
    """What one allocation used within one UTC hour and one hour of the grid's clock."""

    item: Priced
    start_s: float
    end_s: float
    energy_j: float
    measured_j: float
    gap_s: float


def _hour(instant_s: float, clock_ahead_s: float) -> int:
    """The hour (since the epoch) that `instant_s` reads on a clock `clock_ahead_s` ahead
    of ours (0: ours), the reading a float sum as every reader of the grid computes it."""
    return math.floor((instant_s + clock_ahead_s) / HOUR_S)


def _hour_begins(hour: int, clock_ahead_s: float) -> float:
    """The first instant that reads `hour` on a clock `clock_ahead_s` ahead of ours.
    `hour × 1 h − clock_ahead_s` rounded to our floats can read a hair before that hour
    (or its float neighbour below already read it) where the other clock's floats are
    finer or coarser than ours (a grid clock decades away, an ahead not a whole number
    of our floats): moved by a float at a time until it is the first, so every instant
    of a piece reads one hour of each clock. Readings only grow with the instant, so
    this ends, after a few steps for any offset within centuries."""
    instant_s = hour * HOUR_S - clock_ahead_s
    while _hour(instant_s, clock_ahead_s) < hour:
        instant_s = math.nextafter(instant_s, math.inf)
    while _hour(before_s := math.nextafter(instant_s, -math.inf), clock_ahead_s) >= hour:
        instant_s = before_s
    return instant_s


def _hour_starts(start: float, end: float, offset_s: float) -> list[float]:
    """The instants within (start, end) where our hour or the grid's begins (a replayed
    trace's clock runs `offset_s` ahead of ours): within a piece both hours are constant."""
    cuts: set[float] = set()
    for clock_ahead_s in (0.0, offset_s):
        hour = _hour(start, clock_ahead_s) + 1
        while (begins_s := _hour_begins(hour, clock_ahead_s)) < end:
            cuts.add(begins_s)
            hour += 1
    return sorted(cuts)


PieceKey = tuple[str, int, str, int, int]  # work, member, node, our hour, the grid's hour
Pieces = dict[PieceKey, Piece]


def accumulate(pieces: Pieces, item: Priced, offset_s: float) -> None:
    """Add an increment to `pieces`, split at hour boundaries and summed per allocation,
    node and hour: the grid's series are hourly steps, so within an hour every interval
    has the same mean, and summing first changes nothing but the cost of pricing (and
    bounds what waits for a flush by allocations × hours, not samples)."""
    increment = item.increment
    start, end = increment.start_s, increment.end_s
    span = end - start
    if span <= 0:
        return
    # `_hour` of both ends, written out: every sample metered passes here.
    our_hour = math.floor(start / HOUR_S)
    grid_hour = math.floor((start + offset_s) / HOUR_S)
    if math.floor(end / HOUR_S) == our_hour and (
        math.floor((end + offset_s) / HOUR_S) == grid_hour
    ):
        # The usual step, a few seconds within one hour of both clocks (readings only
        # grow with the instant, so every instant between reads the same hours).
        _put(pieces, item, our_hour, grid_hour, start, end, increment.energy_j,
             increment.measured_j, increment.gap_s)  # fmt: skip
        return
    cuts = _hour_starts(start, end, offset_s)
    for piece_start, piece_end in itertools.pairwise([start, *cuts, end]):
        part = (piece_end - piece_start) / span
        _put(pieces, item, _hour(piece_start, 0.0), _hour(piece_start, offset_s),
             piece_start, piece_end, increment.energy_j * part, increment.measured_j * part,
             increment.gap_s * part)  # fmt: skip


def _put(
    pieces: Pieces,
    item: Priced,
    our_hour: int,
    grid_hour: int,
    start_s: float,
    end_s: float,
    energy_j: float,
    measured_j: float,
    gap_s: float,
) -> None:
    """One piece within one hour of both clocks (their numbers since the epoch), added
    to the piece of its key."""
    allocation = item.increment.allocation
    key = (allocation.work_id, allocation.member_index, allocation.node_id, our_hour, grid_hour)
    found = pieces.get(key)
    if found is None:
        pieces[key] = Piece(item, start_s, end_s, energy_j, measured_j, gap_s)
    else:
        _add(found, start_s, end_s, energy_j, measured_j, gap_s)


def _add(
    piece: Piece, start_s: float, end_s: float, energy_j: float, measured_j: float, gap_s: float
) -> None:
    piece.start_s = min(piece.start_s, start_s)
    piece.end_s = max(piece.end_s, end_s)
    piece.energy_j += energy_j
    piece.measured_j += measured_j
    piece.gap_s += gap_s


def merge(into: Pieces, other: Pieces) -> None:
    """Add `other`'s pieces to `into` (a flush that failed, back in front of new ones)."""
    for key, piece in other.items():
        found = into.get(key)
        if found is None:
            into[key] = piece
        else:
            _add(found, piece.start_s, piece.end_s, piece.energy_j, piece.measured_j, piece.gap_s)


def price(
    increments: Sequence[Priced],
    grid: GridSignals,
    counterfactuals: Mapping[str, CounterfactualRecord],
    *,
    pue: float = 1.0,
    grid_offset_s: float = 0.0,
) -> list[UsageHour]:
    """The usage rows of `increments` (`accumulate`, then `price_pieces`)."""
    pieces: Pieces = {}
    for item in increments:
        accumulate(pieces, item, grid_offset_s)
    return price_pieces(pieces, grid, counterfactuals, pue=pue, grid_offset_s=grid_offset_s)


def price_pieces(
    pieces_by_key: Pieces,
    grid: GridSignals,
    counterfactuals: Mapping[str, CounterfactualRecord],
    *,
    pue: float = 1.0,
    grid_offset_s: float = 0.0,
) -> list[UsageHour]:
    """The usage rows of `pieces_by_key` (`accumulate`), one per allocation, node and hour.
    `grid_offset_s`: the grid's clock minus the increments' (a replayed trace)."""
    pieces = list(pieces_by_key.values())
    if not pieces:
        return []
    windows = GridWindows(grid)
    zones = sorted({p.item.zone for p in pieces} | _cf_zones(counterfactuals))
    code = {zone: number for number, zone in enumerate(zones)}
    codes = np.array([code[p.item.zone] for p in pieces], dtype=np.int64)
    start = np.array([p.start_s for p in pieces]) + grid_offset_s
    end = np.array([p.end_s for p in pieces]) + grid_offset_s
    joules = np.array([p.energy_j for p in pieces]) * pue
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
    for i, piece in enumerate(pieces):
        allocation = piece.item.increment.allocation
        hour = math.floor(piece.start_s / HOUR_S) * HOUR_S
        row = UsageHour(
            work_id=allocation.work_id,
            member_index=allocation.member_index,
            node_id=allocation.node_id,
            hour_start=hour,
            tenant_id=allocation.tenant_id,
            work_kind=allocation.work_kind,
            zone=piece.item.zone,
            accelerator_kind=allocation.accelerator_kind,
            energy_j=float(joules[i]),
            measured_j=piece.measured_j * pue,
            gap_s=piece.gap_s,
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
    pieces: Sequence[Piece],
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
    for i, piece in enumerate(pieces):
        record = counterfactuals.get(piece.item.increment.allocation.work_id)
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
