"""SignalService: TTL cache, fallback chain, Retry-After, staleness — all on a fake clock."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta

import numpy as np
import pytest
from structlog.testing import capture_logs

from cloud.signals.model import (
    Forecast,
    ForecastPoint,
    GridReading,
    SignalAuthError,
    SignalRateLimited,
    SignalType,
    SignalUnavailable,
)
from cloud.signals.service import SignalService
from cloud.signals.static import StaticEntry, StaticProvider
from cloud.signals.units import HOUR_S, epoch_s
from shared.clock import utc_from_epoch

from .support import FakeClock, epoch

NOW_S = epoch(2025, 5, 1, 10, 20)


def by_hour(at: datetime) -> float:
    return at.hour * 10.0


class FakeProvider:
    """Hourly values from a function of the hour, up to the clock's current hour."""

    def __init__(
        self,
        name: str,
        clock: FakeClock,
        value: Callable[[datetime], float | None] = by_hour,
        *,
        forecast_hours: int = 0,
        signal_type: SignalType = "average",
        price: float | None = None,
    ) -> None:
        self._name = name
        self.clock = clock
        self.value = value
        self.forecast_hours = forecast_hours
        self.signal_type: SignalType = signal_type
        self.price = price
        self.calls: Counter[str] = Counter()
        self.error: Exception | None = None
        self.forecast_error: Exception | None = None
        self.lag_hours = 0  # how far behind the current hour its data ends

    @property
    def name(self) -> str:
        return self._name

    def _reading(self, zone: str, at: datetime) -> GridReading | None:
        value = self.value(at)
        if value is None:
            return None
        return GridReading(
            zone=zone,
            at=at,
            carbon_g_per_kwh=value,
            signal_type=self.signal_type,
            price_per_mwh=self.price,
            currency="USD" if self.price else None,
            source=self._name,
        )

    async def latest(self, zone: str) -> GridReading:
        self.calls["latest"] += 1
        if self.error:
            raise self.error
        now = utc_from_epoch(self.clock() - self.lag_hours * HOUR_S).replace(minute=0, second=0)
        reading = self._reading(zone, now)
        if reading is None:
            raise SignalUnavailable("no value")
        return reading

    async def history(self, zone: str, start: datetime, end: datetime) -> list[GridReading]:
        self.calls["history"] += 1
        await asyncio.sleep(0)  # a real provider suspends here: let concurrent callers in
        if self.error:
            raise self.error
        newest = utc_from_epoch(self.clock() - self.lag_hours * HOUR_S)
        readings = []
        at = start
        while at < end and at <= newest:
            reading = self._reading(zone, at)
            if reading is not None:
                readings.append(reading)
            at += timedelta(hours=1)
        return readings

    async def forecast(self, zone: str, start: datetime, end: datetime) -> Forecast | None:
        self.calls["forecast"] += 1
        if self.forecast_error:
            raise self.forecast_error
        if not self.forecast_hours:
            return None
        points = [
            ForecastPoint(at=start + timedelta(hours=h), carbon_g_per_kwh=500.0 + h)
            for h in range(self.forecast_hours)
        ]
        return Forecast(
            zone=zone,
            issued_at=start,
            signal_type=self.signal_type,
            points=points,
            source=self._name,
        )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(NOW_S)


def service(
    providers: list[FakeProvider],
    clock: FakeClock,
    *,
    static: StaticProvider | None = None,
    cache_ttl_s: float = 300.0,
    rate_limit_backoff_s: float = 60.0,
    auth_backoff_s: float = 900.0,
) -> SignalService:
    """3 recorded hours, 2 ahead, persistence forecasts: results easy to write down."""
    return SignalService(
        providers,
        static=static,
        clock=clock,
        cache_ttl_s=cache_ttl_s,
        staleness_limit_s=3 * HOUR_S,
        history_hours=3,
        horizon_hours=2,
        forecaster="persistence",
        rate_limit_backoff_s=rate_limit_backoff_s,
        auth_backoff_s=auth_backoff_s,
    )


