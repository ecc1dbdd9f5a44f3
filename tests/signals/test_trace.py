"""Trace replay: the shipped files as a provider, and the fast path the simulator uses."""

from __future__ import annotations

import shutil
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

from cloud.signals.datasets import shipped_data, shipped_traces
from cloud.signals.forecast import FORECASTERS, ProfileLevel, SeasonalNaive
from cloud.signals.hourly import fill_forward
from cloud.signals.model import SignalUnavailable
from cloud.signals.trace import TraceProvider
from cloud.signals.units import HOUR_S, replay_clock, same_instant_in_year

from .support import FakeClock, epoch, utc

JUNE_16_1630 = epoch(2023, 6, 16, 16, 30)


async def test_latest_is_the_recorded_hour_containing_now() -> None:
    provider = TraceProvider(clock=FakeClock(JUNE_16_1630))
    reading = await provider.latest("ZA")
    assert reading.at == utc(2023, 6, 16, 16)
    assert reading.carbon_g_per_kwh == 683.59  # the LCA column
    assert reading.price_per_mwh == 306.92717999999996
    assert reading.currency == "USD"
    assert reading.signal_type == "average"


async def test_the_direct_column_is_selectable() -> None:
    provider = TraceProvider(clock=FakeClock(JUNE_16_1630), emission_factor="direct")
    assert (await provider.latest("ZA")).carbon_g_per_kwh == 616.31


async def test_history_never_reveals_the_future() -> None:
    provider = TraceProvider(clock=FakeClock(JUNE_16_1630))
    readings = await provider.history("DE", utc(2023, 6, 16, 10), utc(2023, 6, 17))
    assert [r.at.hour for r in readings] == [10, 11, 12, 13, 14, 15, 16]
    assert await provider.forecast("DE", utc(2023, 6, 16, 17), utc(2023, 6, 18)) is None


async def test_unknown_zones_and_times_before_the_trace_are_unavailable() -> None:
    provider = TraceProvider(clock=FakeClock(epoch(2022, 12, 31)))
    with pytest.raises(SignalUnavailable, match="no trace for zone 'FR'"):
        await provider.latest("FR")
    with pytest.raises(SignalUnavailable):
        await provider.latest("ZA")


def test_zone_series_is_recorded_past_then_forecast() -> None:
    provider = TraceProvider()
    series = provider.zone_series(
        "US-CAL-CISO",
        JUNE_16_1630,
        history_hours=24,
        horizon_hours=48,
        forecaster="seasonal-naive",
    )
    trace = shipped_traces()["US-CAL-CISO"]
    now = trace.hour_index(JUNE_16_1630)
    assert series.start_s == epoch(2023, 6, 15, 17)
    assert series.carbon_g_per_kwh.size == 24 + 48
    recorded = trace.carbon("lifecycle")
    np.testing.assert_array_equal(series.carbon_g_per_kwh[:24], recorded[now - 23 : now + 1])
    # Seasonal naive: every future hour is the same hour of the last recorded day.
    np.testing.assert_array_equal(series.carbon_g_per_kwh[24:48], recorded[now - 23 : now + 1])
    np.testing.assert_array_equal(
        series.price_per_mwh[:24], trace.price_per_mwh[now - 23 : now + 1]
    )
    assert series.carbon_at(JUNE_16_1630) == recorded[now]
    assert not series.stale


def test_the_default_forecaster_is_used_and_never_sees_the_future() -> None:
    provider = TraceProvider()
    series = provider.zone_series("DE", JUNE_16_1630, history_hours=6, horizon_hours=24)
    recorded = shipped_traces()["DE"].carbon("lifecycle")
    now = shipped_traces()["DE"].hour_index(JUNE_16_1630)
    model = ProfileLevel()
    expected = np.maximum(model.forecast(recorded[now + 1 - model.lookback_hours : now + 1], 24), 0)
    np.testing.assert_allclose(series.carbon_g_per_kwh[6:], expected)
    assert not np.array_equal(series.carbon_g_per_kwh[6:], recorded[now + 1 : now + 25])


def test_a_perfect_forecast_replays_the_recorded_future() -> None:
    provider = TraceProvider(perfect_forecast=True)
    series = provider.zone_series("DE", JUNE_16_1630, history_hours=1, horizon_hours=12)
    trace = shipped_traces()["DE"]
    now = trace.hour_index(JUNE_16_1630)
    np.testing.assert_array_equal(
        series.carbon_g_per_kwh, trace.carbon("lifecycle")[now : now + 13]
    )


