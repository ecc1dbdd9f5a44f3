"""WattTime API v3 client: marginal emissions (`co2_moer`) now, historical and forecast.

What this relies on (WattTime API docs, docs.watttime.org, and its v2→v3
transition guide in WattTime/aer-test-docs `transition.md`; WattTime's own
Python client `watttime/api.py`; the Carbon Aware SDK's WattTime data source):

* `GET https://api.watttime.org/login` with HTTP basic auth → `{"token": "…"}`, a
  bearer token valid for 30 minutes. We log in again shortly before it expires
  (or when its JWT `exp` claim says so) and once more on a 401.
* `GET /v3/forecast?region=R&signal_type=co2_moer&horizon_hours=H` (H in 0–72) →
  `{"data": [{"point_time", "value"}], "meta": {"region", "signal_type", "units",
  "generated_at", "data_point_period_seconds", …}}`. With `horizon_hours=0` the
  single point is the current value: the transition guide's way to read "now".
* `GET /v3/historical?region=R&signal_type=co2_moer&start=…&end=…` → the same
  shape; at most 32 days per request (we ask for 30).
* `GET /v3/signal-index?region=R&signal_type=co2_moer` → the same shape, the value a
  0–100 percentile of the current MOER relative to recent history (`signal_index`).
* Units `lbs_co2_per_mwh`: 1 lb/MWh = 0.453592 g/kWh. Data points are 5 minutes;
  history and forecasts are averaged to hours here.
* Signal type marginal: MOER is the emission rate of the generator responding to
  a change in load, not the mix average.
* Rate limits: 3,000 requests per 5 minutes, 100 logins per 5 minutes; HTTP 429.

Zones are mapped to WattTime regions (`regions`, e.g. US-CAL-CISO → CAISO_NORTH);
a zone without a mapping is sent as the region name itself.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Mapping
from datetime import datetime, timedelta

import aiohttp
import msgspec
import structlog

from cloud.signals.hourly import hourly_means
from cloud.signals.http_client import HttpSource, Query
from cloud.signals.model import (
    Forecast,
    ForecastPoint,
    GridReading,
    SignalAuthError,
    SignalUnavailable,
    plausible_carbon,
)
from cloud.signals.provider_time import provider_time
from cloud.signals.units import (
    G_PER_KWH_PER_LB_PER_MWH,
    Clock,
    as_utc,
    system_clock,
)
from shared.clock import utc_from_epoch

DEFAULT_BASE_URL = "https://api.watttime.org"
SIGNAL_TYPE = "co2_moer"
TOKEN_LIFETIME_S = 30 * 60.0
TOKEN_REFRESH_MARGIN_S = 60.0
HISTORICAL_CHUNK = timedelta(days=30)
MAX_FORECAST_HOURS = 72
DEFAULT_REGIONS: Mapping[str, str] = {"US-CAL-CISO": "CAISO_NORTH"}

# Factor from each documented unit to gCO2/kWh.
_UNIT_TO_G_PER_KWH = {"lbs_co2_per_mwh": G_PER_KWH_PER_LB_PER_MWH}


class LoginResponse(msgspec.Struct, frozen=True):
    token: str


class DataPoint(msgspec.Struct, frozen=True):
    point_time: str
    value: float | None = None


class Meta(msgspec.Struct, frozen=True):
    units: str | None = None
    region: str | None = None
    signal_type: str | None = None
    generated_at: str | None = None


class DataResponse(msgspec.Struct, frozen=True):
    data: list[DataPoint]
    meta: Meta = Meta()


_LOGIN = msgspec.json.Decoder(LoginResponse)
_DATA = msgspec.json.Decoder(DataResponse)
_log = structlog.get_logger("greenfed.signals")


def jwt_expiry_s(token: str) -> float | None:
    """The `exp` claim of a JWT (epoch seconds), or None if the token is not a readable JWT."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    payload = parts[1] + "=" * (-len(parts[1]) % 4)
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload))
    except (binascii.Error, ValueError, RecursionError):  # RecursionError: nested too deeply
        return None
    expiry = claims.get("exp") if isinstance(claims, dict) else None
    return float(expiry) if isinstance(expiry, int | float) else None


