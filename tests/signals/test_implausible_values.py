"""Negative, absurd and far-off values: refused where a file is read, dropped where a
provider answers, and never more than one zone's trouble in a snapshot."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import aiohttp
import numpy as np
import pytest
from aiohttp import web

from cloud.signals.datasets import DatasetError, read_traces
from cloud.signals.factory import build_signal_service
from cloud.signals.forecast import Forecaster
from cloud.signals.grid import FloatArray
from cloud.signals.model import Forecast, GridReading
from cloud.signals.service import SignalService
from cloud.signals.static import StaticEntry, StaticProvider
from cloud.signals.units import G_PER_KWH_PER_LB_PER_MWH, HOUR_S
from cloud.signals.watttime import WattTimeProvider
from shared.clock import utc_from_epoch
from shared.settings import ConfigError, SignalSettings

from .support import FakeClock, epoch, serve, utc

CARBON_HEADER = (
    "Datetime (UTC),Country,Zone Name,Zone Id,Carbon Intensity gCO₂eq/kWh (direct),"
    "Carbon Intensity gCO₂eq/kWh (LCA),Low Carbon Percentage,Renewable Percentage,"
    "Data Source,Data Estimated,Data Estimation Method"
)


def carbon_row(at: str, direct: str = "100", lifecycle: str = "120") -> str:
    return f"{at},X,X,XX,{direct},{lifecycle},0,0,x,false,"


def write_trace(directory: Path, rows: list[str], name: str = "XX_2023_hourly.csv") -> Path:
    path = directory / name
    path.write_text("\n".join([CARBON_HEADER, *rows]) + "\n", encoding="utf-8")
    return path


def hours_of_2023(count: int) -> list[str]:
    return [f"2023-01-01 {hour:02d}:00:00" for hour in range(count)]


# ---- trace files ----------------------------------------------------------------------


@pytest.mark.parametrize("value", ["-5000", "-0.5", "1e308", "inf", "-inf", "10001"])
@pytest.mark.parametrize("column", ["direct", "lifecycle"])
def test_a_trace_value_no_grid_has_is_refused_naming_the_file_and_line(
    tmp_path: Path, value: str, column: str
) -> None:
    rows = [carbon_row(at) for at in hours_of_2023(4)]
    rows[2] = carbon_row("2023-01-01 02:00:00", **{column: value})
    write_trace(tmp_path, rows)
    with pytest.raises(DatasetError) as refused:
        read_traces(tmp_path)
    # Line 4: the header is line 1, the third row line 4.
    assert str(refused.value).startswith("XX_2023_hourly.csv: line 4: ")
    assert repr(value) in str(refused.value)
    assert "0 to 10,000 gCO2eq/kWh" in str(refused.value)


def test_empty_cells_and_values_up_to_the_bound_are_read(tmp_path: Path) -> None:
    rows = [carbon_row(at) for at in hours_of_2023(3)]
    rows[1] = carbon_row("2023-01-01 01:00:00", direct="", lifecycle="10000")
    rows[2] = carbon_row("2023-01-01 02:00:00", direct="0", lifecycle="0")
    write_trace(tmp_path, rows)
    trace = read_traces(tmp_path)["XX"]
    np.testing.assert_array_equal(trace.carbon("lifecycle"), [120.0, 10_000.0, 0.0])
    np.testing.assert_array_equal(trace.carbon("direct"), [100.0, np.nan, 0.0])


@pytest.mark.parametrize("price", ["-100001", "1e308", "-inf"])
def test_an_absurd_price_is_refused_naming_the_file_and_line(tmp_path: Path, price: str) -> None:
    write_trace(tmp_path, [carbon_row(at) for at in hours_of_2023(3)])
    (tmp_path / "XX_electricity_prices_2023.csv").write_text(
        f"Datetime (UTC),Price (USD/MWh)\n2023-01-01 00:00:00,-480\n2023-01-01 01:00:00,{price}\n",
        encoding="utf-8",
    )
    with pytest.raises(DatasetError, match=r"^XX_electricity_prices_2023\.csv: line 3: "):
        read_traces(tmp_path)


@pytest.mark.parametrize("far_row", [0, 4])
def test_a_row_decades_from_the_others_is_refused_naming_it(tmp_path: Path, far_row: int) -> None:
    rows = [carbon_row(at) for at in hours_of_2023(4)]
    rows.insert(far_row, carbon_row("9999-12-31 23:00:00"))
    write_trace(tmp_path, rows)
    with pytest.raises(DatasetError) as refused:
        read_traces(tmp_path)  # before the check: about 1.7 GB of arrays for these 5 rows
    assert str(refused.value).startswith(f"XX_2023_hourly.csv: line {far_row + 2}: 9999-12-31")
    assert "more than 20 years" in str(refused.value)


def test_files_of_one_zone_decades_apart_are_refused_naming_them(tmp_path: Path) -> None:
    write_trace(tmp_path, [carbon_row(at) for at in hours_of_2023(2)])
    write_trace(tmp_path, [carbon_row("1950-01-01 00:00:00")], name="XX_1950_hourly.csv")
    with pytest.raises(DatasetError, match=r"XX_1950_hourly\.csv, XX_2023_hourly\.csv: zone XX"):
        read_traces(tmp_path)


def test_a_trace_dir_with_a_negative_value_stops_the_configuration(tmp_path: Path) -> None:
    rows = [carbon_row(at) for at in hours_of_2023(3)]
    rows[1] = carbon_row("2023-01-01 01:00:00", lifecycle="-5000")
    write_trace(tmp_path, rows)
    settings = SignalSettings(providers=("trace",), trace_dir=str(tmp_path))
    with pytest.raises(ConfigError, match=r"signals\.trace_dir: XX_2023_hourly\.csv: line 3: "):
        build_signal_service(settings, clock=lambda: epoch(2023, 1, 1, 2))


# ---- provider answers -------------------------------------------------------------------

WATTTIME_NOW = utc(2024, 6, 1, 12, 30)
BAD_HOUR = utc(2024, 6, 1, 10)


async def watttime_login(_request: web.Request) -> web.Response:
    return web.json_response({"token": "t"})


async def watttime_historical(request: web.Request) -> web.Response:
    """500 lbs/MWh every 5 minutes, but one point of BAD_HOUR negative, one absurd."""
    start = datetime.fromisoformat(request.query["start"])
    end = datetime.fromisoformat(request.query["end"])
    data, at = [], start
    while at < end and at <= WATTTIME_NOW:
        value = 500.0
        if at == BAD_HOUR + timedelta(minutes=10):
            value = -40.0
        elif at == BAD_HOUR + timedelta(minutes=20):
            value = 1e300
        data.append({"point_time": at.isoformat(), "value": value})
        at += timedelta(minutes=5)
    return web.json_response({"data": data, "meta": {"units": "lbs_co2_per_mwh"}})


async def watttime_forecast(_request: web.Request) -> web.Response:
    data = [
        {"point_time": (WATTTIME_NOW + timedelta(minutes=5 * i)).isoformat(), "value": value}
        for i, value in enumerate([500.0, -7.0, 500.0])
    ]
    return web.json_response({"data": data, "meta": {"units": "lbs_co2_per_mwh"}})


async def test_a_watttime_answer_with_negative_points_still_serves_every_zone(
    session: aiohttp.ClientSession,
) -> None:
    app = web.Application()
    app.router.add_get("/login", watttime_login)
    app.router.add_get("/v3/historical", watttime_historical)
    app.router.add_get("/v3/forecast", watttime_forecast)
    async with serve(app) as url:
        settings = SignalSettings(
            providers=("watttime",),
            watttime_username="u",
            watttime_password="p",
            watttime_base_url=url,
        )
        signals = build_signal_service(
            settings, session=session, clock=FakeClock(WATTTIME_NOW.timestamp())
        )
        grid = await signals.snapshot(["US-CAL-CISO", "DE"])
    expected = 500.0 * G_PER_KWH_PER_LB_PER_MWH
    for zone in ("US-CAL-CISO", "DE"):
        series = grid.zones[zone]
        assert series.source == "watttime"
        # The hour with the bad points is the mean of its ten good ones.
        np.testing.assert_allclose(series.carbon_g_per_kwh, expected)
        assert series.carbon_at(BAD_HOUR.timestamp()) == pytest.approx(expected)


async def test_watttime_drops_negative_and_absurd_points_and_keeps_their_hour(
    session: aiohttp.ClientSession,
) -> None:
    app = web.Application()
    app.router.add_get("/login", watttime_login)
    app.router.add_get("/v3/historical", watttime_historical)
    async with serve(app) as url:
        provider = WattTimeProvider(
            session,
            username="u",
            password="p",
            base_url=url,
            clock=FakeClock(WATTTIME_NOW.timestamp()),
        )
        readings = await provider.history("US-CAL-CISO", BAD_HOUR, BAD_HOUR + timedelta(hours=1))
    [hour] = readings
    assert hour.at == BAD_HOUR
    assert hour.carbon_g_per_kwh == pytest.approx(500.0 * G_PER_KWH_PER_LB_PER_MWH)


class JunkProvider:
    """Hourly readings up to the clock's hour; the value for each zone and hour from
    `values` (default 100), so a test can plant junk where it likes."""

    def __init__(self, clock: FakeClock, values: dict[tuple[str, datetime], float]) -> None:
        self.clock = clock
        self.values = values
        self.history_calls = 0

    @property
    def name(self) -> str:
        return "junk"

    def _reading(self, zone: str, at: datetime) -> GridReading:
        return GridReading(
            zone=zone,
            at=at,
            carbon_g_per_kwh=self.values.get((zone, at), 100.0),
            signal_type="average",
            price_per_mwh=1e300 if at.hour == 9 else 40.0,
            currency="USD",
        )

    async def latest(self, zone: str) -> GridReading:
        return self._reading(zone, utc_from_epoch(self.clock()).replace(minute=0))

    async def history(self, zone: str, start: datetime, end: datetime) -> list[GridReading]:
        self.history_calls += 1
        now = utc_from_epoch(self.clock())
        readings, at = [], start
        while at < end and at <= now:
            readings.append(self._reading(zone, at))
            at += timedelta(hours=1)
        return readings

    async def forecast(self, zone: str, start: datetime, end: datetime) -> Forecast | None:
        return None


NOW_S = epoch(2025, 5, 1, 10, 20)


def junk_service(
    provider: JunkProvider, clock: FakeClock, forecaster: Forecaster | str = "persistence"
) -> SignalService:
    static = StaticProvider({"XX": StaticEntry(carbon_g_per_kwh=321.0)}, use_builtin=False)
    return SignalService(
        [provider],
        static=static,
        clock=clock,
        history_hours=3,
        horizon_hours=2,
        forecaster=forecaster,
    )


async def test_implausible_readings_from_any_provider_are_dropped_not_served() -> None:
    clock = FakeClock(NOW_S)
    provider = JunkProvider(
        clock,
        {("DE", utc(2025, 5, 1, 9)): -12.0, ("ZA", utc(2025, 5, 1, 10)): 1e308},
    )
    grid = await junk_service(provider, clock).snapshot(["DE", "ZA"])
    # The dropped hour is carried forward from the one before, as any gap is.
    np.testing.assert_array_equal(grid.zones["DE"].carbon_g_per_kwh, [100.0] * 5)
    np.testing.assert_array_equal(grid.zones["ZA"].carbon_g_per_kwh, [100.0] * 5)
    assert grid.zones["DE"].source == "junk"
    # An absurd price is dropped from its reading, which keeps its intensity.
    np.testing.assert_array_equal(grid.zones["DE"].price_per_mwh, [40.0] * 5)


class BreaksOnThirteen:
    """A forecaster with a bug: NaN (which no series may hold) after an hour of 13."""

    name = "breaks-on-13"
    lookback_hours = 3

    def forecast(self, history: FloatArray, horizon_hours: int) -> FloatArray:
        value = np.nan if history[-1] == 13.0 else history[-1]
        return np.full(horizon_hours, value)


async def test_a_snapshot_with_one_broken_zone_still_serves_the_others() -> None:
    clock = FakeClock(NOW_S)
    provider = JunkProvider(clock, {("XX", utc(2025, 5, 1, 10)): 13.0})
    signals = junk_service(provider, clock, forecaster=BreaksOnThirteen())
    grid = await signals.snapshot(["DE", "XX", "ZA"])
    assert grid.zones["DE"].source == grid.zones["ZA"].source == "junk"
    # The broken zone is served as one without an answer: from the static table.
    assert grid.zones["XX"].source == "static (fallback)"
    assert grid.zones["XX"].stale
    np.testing.assert_array_equal(grid.zones["XX"].carbon_g_per_kwh, [321.0] * 5)
    # ...and its answer is not kept to come back as the last good value.
    assert signals.newest_reading_s("XX") is None
    assert signals.newest_reading_s("DE") == epoch(2025, 5, 1, 10)
    asked = provider.history_calls
    clock.advance(HOUR_S)
    grid = await signals.snapshot(["DE", "XX"])
    assert provider.history_calls == asked + 2  # asked afresh for both zones
    assert grid.zones["XX"].source == "junk"  # 13 was an hour ago: usable again


@pytest.mark.parametrize("lifecycle", ["#N/A", "4O1", "NaN", "nan", "12,5"])
def test_a_carbon_cell_that_is_no_number_is_refused_naming_the_file_and_line(
    tmp_path: Path, lifecycle: str
) -> None:
    rows = [carbon_row(at) for at in hours_of_2023(4)]
    rows[1] = carbon_row("2023-01-01 01:00:00", lifecycle=f'"{lifecycle}"')
    write_trace(tmp_path, rows)
    with pytest.raises(DatasetError) as refused:
        read_traces(tmp_path)  # before: read as a missing hour, and carried over
    assert str(refused.value).startswith("XX_2023_hourly.csv: line 3: ")
    assert repr(lifecycle) in str(refused.value)
    assert "not a number" in str(refused.value)


@pytest.mark.parametrize("price", ["4 2", "NaN", "n/a"])
def test_a_price_cell_that_is_no_number_is_refused_naming_the_file_and_line(
    tmp_path: Path, price: str
) -> None:
    write_trace(tmp_path, [carbon_row(at) for at in hours_of_2023(3)])
    (tmp_path / "XX_electricity_prices_2023.csv").write_text(
        f"Datetime (UTC),Price (USD/MWh)\n2023-01-01 00:00:00,40\n2023-01-01 01:00:00,{price}\n",
        encoding="utf-8",
    )
    with pytest.raises(
        DatasetError, match=r"^XX_electricity_prices_2023\.csv: line 3: .*not a number"
    ):
        read_traces(tmp_path)


def test_an_hour_written_twice_is_refused_naming_both_lines(tmp_path: Path) -> None:
    rows = [carbon_row(at) for at in hours_of_2023(4)]
    rows.append(carbon_row("2023-01-01 01:00:00", lifecycle="5"))  # line 6, as line 3
    write_trace(tmp_path, rows)
    with pytest.raises(DatasetError, match=r"^XX_2023_hourly\.csv: lines 3 and 6: .*01:00"):
        read_traces(tmp_path)  # before: the last row won, silently


def test_an_hour_in_two_files_of_a_zone_is_refused_naming_both(tmp_path: Path) -> None:
    write_trace(tmp_path, [carbon_row(at) for at in hours_of_2023(3)])
    write_trace(tmp_path, [carbon_row("2023-01-01 02:30:00")], name="XX_2024_hourly.csv")
    with pytest.raises(
        DatasetError,
        match=r"^XX_2023_hourly\.csv: line 4 and XX_2024_hourly\.csv: line 2: .*02:00",
    ):
        read_traces(tmp_path)


def test_a_price_hour_written_twice_is_refused_naming_both_lines(tmp_path: Path) -> None:
    write_trace(tmp_path, [carbon_row(at) for at in hours_of_2023(3)])
    (tmp_path / "XX_electricity_prices_2023.csv").write_text(
        "Datetime (UTC),Price (USD/MWh)\n2023-01-01 00:00:00,40\n2023-01-01 00:00:00,41\n",
        encoding="utf-8",
    )
    with pytest.raises(DatasetError, match=r"^XX_electricity_prices_2023\.csv: lines 2 and 3: "):
        read_traces(tmp_path)
