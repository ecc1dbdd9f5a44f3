"""Green Software Foundation Carbon Aware SDK Web API client (a self-hosted service).

What this relies on (Green-Software-Foundation/carbon-aware-sdk:
`src/CarbonAware.WebApi/src/README.md` and `Controllers/CarbonAwareController.cs`):

* `GET /emissions/bylocation?location=L&time=…&toTime=…` → 200 with
  `[{"location", "time", "rating", "duration"}]` (rating in g/kWh, duration a
  .NET TimeSpan such as `"00:05:00"`), or 204 No Content when there is no data;
* `GET /emissions/forecasts/current?location=L&dataStartAt=…&dataEndAt=…` → 200 with
  `[{"generatedAt", "requestedAt", "location", "dataStartAt", "dataEndAt",
  "windowSize", "optimalDataPoints", "forecastData": [{"location", "timestamp",
  "duration", "value"}]}]`, one element per location; 501 when the SDK's data
  source cannot forecast (we then return None); 400 (ValidationProblemDetails)
  for an unknown location.
* No authentication of its own (deployments put it behind their own gateway).

Locations are the SDK's names (cloud regions such as `eastus`, or whatever its
location configuration defines); `locations` maps greenfed zones to them and a
zone without a mapping is sent as is. The signal type depends on the SDK's
configured data source (WattTime: marginal; Electricity Maps: average), so it is
a setting here. Values are averaged to hours.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime, timedelta

import aiohttp
import msgspec

from cloud.signals.hourly import hourly_means
from cloud.signals.http_client import HttpSource
from cloud.signals.model import (
    Forecast,
    ForecastPoint,
    GridReading,
    SignalType,
    SignalUnavailable,
)
from cloud.signals.provider_time import provider_time
from cloud.signals.units import Clock, as_utc, iso_z, system_clock
from shared.clock import utc_from_epoch

LATEST_WINDOW = timedelta(hours=2)


class EmissionsData(msgspec.Struct, frozen=True):
    time: str
    rating: float | None = None
    location: str | None = None
    duration: str | None = None


class ForecastDataPoint(msgspec.Struct, frozen=True):
    timestamp: str
    value: float | None = None
    location: str | None = None
    duration: int | None = None


class EmissionsForecast(msgspec.Struct, frozen=True, rename="camel"):
    forecast_data: list[ForecastDataPoint] = []
    generated_at: str | None = None
    location: str | None = None


_EMISSIONS = msgspec.json.Decoder(list[EmissionsData])
_FORECASTS = msgspec.json.Decoder(list[EmissionsForecast])


class CarbonAwareSdkProvider:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        *,
        base_url: str,
        timeout_s: float = 10.0,
        locations: Mapping[str, str] | None = None,
        signal_type: SignalType = "marginal",
        clock: Clock = system_clock,
        name: str = "carbon-aware-sdk",
    ) -> None:
        self._http = HttpSource(
            session, provider=name, base_url=base_url, timeout_s=timeout_s, clock=clock
        )
        self._locations = dict(locations or {})
        self._signal_type: SignalType = signal_type
        self._clock = clock
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    def location(self, zone: str) -> str:
        return self._locations.get(zone, zone)

    async def _emissions(self, zone: str, start: datetime, end: datetime) -> list[EmissionsData]:
        rows = await self._http.get(
            "emissions/bylocation",
            _EMISSIONS,
            params={"location": self.location(zone), "time": iso_z(start), "toTime": iso_z(end)},
        )
        return rows or []

    async def latest(self, zone: str) -> GridReading:
        now = utc_from_epoch(self._clock())
        rows = [
            (provider_time(row.time, provider=self._name), row.rating)
            for row in await self._emissions(zone, now - LATEST_WINDOW, now)
            if row.rating is not None and math.isfinite(row.rating) and row.rating >= 0
        ]
        if not rows:
            raise SignalUnavailable(f"{self._name}: no recent emissions data for {zone}")
        at, rating = max(rows, key=lambda row: row[0])
        return GridReading(
            zone=zone,
            at=at,
            carbon_g_per_kwh=rating,
            signal_type=self._signal_type,
            source=self._name,
        )

    async def history(self, zone: str, start: datetime, end: datetime) -> list[GridReading]:
        start, end = as_utc(start), as_utc(end)
        rows = [
            (provider_time(row.time, provider=self._name), row.rating, False)
            for row in await self._emissions(zone, start, end)
        ]
        return [
            GridReading(
                zone=zone,
                at=hour.hour,
                carbon_g_per_kwh=hour.value,
                signal_type=self._signal_type,
                source=self._name,
            )
            for hour in hourly_means((at, value, e) for at, value, e in rows if start <= at < end)
        ]

    async def forecast(self, zone: str, start: datetime, end: datetime) -> Forecast | None:
        start, end = as_utc(start), as_utc(end)
        forecasts = await self._http.get(
            "emissions/forecasts/current",
            _FORECASTS,
            params={
                "location": self.location(zone),
                "dataStartAt": iso_z(start),
                "dataEndAt": iso_z(end),
            },
            none_for_statuses=(501,),  # the SDK's data source does not forecast
        )
        if not forecasts:
            return None
        first = forecasts[0]
        timed = [
            (provider_time(point.timestamp, provider=self._name), point)
            for point in first.forecast_data
        ]
        rows = [(at, point.value, True) for at, point in timed if start <= at < end]
        return Forecast(
            zone=zone,
            issued_at=(
                provider_time(first.generated_at, provider=self._name)
                if first.generated_at
                else utc_from_epoch(self._clock())
            ),
            signal_type=self._signal_type,
            points=[ForecastPoint(at=h.hour, carbon_g_per_kwh=h.value) for h in hourly_means(rows)],
            source=self._name,
        )
