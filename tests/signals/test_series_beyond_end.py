"""Past its last hour a series repeats its last day (cloud/signals/grid.py): a job that
runs for days past the forecast horizon is scored by its zone's daily cycle, not by the
one hour of the day the horizon ended on. Green once ranked a zone of 261 g/kWh as
clean as one of 73 for a two-week job because the dirty zone's forecast ended at its
midday solar dip."""

from __future__ import annotations

import numpy as np

from cloud.green.window import ZoneWindows
from cloud.signals.grid import HOUR_S, ZoneSeries, extended_values

START_S = 1_700_000_000.0
DAY_H = 24


def _solar_zone(days: int) -> ZoneSeries:
    """A zone at 400 g/kWh but for a dip to 50 at midday; the series ends in the dip."""
    day = np.full(DAY_H, 400.0)
    day[10:14] = 50.0
    carbon = np.tile(day, days)[: days * DAY_H - 10]  # its last hour is 13:00, in the dip
    return ZoneSeries("SOLAR", START_S, carbon, np.full(carbon.size, np.nan))


def test_a_window_of_days_past_the_end_is_scored_by_the_daily_cycle() -> None:
    series = _solar_zone(days=2)
    assert series.carbon_g_per_kwh[-1] == 50.0
    daily_mean = float(series.carbon_g_per_kwh[-DAY_H:].mean())
    start_s = series.end_s - 3 * HOUR_S
    end_s = start_s + 14 * DAY_H * HOUR_S  # a two-week run, nearly all past the end
    for mean in (
        float(series.mean_carbon_g_per_kwh(start_s, end_s)),
        float(ZoneWindows(series).mean("carbon", np.array([start_s]), np.array([end_s]))[0]),
    ):
        assert abs(mean - daily_mean) < 0.02 * daily_mean  # not 50, the last hour's
        assert mean > 300.0


def test_the_hours_past_the_end_repeat_the_last_day_at_their_time_of_day() -> None:
    series = _solar_zone(days=3)
    values = series.carbon_g_per_kwh
    past = np.arange(values.size, values.size + 3 * DAY_H)
    repeated = extended_values(values, past)
    np.testing.assert_array_equal(
        repeated, values[past - DAY_H * (1 + (past - values.size) // DAY_H)]
    )
    for hour in past[:30].tolist():
        at_s = START_S + hour * HOUR_S + 60.0
        one_hour = float(series.mean_carbon_g_per_kwh(at_s - 60.0, at_s + HOUR_S - 60.0))
        assert one_hour == float(extended_values(values, [hour])[0])
        assert float(series.carbon_at(at_s)) == one_hour
    # Before its first hour a series holds its first value.
    assert float(series.carbon_at(START_S - 5 * HOUR_S)) == values[0]


def test_a_series_shorter_than_a_day_repeats_all_of_it() -> None:
    series = ZoneSeries("SHORT", START_S, np.array([100.0, 300.0]), np.full(2, np.nan))
    assert extended_values(series.carbon_g_per_kwh, [2, 3, 4, 5]).tolist() == [
        100.0,
        300.0,
        100.0,
        300.0,
    ]
    assert float(series.mean_carbon_g_per_kwh(START_S, START_S + 10 * HOUR_S)) == 200.0