async def test_a_snapshot_holds_recorded_hours_then_the_forecast(clock: FakeClock) -> None:
    provider = FakeProvider("live", clock, price=42.0)
    signals = await service([provider], clock).snapshot(["DE"])
    series = signals.zones["DE"]
    assert signals.now_s == NOW_S
    assert series.start_s == epoch(2025, 5, 1, 8)
    np.testing.assert_array_equal(series.carbon_g_per_kwh, [80, 90, 100, 100, 100])
    np.testing.assert_array_equal(series.price_per_mwh, [42.0] * 5)
    assert (series.source, series.stale, series.signal_type) == ("live", False, "average")
    assert signals.stale_zones == ()


async def test_answers_are_cached_per_provider_and_zone_for_the_ttl(clock: FakeClock) -> None:
    provider = FakeProvider("live", clock)
    signals = service([provider], clock)
    await signals.snapshot(["DE", "ZA"])
    clock.advance(299)
    await signals.snapshot(["DE", "ZA"])
    assert provider.calls["history"] == 2  # one per zone
    clock.advance(2)
    await signals.snapshot(["DE"])
    assert provider.calls["history"] == 3


async def test_concurrent_snapshots_ask_each_provider_once_per_zone(clock: FakeClock) -> None:
    provider = FakeProvider("live", clock)
    signals = service([provider], clock)
    first, second = await asyncio.gather(signals.snapshot(["DE"]), signals.snapshot(["DE"]))
    assert provider.calls["history"] == 1
    np.testing.assert_array_equal(
        first.zones["DE"].carbon_g_per_kwh, second.zones["DE"].carbon_g_per_kwh
    )


async def test_the_chain_falls_through_to_the_next_live_provider(clock: FakeClock) -> None:
    broken = FakeProvider("first", clock)
    broken.error = SignalUnavailable("outage")
    working = FakeProvider("second", clock, lambda at: 7.0)
    snapshot = await service([broken, working], clock).snapshot(["DE"])
    assert snapshot.zones["DE"].source == "second"
    assert not snapshot.zones["DE"].stale


async def test_a_crashing_provider_does_not_take_the_snapshot_down(clock: FakeClock) -> None:
    broken = FakeProvider("buggy", clock)
    broken.error = ZeroDivisionError("bug")
    working = FakeProvider("second", clock)
    snapshot = await service([broken, working], clock).snapshot(["DE"])
    assert snapshot.zones["DE"].source == "second"


async def test_the_last_good_value_is_used_then_flagged_stale(clock: FakeClock) -> None:
    provider = FakeProvider("live", clock)
    signals = service([provider], clock)
    await signals.snapshot(["DE"])
    provider.error = SignalUnavailable("down")
    clock.advance(HOUR_S)  # past the TTL: the provider is asked and fails
    one_hour_later = await signals.snapshot(["DE"])
    series = one_hour_later.zones["DE"]
    assert series.source == "live (last good)"
    assert not series.stale  # 80 minutes old is within the 3 h limit
    assert series.carbon_at(NOW_S) == 100.0  # the recorded 10:00 value
    assert series.carbon_at(NOW_S + HOUR_S) == 100.0  # 11:00: forecast from what we had
    clock.advance(3 * HOUR_S)
    later = await signals.snapshot(["DE"])
    assert later.zones["DE"].stale
    assert later.stale_zones == ("DE",)
    assert later.zones["DE"].end_s > clock()  # still covers now and the horizon


async def test_with_nothing_live_or_cached_the_static_table_is_used_and_stale(
    clock: FakeClock,
) -> None:
    provider = FakeProvider("live", clock)
    provider.error = SignalUnavailable("never worked")
    static = StaticProvider(
        {"DE": StaticEntry(carbon_g_per_kwh=400.0, price_per_mwh=90.0)},
        use_builtin=False,
        clock=clock,
    )
    snapshot = await service([provider], clock, static=static).snapshot(["DE", "ATLANTIS"])
    assert list(snapshot.zones) == ["DE"]  # a zone nobody knows is left out
    series = snapshot.zones["DE"]
    assert series.source == "static (fallback)"
    assert series.stale
    np.testing.assert_array_equal(series.carbon_g_per_kwh, [400.0] * 5)
    np.testing.assert_array_equal(series.price_per_mwh, [90.0] * 5)
    assert series.start_s == epoch(2025, 5, 1, 8)


