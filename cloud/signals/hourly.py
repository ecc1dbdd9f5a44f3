"""From provider readings at any resolution to greenfed's hourly grid.

Providers report 5-minute (WattTime), half-hour (UK Carbon Intensity) or hourly
(Electricity Maps) values. greenfed scores on hours, so each hour becomes the mean
of the values that fall in it. An hour without any value stays missing (NaN):
nothing here invents a number. Only `fill_forward`, used where a dense array is
unavoidable (`ZoneSeries`), carries the last known value over a gap.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

import numpy as np

from cloud.signals.grid import FloatArray
from cloud.signals.model import ForecastPoint, GridReading
from cloud.signals.units import HOUR_S, epoch_s, floor_hour


@dataclass(frozen=True, slots=True)
class HourMean:
    hour: datetime  # UTC, start of the hour
    value: float
    estimated: bool  # any value in the hour was an estimate or a forecast
    samples: int


def hourly_means(points: Iterable[tuple[datetime, float | None, bool]]) -> list[HourMean]:
    """Group (time, value, estimated) by UTC hour; None and non-finite values are skipped."""
    sums: dict[datetime, list[float]] = {}
    estimated: dict[datetime, bool] = {}
    for at, value, is_estimate in points:
        if value is None or not math.isfinite(value):
            continue
        hour = floor_hour(at)
        sums.setdefault(hour, []).append(value)
        estimated[hour] = estimated.get(hour, False) or is_estimate
    return [
        HourMean(hour, sum(values) / len(values), estimated[hour], len(values))
        for hour, values in sorted(sums.items())
    ]


def bin_readings(
    readings: Iterable[GridReading], start_s: float, hours: int
) -> tuple[FloatArray, FloatArray]:
    """Hourly mean carbon and price over [start_s, start_s + hours·3600); NaN where none."""
    return _bin(((r.at, r.carbon_g_per_kwh, r.price_per_mwh) for r in readings), start_s, hours)


def bin_forecast(
    points: Iterable[ForecastPoint], start_s: float, hours: int
) -> tuple[FloatArray, FloatArray]:
    return _bin(((p.at, p.carbon_g_per_kwh, p.price_per_mwh) for p in points), start_s, hours)


def _bin(
    rows: Iterable[tuple[datetime, float, float | None]], start_s: float, hours: int
) -> tuple[FloatArray, FloatArray]:
    carbon_sum = np.zeros(hours)
    carbon_count = np.zeros(hours)
    price_sum = np.zeros(hours)
    price_count = np.zeros(hours)
    for at, carbon, price in rows:
        index = math.floor((epoch_s(at) - start_s) / HOUR_S)
        if not 0 <= index < hours:
            continue
        if math.isfinite(carbon):
            carbon_sum[index] += carbon
            carbon_count[index] += 1
        if price is not None and math.isfinite(price):
            price_sum[index] += price
            price_count[index] += 1
    with np.errstate(invalid="ignore", divide="ignore"):
        carbon_mean: FloatArray = np.where(carbon_count > 0, carbon_sum / carbon_count, np.nan)
        price_mean: FloatArray = np.where(price_count > 0, price_sum / price_count, np.nan)
    return carbon_mean, price_mean


def fill_forward(values: FloatArray) -> FloatArray:
    """Carry the last finite value over NaN gaps; leading NaNs stay NaN."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        return values.copy()
    known = np.isfinite(values)
    index = np.where(known, np.arange(values.size), -1)
    np.maximum.accumulate(index, out=index)
    result: FloatArray = np.where(index >= 0, values[np.maximum(index, 0)], np.nan)
    return result


def first_finite(values: FloatArray) -> int | None:
    finite = np.flatnonzero(np.isfinite(values))
    return int(finite[0]) if finite.size else None
