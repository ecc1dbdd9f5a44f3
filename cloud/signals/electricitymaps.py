"""Electricity Maps API v3 client: carbon intensity latest, history and forecast.

What this relies on (Electricity Maps API reference, docs.electricitymaps.com and
portal.electricitymaps.com/developer-hub/api/reference; the Green Software
Foundation Carbon Aware SDK's Electricity Maps data source,
`CarbonAware.DataSources.ElectricityMaps`, for the response models):

* base URL `https://api.electricitymaps.com/v3`, token in the `auth-token` header;
* `GET /carbon-intensity/latest?zone=Z` →
  `{"zone", "carbonIntensity", "datetime", "updatedAt", "emissionFactorType",
  "isEstimated", "estimationMethod"}`;
* `GET /carbon-intensity/history?zone=Z` → `{"zone", "history": [same objects]}`,
  the last 24 hours only, hourly; `carbonIntensity` may be null;
* `GET /carbon-intensity/past-range?zone=Z&start=…&end=…` → `{"zone", "data": [...]}`
  for older windows, at most 10 days (240 hours) per request at hourly granularity
  (a commercial endpoint: when the token's plan refuses it, we fall back to the
  last 24 hours of `history`);
* `GET /carbon-intensity/forecast?zone=Z` (`horizonHours`, up to 72) →
  `{"zone", "forecast": [{"carbonIntensity", "datetime"}], "updatedAt"}`;
* `emissionFactorType=lifecycle` (the default, LCA) or `direct` on every endpoint.

Units gCO2eq/kWh; signal type average (consumption-based, flow-traced mix).
No price: Electricity Maps sells day-ahead prices separately; readings have none.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

import aiohttp
import msgspec

from cloud.signals.datasets import EmissionFactor
from cloud.signals.http_client import HttpSource
from cloud.signals.model import (
    Forecast,
    ForecastPoint,
    GridReading,
    SignalAuthError,
    SignalUnavailable,
)
from cloud.signals.provider_time import provider_time
from cloud.signals.units import Clock, as_utc, iso_z, system_clock
from shared.clock import utc_from_epoch

DEFAULT_BASE_URL = "https://api.electricitymaps.com/v3"
HISTORY_WINDOW = timedelta(hours=24)
PAST_RANGE_LIMIT = timedelta(days=10)
MAX_FORECAST_HOURS = 72


# The API's JSON is camelCase (`carbonIntensity`); rename="camel" maps it to these names.
class IntensityPoint(msgspec.Struct, frozen=True, rename="camel"):
    datetime: str
    carbon_intensity: float | None = None
    is_estimated: bool | None = None
    zone: str | None = None


class HistoryResponse(msgspec.Struct, frozen=True, rename="camel"):
    history: list[IntensityPoint]
    zone: str | None = None


class PastRangeResponse(msgspec.Struct, frozen=True, rename="camel"):
    data: list[IntensityPoint]
    zone: str | None = None


class ForecastResponse(msgspec.Struct, frozen=True, rename="camel"):
    forecast: list[IntensityPoint]
    zone: str | None = None
    updated_at: str | None = None


_LATEST = msgspec.json.Decoder(IntensityPoint)
_HISTORY = msgspec.json.Decoder(HistoryResponse)
_PAST_RANGE = msgspec.json.Decoder(PastRangeResponse)
_FORECAST = msgspec.json.Decoder(ForecastResponse)


class ElectricityMapsProvider:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        *,
        token: str,
        base_url: str = DEFAULT_BASE_URL,
        timeout_s: float = 10.0,
        emission_factor: EmissionFactor = "lifecycle",
        clock: Clock = system_clock,
        name: str = "electricitymaps",
    ) -> None:
        self._http = HttpSource(
            session, provider=name, base_url=base_url, timeout_s=timeout_s, clock=clock
        )
        self._headers = {"auth-token": token}
        self._emission_factor = emission_factor
        self._clock = clock
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    def _params(self, zone: str, **extra: str | int) -> dict[str, str | int]:
        return {"zone": zone, "emissionFactorType": self._emission_factor, **extra}

    def _reading(self, zone: str, point: IntensityPoint) -> GridReading | None:
        value = point.carbon_intensity
        if value is None or not math.isfinite(value) or value < 0:
            return None
        return GridReading(
            zone=zone,
            at=provider_time(point.datetime, provider=self._name),
            carbon_g_per_kwh=float(value),
            signal_type="average",
            source=self._name,
            estimated=bool(point.is_estimated),
        )

    async def latest(self, zone: str) -> GridReading:
        point = await self._http.get(
            "carbon-intensity/latest", _LATEST, params=self._params(zone), headers=self._headers
        )
        reading = self._reading(zone, point) if point is not None else None
        if reading is None:
            raise SignalUnavailable(f"{self._name}: no current carbon intensity for {zone}")
        return reading

    async def history(self, zone: str, start: datetime, end: datetime) -> list[GridReading]:
        """Hourly values in [start, end): `history` for the last 24 h, `past-range` before."""
        start, end = as_utc(start), as_utc(end)
        now = utc_from_epoch(self._clock())
        points: list[IntensityPoint] = []
        if start < now - HISTORY_WINDOW:
            try:
                points = await self._past_range(zone, start, end)
            except SignalAuthError:
                # past-range is a commercial endpoint; plans without it still have 24 h.
                points = []
        if not points:
            response = await self._http.get(
                "carbon-intensity/history",
                _HISTORY,
                params=self._params(zone),
                headers=self._headers,
            )
            points = response.history if response is not None else []
        readings = (self._reading(zone, point) for point in points)
        return sorted(
            (r for r in readings if r is not None and start <= r.at < end),
            key=lambda reading: reading.at,
        )

    async def _past_range(self, zone: str, start: datetime, end: datetime) -> list[IntensityPoint]:
        points: list[IntensityPoint] = []
        chunk_start = start
        while chunk_start < end:
            chunk_end = min(end, chunk_start + PAST_RANGE_LIMIT)
            page = await self._http.get(
                "carbon-intensity/past-range",
                _PAST_RANGE,
                params=self._params(zone, start=iso_z(chunk_start), end=iso_z(chunk_end)),
                headers=self._headers,
            )
            points.extend(page.data if page is not None else [])
            chunk_start = chunk_end
        return points

    async def forecast(self, zone: str, start: datetime, end: datetime) -> Forecast | None:
        start, end = as_utc(start), as_utc(end)
        now = utc_from_epoch(self._clock())
        hours = max(1, min(MAX_FORECAST_HOURS, math.ceil((end - now).total_seconds() / 3600)))
        response = await self._http.get(
            "carbon-intensity/forecast",
            _FORECAST,
            params=self._params(zone, horizonHours=hours),
            headers=self._headers,
        )
        if response is None:
            return None
        points = [
            ForecastPoint(
                at=provider_time(p.datetime, provider=self._name),
                carbon_g_per_kwh=float(p.carbon_intensity),
            )
            for p in response.forecast
            if p.carbon_intensity is not None and math.isfinite(p.carbon_intensity)
        ]
        return Forecast(
            zone=zone,
            issued_at=provider_time(response.updated_at, provider=self._name)
            if response.updated_at
            else now,
            signal_type="average",
            points=[p for p in points if start <= p.at < end],
            source=self._name,
        )