async def test_retry_after_is_honoured(clock: FakeClock) -> None:
    limited = FakeProvider("limited", clock)
    limited.error = SignalRateLimited("429", retry_after_s=600)
    backup = FakeProvider("backup", clock)
    signals = service([limited, backup], clock, cache_ttl_s=0)
    await signals.snapshot(["DE"])
    assert limited.calls["history"] == 1
    assert signals.blocked_until_s("limited") == NOW_S + 600
    limited.error = None
    clock.advance(599)
    assert (await signals.snapshot(["DE"])).zones["DE"].source == "backup"
    assert limited.calls["history"] == 1  # not asked again before it allows
    clock.advance(2)
    assert signals.blocked_until_s("limited") is None
    assert (await signals.snapshot(["DE"])).zones["DE"].source == "limited"
    assert limited.calls["history"] == 2


async def test_without_retry_after_and_on_auth_errors_the_configured_backoffs_apply(
    clock: FakeClock,
) -> None:
    limited = FakeProvider("limited", clock)
    limited.error = SignalRateLimited("429", retry_after_s=None)
    refused = FakeProvider("refused", clock)
    refused.error = SignalAuthError("401")
    signals = service([limited, refused], clock, rate_limit_backoff_s=45, auth_backoff_s=900)
    await signals.snapshot(["DE"])
    assert signals.blocked_until_s("limited") == NOW_S + 45
    assert signals.blocked_until_s("refused") == NOW_S + 900


async def test_the_providers_own_forecast_wins_and_ours_fills_beyond_it(clock: FakeClock) -> None:
    provider = FakeProvider("live", clock, forecast_hours=1)
    series = (await service([provider], clock).snapshot(["DE"])).zones["DE"]
    # 11:00 from the provider's forecast (500), 12:00 beyond it from persistence (100).
    np.testing.assert_array_equal(series.carbon_g_per_kwh[3:], [500.0, 100.0])


async def test_a_failed_forecast_keeps_the_history(clock: FakeClock) -> None:
    provider = FakeProvider("live", clock, forecast_hours=5)
    provider.forecast_error = SignalUnavailable("forecast not in plan")
    signals = service([provider], clock)
    series = (await signals.snapshot(["DE"])).zones["DE"]
    assert series.source == "live"
    np.testing.assert_array_equal(series.carbon_g_per_kwh[3:], [100.0, 100.0])


async def test_a_crashing_forecast_keeps_the_history_and_is_logged_once_a_while(
    clock: FakeClock,
) -> None:
    provider = FakeProvider("live", clock, forecast_hours=5)
    provider.forecast_error = ValueError("Invalid isoformat string: 'junk'")
    signals = service([provider], clock, cache_ttl_s=0)
    with capture_logs() as logs:
        for _ in range(3):
            series = (await signals.snapshot(["DE", "ZA"])).zones["DE"]
            assert (series.source, series.stale) == ("live", False)
            np.testing.assert_array_equal(series.carbon_g_per_kwh[3:], [100.0, 100.0])
    assert provider.calls["forecast"] == 6
    crashed = [log for log in logs if log["event"] == "signals.forecast_crashed"]
    assert len(crashed) == 1  # six failures, one line
    assert crashed[0]["provider"] == "live"
    assert "junk" in crashed[0]["error"]
    assert "exc_info" not in crashed[0]


async def test_a_rate_limited_forecast_blocks_the_provider_but_keeps_its_history(
    clock: FakeClock,
) -> None:
    provider = FakeProvider("live", clock, forecast_hours=5)
    provider.forecast_error = SignalRateLimited("429", retry_after_s=30)
    signals = service([provider], clock)
    series = (await signals.snapshot(["DE"])).zones["DE"]
    assert series.source == "live"
    assert signals.blocked_until_s("live") == NOW_S + 30


