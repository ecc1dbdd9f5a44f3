"""Replay of recorded hourly carbon and price series (the shipped 2023 data or `--carbon-dir`).

`TraceProvider` reads a directory in the Electricity Maps export format (see
`datasets`) and answers as of a "now" given by its clock: the simulator passes its
simulated clock, a live deployment replays the same date and time in the trace's
year (`replay_clock`). It never reveals the future: `history` stops at the
current hour and `forecast` is None (a trace holds no forecast), so the service
forecasts from history as it would for any provider without one. For an upper
bound on what forecasts are worth, `perfect_forecast=True` makes the recorded
future the forecast.

Values: the life-cycle (LCA) column by default, `emission_factor="direct"` for
operational emissions; signal type average; prices in USD/MWh.

`zone_series` / `grid_signals` are the fast, synchronous path for the simulator:
no asyncio, cached per (zone, hour), a few microseconds on a cache hit.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path

import numpy as np

from cloud.signals.datasets import EmissionFactor, HourlyTrace, load_traces
from cloud.signals.forecast import DEFAULT_FORECASTER, Forecaster, forecast_carbon, forecaster_named
from cloud.signals.grid import FloatArray, GridSignals, ZoneSeries
from cloud.signals.hourly import fill_forward, first_finite
from cloud.signals.model import Forecast, ForecastPoint, GridReading, SignalUnavailable
from cloud.signals.units import (
    HOUR_S,
    Clock,
    epoch_s,
    replay_clock,
)
from shared.clock import utc_from_epoch

TRACE_YEAR = 2023
DEFAULT_HISTORY_HOURS = 24
DEFAULT_HORIZON_HOURS = 48
_CACHE_ENTRIES = 8192


class TraceProvider:
    def __init__(
        self,
        directory: Path | str | None = None,
        *,
        emission_factor: EmissionFactor = "lifecycle",
        clock: Clock | None = None,
        perfect_forecast: bool = False,
        name: str = "trace",
    ) -> None:
        # A zone whose column holds no value at all is no series: it is left out like a
        # zone without a file (an evaluation may then allow it as a missing zone).
        self._traces: Mapping[str, HourlyTrace] = {
            zone: trace
            for zone, trace in load_traces(directory).items()
            if np.isfinite(trace.carbon(emission_factor)).any()
        }
        self._emission_factor: EmissionFactor = emission_factor
        self._clock = clock or replay_clock(TRACE_YEAR)
        self._perfect_forecast = perfect_forecast
        self._name = name
        self._cache: OrderedDict[tuple[str, int, int, int, str], ZoneSeries] = OrderedDict()

    @property
    def name(self) -> str:
        return self._name

    @property
    def zones(self) -> tuple[str, ...]:
        return tuple(sorted(self._traces))

    @property
    def emission_factor(self) -> EmissionFactor:
        return self._emission_factor

    def trace(self, zone: str) -> HourlyTrace:
        try:
            return self._traces[zone]
        except KeyError:
            raise SignalUnavailable(
                f"{self._name}: no trace for zone {zone!r} (have {', '.join(self.zones)})"
            ) from None

    # ---- SignalProvider ------------------------------------------------------

    def _reading(self, trace: HourlyTrace, index: int) -> GridReading | None:
        carbon = float(trace.carbon(self._emission_factor)[index])
        if not math.isfinite(carbon):
            return None
        price = float(trace.price_per_mwh[index])
        has_price = math.isfinite(price)
        return GridReading(
            zone=trace.zone,
            at=utc_from_epoch(trace.start_s + index * HOUR_S),
            carbon_g_per_kwh=carbon,
            signal_type="average",
            price_per_mwh=price if has_price else None,
            currency=trace.currency if has_price else None,
            source=self._name,
            estimated=bool(trace.estimated[index]),
        )

    async def latest(self, zone: str) -> GridReading:
        trace = self.trace(zone)
        now = trace.hour_index(self._clock())
        carbon = trace.carbon(self._emission_factor)
        if now < 0:
            raise SignalUnavailable(f"{self._name}: {zone} trace starts after now")
        # The latest recorded hour at or before now (the trace may end, or have gaps).
        for index in range(min(now, trace.hours - 1), -1, -1):
            if math.isfinite(carbon[index]):
                reading = self._reading(trace, index)
                assert reading is not None
                return reading
        raise SignalUnavailable(f"{self._name}: {zone} has no value at or before now")

    async def history(self, zone: str, start: datetime, end: datetime) -> list[GridReading]:
        """Recorded hours starting in [start, end), never later than the current hour."""
        trace = self.trace(zone)
        first = max(0, math.ceil((epoch_s(start) - trace.start_s) / HOUR_S))
        stop = min(
            trace.hours,
            math.ceil((epoch_s(end) - trace.start_s) / HOUR_S),
            trace.hour_index(self._clock()) + 1,
        )
        readings = (self._reading(trace, index) for index in range(first, stop))
        return [reading for reading in readings if reading is not None]

    async def forecast(self, zone: str, start: datetime, end: datetime) -> Forecast | None:
        if not self._perfect_forecast:
            return None
        trace = self.trace(zone)
        now = self._clock()
        first = max(
            0, trace.hour_index(now) + 1, math.ceil((epoch_s(start) - trace.start_s) / HOUR_S)
        )
        stop = min(trace.hours, math.ceil((epoch_s(end) - trace.start_s) / HOUR_S))
        carbon = trace.carbon(self._emission_factor)
        points = [
            ForecastPoint(
                at=utc_from_epoch(trace.start_s + index * HOUR_S),
                carbon_g_per_kwh=float(carbon[index]),
                price_per_mwh=(
                    float(trace.price_per_mwh[index])
                    if math.isfinite(trace.price_per_mwh[index])
                    else None
                ),
            )
            for index in range(first, stop)
            if math.isfinite(carbon[index])
        ]
        return Forecast(
            zone=zone,
            issued_at=utc_from_epoch(now),
            signal_type="average",
            points=points,
            source=f"{self._name} (recorded future)",
        )

    # ---- fast synchronous path ------------------------------------------------

    def zone_series(
        self,
        zone: str,
        now_s: float,
        *,
        history_hours: int = DEFAULT_HISTORY_HOURS,
        horizon_hours: int = DEFAULT_HORIZON_HOURS,
        forecaster: Forecaster | str = DEFAULT_FORECASTER,
    ) -> ZoneSeries:
        """Recorded hours up to the one containing now_s, then `horizon_hours` forecast hours.

        The series starts `history_hours - 1` hours before the current hour (or at the
        trace's first hour). Future hours come from `forecaster` applied to the
        recorded past (or the recorded future itself with `perfect_forecast`).
        Raises SignalUnavailable for an unknown zone or a now_s before the trace.
        """
        if history_hours < 1 or horizon_hours < 0:
            raise ValueError("need history_hours >= 1 and horizon_hours >= 0")
        model = forecaster_named(forecaster) if isinstance(forecaster, str) else forecaster
        trace = self.trace(zone)
        now = trace.hour_index(now_s)
        key = (zone, now, history_hours, horizon_hours, model.name)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        series = self._build(trace, now, history_hours, horizon_hours, model)
        self._cache[key] = series
        if len(self._cache) > _CACHE_ENTRIES:
            self._cache.popitem(last=False)
        return series

    def _build(
        self,
        trace: HourlyTrace,
        now: int,
        history_hours: int,
        horizon_hours: int,
        model: Forecaster,
    ) -> ZoneSeries:
        if now < 0:
            raise SignalUnavailable(f"{self._name}: {trace.zone} trace starts after now")
        last_known = min(now, trace.hours - 1)
        lookback = max(history_hours, model.lookback_hours)
        first = max(0, last_known + 1 - lookback)
        carbon = fill_forward(trace.carbon(self._emission_factor)[first : last_known + 1])
        price = fill_forward(trace.price_per_mwh[first : last_known + 1])
        known_from = first_finite(carbon)
        if known_from is None:
            raise SignalUnavailable(f"{self._name}: {trace.zone} has no value at or before now")
        carbon, price = carbon[known_from:], price[known_from:]
        # Hours from just after the last recorded one to the end of the horizon.
        future = now + horizon_hours - last_known
        carbon_future = forecast_carbon(model, carbon, future)
        price_future = self._forecast_price(model, price, future)
        if self._perfect_forecast:
            carbon_future, price_future = self._recorded_future(
                trace, last_known, future, carbon_future, price_future
            )
        keep = min(history_hours, carbon.size)
        start_index = first + known_from + carbon.size - keep
        return ZoneSeries(
            zone=trace.zone,
            start_s=trace.start_s + start_index * HOUR_S,
            carbon_g_per_kwh=np.concatenate((carbon[-keep:], carbon_future)),
            price_per_mwh=np.concatenate((price[-keep:], price_future)),
            signal_type="average",
            currency=trace.currency,
            stale=now > trace.hours - 1,
            source=self._name,
        )

    @staticmethod
    def _forecast_price(model: Forecaster, price: FloatArray, hours: int) -> FloatArray:
        known_from = first_finite(price)
        if known_from is None:
            return np.full(hours, np.nan)
        return model.forecast(price[known_from:], hours)

    def _recorded_future(
        self,
        trace: HourlyTrace,
        last_known: int,
        hours: int,
        carbon_future: FloatArray,
        price_future: FloatArray,
    ) -> tuple[FloatArray, FloatArray]:
        stop = min(trace.hours, last_known + 1 + hours)
        recorded_carbon = trace.carbon(self._emission_factor)[last_known + 1 : stop]
        recorded_price = trace.price_per_mwh[last_known + 1 : stop]
        carbon = carbon_future.copy()
        price = price_future.copy()
        carbon[: recorded_carbon.size] = np.where(
            np.isfinite(recorded_carbon), recorded_carbon, carbon[: recorded_carbon.size]
        )
        price[: recorded_price.size] = np.where(
            np.isfinite(recorded_price), recorded_price, price[: recorded_price.size]
        )
        return carbon, price

    def grid_signals(
        self,
        zones: Iterable[str],
        now_s: float,
        *,
        history_hours: int = DEFAULT_HISTORY_HOURS,
        horizon_hours: int = DEFAULT_HORIZON_HOURS,
        forecaster: Forecaster | str = DEFAULT_FORECASTER,
    ) -> GridSignals:
        """A GridSignals snapshot at now_s for the zones this trace knows; others are left out."""
        series = {
            zone: self.zone_series(
                zone,
                now_s,
                history_hours=history_hours,
                horizon_hours=horizon_hours,
                forecaster=forecaster,
            )
            for zone in zones
            if zone in self._traces
        }
        return GridSignals(now_s=now_s, zones=series)
