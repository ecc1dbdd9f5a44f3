"""Static table provider and its documented built-in fallback table."""

from __future__ import annotations

import math

import pytest

from cloud.signals.datasets import annual_mean_stats, shipped_traces
from cloud.signals.model import SignalUnavailable
from cloud.signals.static import StaticEntry, StaticProvider, builtin_static_table

from .support import FakeClock, epoch, utc


def test_the_builtin_table_is_the_2022_annual_mean_of_mean_stats() -> None:
    table = builtin_static_table()
    assert len(table) >= 123
    assert table["ZA"].carbon_g_per_kwh == annual_mean_stats()["ZA"]["2022"]
    assert table["GB"].carbon_g_per_kwh == pytest.approx(234.79788356164383)
    # The GCP region mapper writes AUS-NSW where Electricity Maps says AU-NSW.
    assert table["AUS-NSW"] == table["AU-NSW"]


def test_builtin_prices_exist_only_where_a_price_trace_ships() -> None:
    table = builtin_static_table()
    za_prices = shipped_traces()["ZA"].price_per_mwh
    assert table["ZA"].price_per_mwh == pytest.approx(float(za_prices.mean()))
    assert table["GB"].price_per_mwh is None


async def test_configured_rows_take_precedence_over_the_builtin_table() -> None:
    clock = FakeClock(epoch(2025, 5, 1, 10, 40))
    provider = StaticProvider(
        {"ZA": StaticEntry(carbon_g_per_kwh=650.0, price_per_mwh=80.0)}, clock=clock
    )
    reading = await provider.latest("ZA")
    assert (reading.carbon_g_per_kwh, reading.price_per_mwh, reading.currency) == (
        650.0,
        80.0,
        "USD",
    )
    assert reading.at == utc(2025, 5, 1, 10)
    assert reading.estimated
    assert (await provider.latest("DE")).carbon_g_per_kwh == pytest.approx(481.4542100456621)


async def test_without_the_builtin_table_an_unlisted_zone_is_unavailable() -> None:
    provider = StaticProvider({"ZA": StaticEntry(carbon_g_per_kwh=650.0)}, use_builtin=False)
    assert provider.knows("ZA")
    assert not provider.knows("DE")
    with pytest.raises(SignalUnavailable, match="no static value for zone 'DE'"):
        await provider.latest("DE")
    with pytest.raises(SignalUnavailable):
        await StaticProvider().latest("NOWHERE")


async def test_history_has_one_value_per_hour_and_there_is_no_forecast() -> None:
    provider = StaticProvider({"X": StaticEntry(carbon_g_per_kwh=10.0)}, use_builtin=False)
    readings = await provider.history("X", utc(2025, 1, 1, 0, 30), utc(2025, 1, 1, 4))
    assert [r.at.hour for r in readings] == [1, 2, 3]
    assert await provider.forecast("X", utc(2025, 1, 1), utc(2025, 1, 2)) is None


def test_entries_refuse_impossible_intensities() -> None:
    with pytest.raises(ValueError, match="finite and >= 0"):
        StaticEntry(carbon_g_per_kwh=-1.0)
    with pytest.raises(ValueError, match="finite"):
        StaticEntry(carbon_g_per_kwh=math.nan)
