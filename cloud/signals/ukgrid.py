"""UK Carbon Intensity API client (National Grid ESO / NESO, carbonintensity.org.uk): no auth.

What this relies on (the API's OpenAPI definitions, carbon-intensity/api-definitions,
and the documentation at carbon-intensity.github.io/api-definitions):

* base URL `https://api.carbonintensity.org.uk`, no authentication, CC BY 4.0 data;
* national, Great Britain — zone `GB`:
  `GET /intensity` (the current half hour), `GET /intensity/{from}/{to}`,
  `GET /intensity/{from}/fw48h` → `{"data": [{"from", "to", "intensity":
  {"forecast", "actual", "index"}}]}`; `actual` is null for the future and
  sometimes missing for the past;
* regional — zone `GB-<regionid>` (1–17, e.g. `GB-13` London) or a named alias
  below: `GET /regional/regionid/{id}` (current) →
  `{"data": [{"regionid", "dnoregion", "shortname", "data": [slot…]}]}`, and
  `GET /regional/intensity/{from}/{to}/regionid/{id}`,
  `GET /regional/intensity/{from}/fw48h/regionid/{id}` →
  `{"data": {"regionid", "shortname", "data": [slot…]}}` where a slot is
  `{"from", "to", "intensity": {"forecast", "index"}, "generationmix": […]}`.
  Regional series carry forecasts only, no outturn: every regional value is an
  estimate;
* times `YYYY-MM-DDThh:mmZ` (UTC), half-hour settlement periods; date ranges of at
  most 14 days per request.

Half hours are averaged to hours (the mean of the slots present; an hour with no
valid slot is absent). National history uses `actual` where given, else the
forecast, flagged estimated. Units gCO2/kWh; signal type average (operational
emissions of the generation mix, imports included).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime, timedelta
from types import MappingProxyType

import aiohttp
import msgspec

from cloud.signals.hourly import hourly_means
from cloud.signals.http_client import HttpSource
from cloud.signals.model import Forecast, ForecastPoint, GridReading, SignalUnavailable
from cloud.signals.provider_time import provider_time
from cloud.signals.units import Clock, as_utc, system_clock
from shared.clock import utc_from_epoch

DEFAULT_BASE_URL = "https://api.carbonintensity.org.uk"
NATIONAL_ZONE = "GB"
RANGE_LIMIT = timedelta(days=14)

REGION_IDS: Mapping[str, int] = MappingProxyType(
    {
        "GB-NORTH-SCOTLAND": 1,
        "GB-SOUTH-SCOTLAND": 2,
        "GB-NORTH-WEST-ENGLAND": 3,
        "GB-NORTH-EAST-ENGLAND": 4,
        "GB-YORKSHIRE": 5,
        "GB-NORTH-WALES-MERSEYSIDE": 6,
        "GB-SOUTH-WALES": 7,
        "GB-WEST-MIDLANDS": 8,
        "GB-EAST-MIDLANDS": 9,
        "GB-EAST-ENGLAND": 10,
        "GB-SOUTH-WEST-ENGLAND": 11,
        "GB-SOUTH-ENGLAND": 12,
        "GB-LONDON": 13,
        "GB-SOUTH-EAST-ENGLAND": 14,
        "GB-ENGLAND": 15,
        "GB-SCOTLAND": 16,
        "GB-WALES": 17,
    }
)


class Intensity(msgspec.Struct, frozen=True):
    forecast: float | None = None
    actual: float | None = None
    index: str | None = None


class Slot(msgspec.Struct, frozen=True, rename={"start": "from", "end": "to"}):
    start: str
    end: str
    intensity: Intensity


class NationalResponse(msgspec.Struct, frozen=True):
    data: list[Slot]


class Region(msgspec.Struct, frozen=True):
    data: list[Slot]
    regionid: int | None = None
    shortname: str | None = None


class RegionListResponse(msgspec.Struct, frozen=True):
    data: list[Region]


class RegionResponse(msgspec.Struct, frozen=True):
    data: Region


_NATIONAL = msgspec.json.Decoder(NationalResponse)
_REGION_LIST = msgspec.json.Decoder(RegionListResponse)
_REGION = msgspec.json.Decoder(RegionResponse)


def api_time(at: datetime) -> str:
    return as_utc(at).strftime("%Y-%m-%dT%H:%MZ")


def region_id(zone: str) -> int | None:
    """None for the national zone `GB`; the regional id for `GB-<n>` or a named alias."""
    if zone == NATIONAL_ZONE:
        return None
    if zone in REGION_IDS:
        return REGION_IDS[zone]
    suffix = zone.removeprefix("GB-")
    if suffix != zone and suffix.isdigit() and 1 <= int(suffix) <= 17:
        return int(suffix)
    raise SignalUnavailable(f"uk-carbon-intensity: unknown zone {zone!r} (GB, GB-1 … GB-17)")


def _valid(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) and value >= 0 else None


class UkCarbonIntensityProvider:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        *,
        base_url: str = DEFAULT_BASE_URL,
        timeout_s: float = 10.0,
        clock: Clock = system_clock,
        name: str = "uk-carbon-intensity",
    ) -> None:
        self._http = HttpSource(
            session, provider=name, base_url=base_url, timeout_s=timeout_s, clock=clock
        )
        self._clock = clock
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    async def _slots(self, zone: str, path_national: str, path_regional: str) -> list[Slot]:
        region = region_id(zone)
        if region is None:
            national = await self._http.get(path_national, _NATIONAL)
            return national.data if national is not None else []
        regional = await self._http.get(path_regional.format(region=region), _REGION)
        return regional.data.data if regional is not None else []

    @staticmethod
    def _value(slot: Slot) -> tuple[float | None, bool]:
        """(gCO2/kWh, estimated): the outturn when published, else the forecast."""
        actual = _valid(slot.intensity.actual)
        if actual is not None:
            return actual, False
        return _valid(slot.intensity.forecast), True

    async def latest(self, zone: str) -> GridReading:
        region = region_id(zone)
        if region is None:
            national = await self._http.get("intensity", _NATIONAL)
            slots = national.data if national is not None else []
        else:
            listing = await self._http.get(f"regional/regionid/{region}", _REGION_LIST)
            slots = [slot for entry in (listing.data if listing else []) for slot in entry.data]
        for slot in reversed(slots):
            value, estimated = self._value(slot)
            if value is not None:
                return GridReading(
                    zone=zone,
                    at=provider_time(slot.start, provider=self._name),
                    carbon_g_per_kwh=value,
                    signal_type="average",
                    source=self._name,
                    estimated=estimated,
                )
        raise SignalUnavailable(f"{self._name}: no current intensity for {zone}")

    async def history(self, zone: str, start: datetime, end: datetime) -> list[GridReading]:
        start, end = as_utc(start), as_utc(end)
        slots: list[Slot] = []
        chunk_start = start
        while chunk_start < end:
            chunk_end = min(end, chunk_start + RANGE_LIMIT)
            span = f"{api_time(chunk_start)}/{api_time(chunk_end)}"
            slots.extend(
                await self._slots(
                    zone, f"intensity/{span}", f"regional/intensity/{span}/regionid/{{region}}"
                )
            )
            chunk_start = chunk_end
        rows = []
        for slot in slots:
            at = provider_time(slot.start, provider=self._name)
            if start <= at < end:
                value, estimated = self._value(slot)
                rows.append((at, value, estimated))
        return [
            GridReading(
                zone=zone,
                at=hour.hour,
                carbon_g_per_kwh=hour.value,
                signal_type="average",
                source=self._name,
                estimated=hour.estimated,
            )
            for hour in hourly_means(rows)
        ]

    async def forecast(self, zone: str, start: datetime, end: datetime) -> Forecast | None:
        start, end = as_utc(start), as_utc(end)
        now = utc_from_epoch(self._clock())
        origin = api_time(max(start, now))
        slots = await self._slots(
            zone,
            f"intensity/{origin}/fw48h",
            f"regional/intensity/{origin}/fw48h/regionid/{{region}}",
        )
        timed = [(provider_time(slot.start, provider=self._name), slot) for slot in slots]
        rows = [
            (at, _valid(slot.intensity.forecast), True) for at, slot in timed if start <= at < end
        ]
        return Forecast(
            zone=zone,
            issued_at=now,
            signal_type="average",
            points=[ForecastPoint(at=h.hour, carbon_g_per_kwh=h.value) for h in hourly_means(rows)],
            source=self._name,
        )