class WattTimeProvider:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        *,
        username: str,
        password: str,
        base_url: str = DEFAULT_BASE_URL,
        timeout_s: float = 10.0,
        regions: Mapping[str, str] | None = None,
        clock: Clock = system_clock,
        name: str = "watttime",
    ) -> None:
        self._http = HttpSource(
            session, provider=name, base_url=base_url, timeout_s=timeout_s, clock=clock
        )
        credentials = base64.b64encode(f"{username}:{password}".encode()).decode("ascii")
        self._basic_auth = {"Authorization": f"Basic {credentials}"}
        self._regions = dict(DEFAULT_REGIONS if regions is None else regions)
        self._clock = clock
        self._name = name
        self._token: str | None = None
        self._token_expires_s = 0.0
        self.logins = 0  # how many times we logged in (observability and tests)

    @property
    def name(self) -> str:
        return self._name

    def region(self, zone: str) -> str:
        return self._regions.get(zone, zone)

    # ---- authentication ------------------------------------------------------

    async def _login(self) -> str:
        response = await self._http.get("login", _LOGIN, headers=self._basic_auth)
        if response is None or not response.token:
            raise SignalAuthError(f"{self._name}: login returned no token")
        self.logins += 1
        now = self._clock()
        expiry = jwt_expiry_s(response.token)
        self._token = response.token
        self._token_expires_s = expiry if expiry is not None else now + TOKEN_LIFETIME_S
        return response.token

    async def _valid_token(self) -> str:
        if self._token is None or self._clock() >= self._token_expires_s - TOKEN_REFRESH_MARGIN_S:
            return await self._login()
        return self._token

    async def _get(self, path: str, params: Query) -> DataResponse:
        token = await self._valid_token()
        try:
            response = await self._http.get(
                path, _DATA, params=params, headers={"Authorization": f"Bearer {token}"}
            )
        except SignalAuthError:
            # The token may have been revoked or expired early: log in once more.
            token = await self._login()
            response = await self._http.get(
                path, _DATA, params=params, headers={"Authorization": f"Bearer {token}"}
            )
        if response is None:
            raise SignalUnavailable(f"{self._name}: {path} returned no data")
        return response

    # ---- values ----------------------------------------------------------------

    def _factor(self, response: DataResponse, path: str) -> float:
        units = response.meta.units or "lbs_co2_per_mwh"
        try:
            return _UNIT_TO_G_PER_KWH[units]
        except KeyError:
            raise SignalUnavailable(
                f"{self._name}: {path} reported unknown units {units!r}"
            ) from None

    def _points(self, response: DataResponse, path: str) -> list[tuple[datetime, float]]:
        """(time, gCO2/kWh) of the points with a value. Nulls are gaps; a negative or
        absurd value (model.plausible_carbon) is dropped too, and counted in a warning:
        averaged into an hour it would spoil the hour, or every series built on it."""
        factor = self._factor(response, path)
        points: list[tuple[datetime, float]] = []
        dropped = 0
        for point in response.data:
            if point.value is None or not math.isfinite(point.value):
                continue
            value = point.value * factor
            if not plausible_carbon(value):
                dropped += 1
                continue
            points.append((provider_time(point.point_time, provider=self._name), value))
        if dropped:
            _log.warning(
                "signals.implausible_points_dropped",
                provider=self._name,
                path=path,
                dropped=dropped,
                kept=len(points),
            )
        return points

    async def latest(self, zone: str) -> GridReading:
        path = "v3/forecast"
        response = await self._get(
            path, {"region": self.region(zone), "signal_type": SIGNAL_TYPE, "horizon_hours": 0}
        )
        points = self._points(response, path)
        if not points:
            raise SignalUnavailable(f"{self._name}: no current value for {zone}")
        at, value = points[0]
        return GridReading(
            zone=zone,
            at=at,
            carbon_g_per_kwh=value,
            signal_type="marginal",
            source=self._name,
            estimated=True,  # the first forecast point: WattTime's real-time estimate
        )

    async def signal_index(self, zone: str) -> float:
        """The current MOER as a 0–100 percentile of recent history (higher is dirtier)."""
        path = "v3/signal-index"
        response = await self._get(path, {"region": self.region(zone), "signal_type": SIGNAL_TYPE})
        values = [p.value for p in response.data if p.value is not None and math.isfinite(p.value)]
        if not values:
            raise SignalUnavailable(f"{self._name}: no signal index for {zone}")
        return float(values[0])

    async def history(self, zone: str, start: datetime, end: datetime) -> list[GridReading]:
        """Hourly means of the 5-minute MOER in [start, end); hours with no value are absent."""
        start, end = as_utc(start), as_utc(end)
        path = "v3/historical"
        points: list[tuple[datetime, float]] = []
        chunk_start = start
        while chunk_start < end:
            chunk_end = min(end, chunk_start + HISTORICAL_CHUNK)
            response = await self._get(
                path,
                {
                    "region": self.region(zone),
                    "signal_type": SIGNAL_TYPE,
                    "start": chunk_start.isoformat(),
                    "end": chunk_end.isoformat(),
                },
            )
            points.extend(self._points(response, path))
            chunk_start = chunk_end
        hours = hourly_means((at, value, False) for at, value in points if start <= at < end)
        return [
            GridReading(
                zone=zone,
                at=hour.hour,
                carbon_g_per_kwh=hour.value,
                signal_type="marginal",
                source=self._name,
            )
            for hour in hours
        ]

    async def forecast(self, zone: str, start: datetime, end: datetime) -> Forecast | None:
        start, end = as_utc(start), as_utc(end)
        now = utc_from_epoch(self._clock())
        horizon = max(1, min(MAX_FORECAST_HOURS, math.ceil((end - now).total_seconds() / 3600)))
        path = "v3/forecast"
        response = await self._get(
            path,
            {"region": self.region(zone), "signal_type": SIGNAL_TYPE, "horizon_hours": horizon},
        )
        points = [(at, value) for at, value in self._points(response, path) if start <= at < end]
        hours = hourly_means((at, value, True) for at, value in points)
        generated = response.meta.generated_at
        return Forecast(
            zone=zone,
            issued_at=provider_time(generated, provider=self._name) if generated else now,
            signal_type="marginal",
            points=[ForecastPoint(at=h.hour, carbon_g_per_kwh=h.value) for h in hours],
            source=self._name,
        )
