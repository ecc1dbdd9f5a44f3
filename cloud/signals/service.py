"""SignalService: cached, rate-limit-aware access to a chain of providers, frozen into GridSignals.

Per zone, the service tries the providers in order. Each (provider, zone) answer
is cached for `cache_ttl_s`; within that time the provider is not asked again.
A provider that answered 429 is not asked again before its `Retry-After` (or
`rate_limit_backoff_s` when it gave none); one that refused our credentials rests
for `auth_backoff_s`. When no provider answers live, the freshest cached answer
of any provider in the chain (the last good value) is used, however old; when
there is none, the static table (`StaticProvider`). A value is flagged stale
when its newest hour is older than `staleness_limit_s`, and every static
fallback is stale; the flag is carried into `ZoneSeries.stale` and so
`GridSignals.stale_zones`, where decisions can see it.

A reading or forecast point whose carbon intensity no grid has (negative, not finite,
above `model.MAX_CARBON_G_PER_KWH`) is dropped from every answer, as is a price beyond
`model.MAX_ABS_PRICE_PER_MWH`. An answer that still makes no series (`ZoneSeries`
refuses it, or assembling it fails) leaves its zone to the static table, like a zone
nobody answered for: it is forgotten, never served as the last good value, and the
snapshot's other zones are not affected.

A snapshot holds, per zone, the last `history_hours` recorded hours and
`horizon_hours` ahead: the provider's own forecast where it has one, otherwise
(and beyond its end) the configured forecaster applied to the recorded history.
Gaps in recorded history are carried forward from the previous hour (never
interpolated or back-filled). Hours without a price use the static table's price
for the zone when it has one, otherwise NaN.

All time comes from the injected clock: tests and the simulator never sleep.

Zones come from callers (`GET /v1/signals/{zone}` takes any string), so per-zone
state is bounded: a (provider, zone) lock exists only while a question is in
flight, answers are kept for at most `max_cached_answers` (provider, zone) pairs
(least recently used dropped first) and only when a provider answered, and the
warnings about unknown zones and failing providers are rate-limited (one line per
interval, with the count of the ones left out).
"""

from __future__ import annotations

import asyncio
import math
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace

import numpy as np
import structlog

from cloud.signals.forecast import DEFAULT_FORECASTER, Forecaster, forecast_carbon, forecaster_named
from cloud.signals.grid import FloatArray, GridSignals, ZoneSeries
from cloud.signals.hourly import bin_forecast, bin_readings, fill_forward, first_finite
from cloud.signals.model import (
    Forecast,
    GridReading,
    SignalAuthError,
    SignalError,
    SignalProvider,
    SignalRateLimited,
    SignalType,
    SignalUnavailable,
    plausible_carbon,
    plausible_price,
)
from cloud.signals.replay_time import replay_offset_s, retold
from cloud.signals.static import StaticProvider
from cloud.signals.units import (
    HOUR_S,
    Clock,
    epoch_s,
    floor_hour_s,
    system_clock,
)
from shared.clock import utc_from_epoch
from shared.logs import RateLimitedLog

DEFAULT_CACHE_TTL_S = 300.0
DEFAULT_STALENESS_LIMIT_S = 3 * HOUR_S
DEFAULT_HISTORY_HOURS = 24
DEFAULT_HORIZON_HOURS = 48
DEFAULT_RATE_LIMIT_BACKOFF_S = 60.0
DEFAULT_AUTH_BACKOFF_S = 900.0
DEFAULT_MAX_CACHED_ANSWERS = 4096  # (provider, zone) pairs; a real fleet has far fewer
DEFAULT_LOG_INTERVAL_S = 60.0


@dataclass(frozen=True, slots=True)
class ZoneAnswer:
    """What one provider said about one zone, and when we asked."""

    provider: str
    zone: str
    signal_type: SignalType
    history: tuple[GridReading, ...]  # sorted by time, at least one
    forecast: Forecast | None
    fetched_at_s: float

    @property
    def newest_s(self) -> float:
        return epoch_s(self.history[-1].at)