async def test_gaps_are_carried_forward_and_a_lagging_provider_is_forecast_from_its_end(
    clock: FakeClock,
) -> None:
    provider = FakeProvider("live", clock, lambda at: None if at.hour == 9 else at.hour * 10.0)
    series = (await service([provider], clock).snapshot(["DE"])).zones["DE"]
    np.testing.assert_array_equal(series.carbon_g_per_kwh[:3], [80.0, 80.0, 100.0])
    lagging = FakeProvider("lagging", clock)
    lagging.lag_hours = 2  # its newest value is 08:00
    series = (await service([lagging], clock).snapshot(["DE"])).zones["DE"]
    # The window is the usual one; hours after its newest value are forecast from it.
    assert series.start_s == epoch(2025, 5, 1, 8)
    np.testing.assert_array_equal(series.carbon_g_per_kwh, [80, 80, 80, 80, 80])
    assert series.end_s == epoch(2025, 5, 1, 13)


async def test_marginal_signals_stay_marginal(clock: FakeClock) -> None:
    provider = FakeProvider("watttime", clock, signal_type="marginal")
    series = (await service([provider], clock).snapshot(["CAISO"])).zones["CAISO"]
    assert series.signal_type == "marginal"


async def test_latest_goes_through_the_chain_with_staleness_and_static_price(
    clock: FakeClock,
) -> None:
    provider = FakeProvider("live", clock)
    static = StaticProvider(
        {"DE": StaticEntry(carbon_g_per_kwh=400.0, price_per_mwh=90.0)},
        use_builtin=False,
        clock=clock,
    )
    signals = service([provider], clock, static=static)
    reading = await signals.latest("DE")
    assert (reading.carbon_g_per_kwh, reading.price_per_mwh, reading.stale) == (100.0, 90.0, False)
    provider.error = SignalUnavailable("down")
    clock.advance(4 * HOUR_S)
    stale = await signals.latest("DE")
    assert stale.stale
    assert stale.carbon_g_per_kwh == 100.0
    assert epoch_s(stale.at) == epoch(2025, 5, 1, 10)
    unknown = await service([provider], clock, static=static).latest("DE")
    assert unknown.stale
    assert unknown.carbon_g_per_kwh == 400.0
    with pytest.raises(SignalUnavailable):
        await service([provider], clock).latest("DE")


def test_the_service_refuses_duplicate_providers(clock: FakeClock) -> None:
    with pytest.raises(ValueError, match="unique"):
        service([FakeProvider("a", clock), FakeProvider("a", clock)], clock)


async def test_an_answer_fetched_after_now_is_not_fresh(clock: FakeClock) -> None:
    # A replayed trace wraps at New Year: the signals clock jumps back a year. The
    # answer cached on 31 December is not "younger than the TTL" at 1 January.
    provider = FakeProvider("live", clock)
    signals = service([provider], clock)
    await signals.snapshot(["DE"])
    clock.advance(-120 * 24 * HOUR_S)
    series = (await signals.snapshot(["DE"])).zones["DE"]
    assert provider.calls["history"] == 2
    assert (series.source, series.stale) == ("live", False)
    assert series.carbon_at(clock()) == 100.0


async def test_an_answer_that_makes_no_series_is_forgotten(clock: FakeClock) -> None:
    provider = FakeProvider("live", clock)
    static = StaticProvider(
        {"DE": StaticEntry(carbon_g_per_kwh=400.0)}, use_builtin=False, clock=clock
    )
    signals = service([provider], clock, static=static)
    await signals.snapshot(["DE"])
    provider.error = SignalUnavailable("down")
    clock.advance(-120 * 24 * HOUR_S)  # every cached reading now lies after "now"
    assert (await signals.snapshot(["DE"])).zones["DE"].source == "static (fallback)"
    # Not kept as the zone's last good value: no reading from the future is reported.
    assert signals.newest_reading_s("DE") is None
    assert signals.state_entries == 0