def test_the_start_of_the_year_uses_what_history_there_is() -> None:
    series = TraceProvider().zone_series("CA-ON", epoch(2023, 1, 1, 2), history_hours=24)
    assert series.start_s == epoch(2023, 1, 1)
    assert series.carbon_g_per_kwh.size == 3 + 48


def test_after_the_trace_ends_the_series_is_stale_and_still_complete() -> None:
    series = TraceProvider().zone_series(
        "ZA", epoch(2024, 1, 1, 5), history_hours=4, horizon_hours=8
    )
    assert series.stale
    assert series.start_s == epoch(2023, 12, 31, 20)
    assert series.end_s == epoch(2024, 1, 1, 14)


def test_grid_signals_cover_known_zones_and_are_cached() -> None:
    provider = TraceProvider()
    signals = provider.grid_signals(["ZA", "DE", "FR"], JUNE_16_1630)
    assert sorted(signals.zones) == ["DE", "ZA"]
    assert signals.now_s == JUNE_16_1630
    assert signals.stale_zones == ()
    # Within the same hour the snapshot reuses the same immutable series.
    again = provider.grid_signals(["ZA"], JUNE_16_1630 + 600)
    assert again.zones["ZA"] is signals.zones["ZA"]
    later = provider.grid_signals(["ZA"], JUNE_16_1630 + HOUR_S)
    assert later.zones["ZA"] is not signals.zones["ZA"]


def test_every_forecaster_can_drive_the_fast_path() -> None:
    provider = TraceProvider()
    for name in FORECASTERS:
        series = provider.zone_series("ZA", JUNE_16_1630, forecaster=name)
        assert np.all(series.carbon_g_per_kwh >= 0)
    custom = SeasonalNaive(48, name="two-day")
    assert provider.zone_series("ZA", JUNE_16_1630, forecaster=custom).carbon_g_per_kwh.size == 72


def test_gaps_in_a_trace_are_skipped_in_history_and_carried_in_series(tmp_path: Path) -> None:
    source = Path(str(shipped_data())) / "ZA_2023_hourly.csv"
    lines = source.read_text("utf-8").splitlines()
    kept = [line for index, line in enumerate(lines) if index not in (3, 4)]  # 02:00, 03:00
    (tmp_path / "ZA_2023_hourly.csv").write_text("\n".join(kept[:10]) + "\n", "utf-8")
    provider = TraceProvider(tmp_path, clock=FakeClock(epoch(2023, 1, 1, 5)))
    series = provider.zone_series("ZA", epoch(2023, 1, 1, 5), history_hours=6, horizon_hours=1)
    values = [float(line.split(",")[5]) for line in lines[1:7]]
    expected = fill_forward(np.array([values[0], values[1], np.nan, np.nan, values[4], values[5]]))
    np.testing.assert_array_equal(series.carbon_g_per_kwh[:6], expected)


async def test_gaps_are_absent_from_async_history(tmp_path: Path) -> None:
    source = Path(str(shipped_data())) / "ZA_2023_hourly.csv"
    lines = source.read_text("utf-8").splitlines()
    kept = [line for index, line in enumerate(lines[:8]) if index not in (3, 4)]
    (tmp_path / "ZA_2023_hourly.csv").write_text("\n".join(kept) + "\n", "utf-8")
    shutil.copy(source.with_name("ZA_electricity_prices_2023.csv"), tmp_path)
    provider = TraceProvider(tmp_path, clock=FakeClock(epoch(2023, 1, 1, 6)))
    readings = await provider.history("ZA", utc(2023, 1, 1), utc(2023, 1, 1) + timedelta(hours=7))
    assert [r.at.hour for r in readings] == [0, 1, 4, 5, 6]
    assert all(r.price_per_mwh is not None for r in readings)


def test_replay_maps_the_wall_clock_onto_the_trace_year() -> None:
    assert same_instant_in_year(epoch(2026, 6, 16, 16, 30), 2023) == JUNE_16_1630
    assert same_instant_in_year(epoch(2024, 2, 29, 12), 2023) == epoch(2023, 2, 28, 12)
    clock = replay_clock(2023, FakeClock(epoch(2025, 3, 1, 8)))
    assert clock() == epoch(2023, 3, 1, 8)