class SignalService:
    def __init__(
        self,
        providers: Sequence[SignalProvider],
        *,
        static: StaticProvider | None = None,
        clock: Clock = system_clock,
        planning_clock: Clock | None = None,
        cache_ttl_s: float = DEFAULT_CACHE_TTL_S,
        staleness_limit_s: float = DEFAULT_STALENESS_LIMIT_S,
        history_hours: int = DEFAULT_HISTORY_HOURS,
        horizon_hours: int = DEFAULT_HORIZON_HOURS,
        forecaster: Forecaster | str = DEFAULT_FORECASTER,
        rate_limit_backoff_s: float = DEFAULT_RATE_LIMIT_BACKOFF_S,
        auth_backoff_s: float = DEFAULT_AUTH_BACKOFF_S,
        max_cached_answers: int = DEFAULT_MAX_CACHED_ANSWERS,
        log_interval_s: float = DEFAULT_LOG_INTERVAL_S,
    ) -> None:
        names = [provider.name for provider in providers]
        if len(set(names)) != len(names):
            raise ValueError(f"provider names must be unique: {names}")
        if history_hours < 1 or horizon_hours < 0:
            raise ValueError("need history_hours >= 1 and horizon_hours >= 0")
        if cache_ttl_s < 0 or staleness_limit_s < 0:
            raise ValueError("cache_ttl_s and staleness_limit_s must be >= 0")
        if max_cached_answers < 1:
            raise ValueError("max_cached_answers must be >= 1")
        self._providers = list(providers)
        self._static = static
        self._clock = clock
        # The clock the snapshot's reader plans by, when it is not the signals' own
        # (a replayed trace): snapshots are retold on it (replay_time.py).
        self._planning_clock = planning_clock
        self._ttl_s = cache_ttl_s
        self._staleness_limit_s = staleness_limit_s
        self._history_hours = history_hours
        self._horizon_hours = horizon_hours
        self._forecaster = (
            forecaster_named(forecaster) if isinstance(forecaster, str) else forecaster
        )
        self._rate_limit_backoff_s = rate_limit_backoff_s
        self._auth_backoff_s = auth_backoff_s
        self._answers: OrderedDict[tuple[str, str], ZoneAnswer] = OrderedDict()
        self._max_cached_answers = max_cached_answers
        self._blocked_until_s: dict[str, float] = {}
        # (provider, zone) -> [lock, holders and waiters]; removed when the count is 0
        self._locks: dict[tuple[str, str], tuple[asyncio.Lock, list[int]]] = {}
        self._log = structlog.get_logger("greenfed.signals")
        self._limited_log = RateLimitedLog(self._log, log_interval_s)

    @property
    def state_entries(self) -> int:
        """Per-(provider, zone) entries held: locks in flight plus cached answers."""
        return len(self._locks) + len(self._answers)

    @asynccontextmanager
    async def _asking(self, key: tuple[str, str]) -> AsyncIterator[None]:
        """One question per (provider, zone) at a time; the lock lives only while used."""
        entry = self._locks.get(key)
        if entry is None:
            entry = self._locks[key] = (asyncio.Lock(), [0])
        lock, users = entry
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if users[0] == 0:
                del self._locks[key]

    def _remember(self, key: tuple[str, str], answer: ZoneAnswer) -> None:
        self._answers[key] = answer
        self._answers.move_to_end(key)
        while len(self._answers) > self._max_cached_answers:
            self._answers.popitem(last=False)

    def _forget(self, answer: ZoneAnswer) -> None:
        """Drop an answer that made no usable series, unless a newer one replaced it."""
        key = (answer.provider, answer.zone)
        if self._answers.get(key) is answer:
            del self._answers[key]

    @property
    def providers(self) -> tuple[str, ...]:
        return tuple(provider.name for provider in self._providers)

    def knows_zone(self, zone: str) -> bool:
        """A zone the static table lists or a provider has answered for. The API asks
        the chain only about these and the fleet's zones, so a caller's made-up zone
        costs no provider request and no state."""
        if self._static is not None and self._static.knows(zone):
            return True
        return any((provider.name, zone) in self._answers for provider in self._providers)

    def blocked_until_s(self, provider: str) -> float | None:
        """When a rate-limited or refused provider may be asked again (None: it may now)."""
        until = self._blocked_until_s.get(provider)
        return until if until is not None and until > self._clock() else None

    # ---- asking providers -------------------------------------------------------

    def _lookback_hours(self) -> int:
        return max(self._history_hours, self._forecaster.lookback_hours)

    async def _ask(self, provider: SignalProvider, zone: str, now_s: float) -> ZoneAnswer:
        hour_s = floor_hour_s(now_s)
        start = utc_from_epoch(hour_s - (self._lookback_hours() - 1) * HOUR_S)
        end = utc_from_epoch(hour_s + HOUR_S)
        answered = await provider.history(zone, start, end)
        history = sorted(self._plausible_readings(answered), key=lambda r: r.at)
        dropped = len(answered) - len(history)
        if not history:
            latest = await provider.latest(zone)
            if not plausible_carbon(latest.carbon_g_per_kwh):
                raise SignalUnavailable(
                    f"{provider.name}: {zone}: no plausible value "
                    f"(latest {latest.carbon_g_per_kwh} gCO2eq/kWh)"
                )
            history = self._plausible_readings([latest])
        forecast: Forecast | None = None
        try:
            forecast = await provider.forecast(
                zone, end, utc_from_epoch(hour_s + (self._horizon_hours + 1) * HOUR_S)
            )
        except SignalRateLimited as error:
            self._block(provider.name, error)
        except SignalError as error:
            # History is what matters; without the provider's forecast we make our own.
            self._log.info(
                "signals.forecast_unavailable", provider=provider.name, zone=zone, error=str(error)
            )
        except Exception as error:
            # A client bug in reading its forecast (a time it could not parse, say) must
            # not cost the zone the good history we already have: the same as above, but
            # a warning, one line per provider and kind of error per interval (a bug
            # repeats on every zone at every refresh).
            self._limited_log.warning(
                f"forecast_crashed:{provider.name}:{type(error).__name__}",
                "signals.forecast_crashed",
                provider=provider.name,
                zone=zone[:100],
                error=f"{type(error).__name__}: {error}"[:500],
            )
        if forecast is not None:
            points = [p for p in forecast.points if plausible_carbon(p.carbon_g_per_kwh)]
            dropped += len(forecast.points) - len(points)
            forecast = replace(
                forecast,
                points=[
                    p
                    if p.price_per_mwh is None or plausible_price(p.price_per_mwh)
                    else replace(p, price_per_mwh=None)
                    for p in points
                ],
            )
        if dropped:
            # Every client should have dropped these itself; one that did not must not
            # spoil the zone's series (or, before, every zone's snapshot).
            self._limited_log.warning(
                f"implausible_values:{provider.name}",
                "signals.implausible_values_dropped",
                provider=provider.name,
                zone=zone[:100],
                dropped=dropped,
            )
        return ZoneAnswer(
            provider=provider.name,
            zone=zone,
            signal_type=history[-1].signal_type,
            history=tuple(history),
            forecast=forecast,
            fetched_at_s=now_s,
        )

    @staticmethod
    def _plausible_readings(readings: Iterable[GridReading]) -> list[GridReading]:
        """The readings whose carbon intensity can be real (model.plausible_carbon); an
        absurd price is dropped from its reading, which keeps its intensity."""
        kept: list[GridReading] = []
        for reading in readings:
            if not plausible_carbon(reading.carbon_g_per_kwh):
                continue
            price = reading.price_per_mwh
            if price is not None and not plausible_price(price):
                reading = replace(reading, price_per_mwh=None, currency=None)
            kept.append(reading)
        return kept

    def _block(self, provider: str, error: SignalError) -> None:
        now_s = self._clock()
        if isinstance(error, SignalRateLimited):
            wait_s = error.retry_after_s
            if wait_s is None:
                wait_s = self._rate_limit_backoff_s
        else:
            wait_s = self._auth_backoff_s
        self._blocked_until_s[provider] = max(
            self._blocked_until_s.get(provider, 0.0), now_s + wait_s
        )
        self._log.warning(
            "signals.provider_backoff", provider=provider, wait_s=wait_s, error=str(error)
        )

    async def _answer(self, zone: str, now_s: float) -> tuple[ZoneAnswer | None, bool]:
        """(answer, live): a fresh cached or live answer, else the last good one, else None."""
        for provider in self._providers:
            key = (provider.name, zone)
            # One question per (provider, zone) at a time: concurrent snapshots share it.
            async with self._asking(key):
                cached = self._answers.get(key)
                # Fresh only when asked at or before now: a replayed trace's clock jumps
                # back a year at New Year, and an answer from "the future" is not young.
                if cached is not None and 0.0 <= now_s - cached.fetched_at_s < self._ttl_s:
                    self._answers.move_to_end(key)
                    return cached, True
                if self.blocked_until_s(provider.name) is not None:
                    continue
                try:
                    answer = await self._ask(provider, zone, now_s)
                except (SignalRateLimited, SignalAuthError) as error:
                    self._block(provider.name, error)
                    continue
                except SignalError as error:
                    # Per provider, not per zone: any string a caller sends is a "zone".
                    self._limited_log.warning(
                        f"provider_failed:{provider.name}",
                        "signals.provider_failed",
                        provider=provider.name,
                        zone=zone,
                        error=str(error)[:500],
                    )
                    continue
                except Exception:
                    # A provider bug must not take every zone's signals down with it.
                    self._log.exception(
                        "signals.provider_crashed", provider=provider.name, zone=zone
                    )
                    continue
                self._remember(key, answer)
                return answer, True
        cached_answers = (self._answers.get((provider.name, zone)) for provider in self._providers)
        last_good = [cached for cached in cached_answers if cached is not None]
        if last_good:
            return max(last_good, key=lambda cached: cached.newest_s), False
        return None, False

    # ---- public API -----------------------------------------------------------------

    def newest_reading_s(self, zone: str) -> float | None:
        """When the newest reading any provider gave for `zone` begins (None: none did;
        the zone is on the static table, or unknown). On the planning clock where the
        service has one, as its snapshots are: the age of a reading is then the same
        whichever clock it is read against."""
        times = [a.newest_s for (_, z), a in self._answers.items() if z == zone]
        if not times:
            return None
        if self._planning_clock is None:
            return max(times)
        return max(times) + replay_offset_s(self._planning_clock(), self._clock())

    async def latest(self, zone: str) -> GridReading:
        """The newest value for a zone through the chain, flagged stale when it is old."""
        now_s = self._clock()
        answer, _ = await self._answer(zone, now_s)
        if answer is not None:
            reading = answer.history[-1]
            stale = now_s - answer.newest_s > self._staleness_limit_s
            return _with_stale(reading, stale, self._static, zone)
        if self._static is not None and self._static.knows(zone):
            reading = await self._static.latest(zone)
            return _with_stale(reading, True, None, zone)
        raise SignalUnavailable(f"no provider has a value for zone {zone!r}")

    async def snapshot(self, zones: Iterable[str]) -> GridSignals:
        """GridSignals at the clock's now; zones nobody knows (not even static) are left out.

        With a planning clock, told on that clock (the values stay the signals' own)."""
        now_s = self._clock()
        wanted = sorted(set(zones))
        async with asyncio.TaskGroup() as group:
            tasks = {zone: group.create_task(self._series(zone, now_s)) for zone in wanted}
        series = {zone: task.result() for zone, task in tasks.items()}
        grid = GridSignals(
            now_s=now_s, zones={zone: s for zone, s in series.items() if s is not None}
        )
        if self._planning_clock is None:
            return grid
        return retold(grid, replay_offset_s(self._planning_clock(), now_s))

    async def _series(self, zone: str, now_s: float) -> ZoneSeries | None:
        answer, live = await self._answer(zone, now_s)
        if answer is not None:
            stale = now_s - answer.newest_s > self._staleness_limit_s
            source = answer.provider if live else f"{answer.provider} (last good)"
            try:
                return self._assemble(answer, now_s, stale=stale, source=source)
            except (SignalUnavailable, ValueError) as error:
                # Values no series may hold (ZoneSeries refuses them), or none at or
                # before now (SignalUnavailable; the clock went back). This zone falls
                # back like one without an answer; the snapshot's other zones must not
                # fail with it, and the answer must not come back as the last good one.
                self._forget(answer)
                self._log.warning(
                    "signals.unusable_answer",
                    zone=zone,
                    provider=answer.provider,
                    error=str(error)[:500],
                )
            except Exception:
                # A bug in assembling one zone (a forecaster's, say): the same.
                self._forget(answer)
                self._log.exception("signals.assembly_crashed", zone=zone, provider=answer.provider)
        if self._static is not None and self._static.knows(zone):
            self._log.warning("signals.static_fallback", zone=zone)
            return self._static_series(zone, now_s)
        self._limited_log.warning("zone_unknown", "signals.zone_unknown", zone=zone[:100])
        return None

    # ---- assembling hourly series ---------------------------------------------------

    def _static_price(self, zone: str) -> float:
        if self._static is None or not self._static.knows(zone):
            return math.nan
        price = self._static.entry(zone).price_per_mwh
        return math.nan if price is None else price

    def _static_series(self, zone: str, now_s: float) -> ZoneSeries:
        assert self._static is not None
        entry = self._static.entry(zone)
        hours = self._history_hours + self._horizon_hours
        price = math.nan if entry.price_per_mwh is None else entry.price_per_mwh
        return ZoneSeries(
            zone=zone,
            start_s=floor_hour_s(now_s) - (self._history_hours - 1) * HOUR_S,
            carbon_g_per_kwh=np.full(hours, entry.carbon_g_per_kwh),
            price_per_mwh=np.full(hours, price),
            signal_type=entry.signal_type,
            currency=entry.currency,
            stale=True,
            source=f"{self._static.name} (fallback)",
        )

    def _assemble(
        self, answer: ZoneAnswer, now_s: float, *, stale: bool, source: str
    ) -> ZoneSeries:
        lookback = self._lookback_hours()
        current_s = floor_hour_s(now_s)
        newest_s = floor_hour_s(answer.newest_s)
        # An answer may end before the current hour (a provider's lag, or a last good value).
        last_s = min(current_s, newest_s)
        first_s = last_s - (lookback - 1) * HOUR_S
        carbon, price = bin_readings(answer.history, first_s, lookback)
        begin = first_finite(carbon)
        if begin is None:  # every reading lies after the current hour (a skewed clock)
            raise SignalUnavailable(f"{answer.provider}: no value at or before now")
        known_start_s = first_s + begin * HOUR_S
        carbon = fill_forward(carbon[begin:])
        price = fill_forward(price[begin:])
        future = round((current_s - last_s) / HOUR_S) + self._horizon_hours
        carbon_future = forecast_carbon(self._forecaster, carbon, future)
        price_future = self._price_forecast(price, future, answer.zone)
        if answer.forecast is not None and answer.forecast.points:
            given_carbon, given_price = bin_forecast(
                answer.forecast.points, last_s + HOUR_S, future
            )
            carbon_future = np.maximum(
                np.where(np.isfinite(given_carbon), given_carbon, carbon_future), 0.0
            )
            price_future = np.where(np.isfinite(given_price), given_price, price_future)
        if not np.any(np.isfinite(price)):
            price = np.full(price.size, self._static_price(answer.zone))
        window_start_s = current_s - (self._history_hours - 1) * HOUR_S
        start_s = max(known_start_s, min(window_start_s, last_s))
        keep = round((last_s - start_s) / HOUR_S) + 1
        return ZoneSeries(
            zone=answer.zone,
            start_s=start_s,
            carbon_g_per_kwh=np.concatenate((carbon[-keep:], carbon_future)),
            price_per_mwh=np.concatenate((price[-keep:], price_future)),
            signal_type=answer.signal_type,
            currency=next((r.currency for r in reversed(answer.history) if r.currency), "USD"),
            stale=stale,
            source=source,
        )

    def _price_forecast(self, price: FloatArray, hours: int, zone: str) -> FloatArray:
        begin = first_finite(price)
        if begin is None:
            return np.full(hours, self._static_price(zone))
        return self._forecaster.forecast(price[begin:], hours)


def _with_stale(
    reading: GridReading, stale: bool, static: StaticProvider | None, zone: str
) -> GridReading:
    price, currency = reading.price_per_mwh, reading.currency
    if price is None and static is not None and static.knows(zone):
        entry = static.entry(zone)
        price, currency = (
            entry.price_per_mwh,
            entry.currency if entry.price_per_mwh is not None else None,
        )
    return GridReading(
        zone=reading.zone,
        at=reading.at,
        carbon_g_per_kwh=reading.carbon_g_per_kwh,
        signal_type=reading.signal_type,
        price_per_mwh=price,
        currency=currency,
        source=reading.source,
        estimated=reading.estimated,
        stale=stale or reading.stale,
    )
