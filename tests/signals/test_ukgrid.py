"""UK Carbon Intensity API client: national and regional, half hours aggregated to hours."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterator
from datetime import datetime, timedelta

import aiohttp
import pytest
from aiohttp import web

from cloud.signals.model import SignalRateLimited, SignalUnavailable
from cloud.signals.ukgrid import UkCarbonIntensityProvider, region_id

from .support import FakeClock, serve, utc

NOW = utc(2025, 5, 1, 10, 40)


def stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%MZ")


def slot(
    at: datetime, forecast: float | None, actual: float | None = None, regional: bool = False
) -> dict[str, object]:
    intensity: dict[str, object] = {"forecast": forecast, "index": "moderate"}
    if not regional:
        intensity["actual"] = actual
    body: dict[str, object] = {
        "from": stamp(at),
        "to": stamp(at + timedelta(minutes=30)),
        "intensity": intensity,
    }
    if regional:
        body["generationmix"] = [{"fuel": "wind", "perc": 41.2}, {"fuel": "gas", "perc": 20.5}]
    return body


def half_hours(start: datetime, end: datetime) -> list[datetime]:
    slots = []
    at = start
    while at < end:
        slots.append(at)
        at += timedelta(minutes=30)
    return slots


def national_value(at: datetime) -> tuple[float | None, float | None]:
    """(forecast, actual) for a national half hour, with the documented irregularities."""
    if at.hour == 2:  # both halves of 02:00 unknown: the hour must be absent
        return None, None
    if at.hour == 4 and at.minute == 30:  # outturn not yet published: forecast only
        return 150.0, None
    return 100.0 + at.minute, 110.0 + at.minute  # :00 → 110, :30 → 140 actual


class FakeCarbonIntensity:
    def __init__(self) -> None:
        self.paths: list[str] = []
        self.rate_limited = False
        self.malformed_time = False  # one slot's "from" not in the documented format

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/intensity", self.current)
        app.router.add_get("/intensity/{start}/fw48h", self.national_forward)
        app.router.add_get("/intensity/{start}/{end}", self.national_range)
        app.router.add_get("/regional/regionid/{region}", self.regional_current)
        app.router.add_get(
            "/regional/intensity/{start}/fw48h/regionid/{region}", self.regional_forward
        )
        app.router.add_get(
            "/regional/intensity/{start}/{end}/regionid/{region}", self.regional_range
        )

        @web.middleware
        async def record(
            request: web.Request,
            handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
        ) -> web.StreamResponse:
            self.paths.append(request.path)
            if self.rate_limited:
                return web.json_response(
                    {"error": "slow"}, status=429, headers={"Retry-After": "5"}
                )
            response = await handler(request)
            if not self.malformed_time or not isinstance(response, web.Response):
                return response
            assert response.text is not None
            body = json.loads(response.text)
            slots = list(slots_in(body))
            slots[len(slots) // 2]["from"] = "half past ten"
            return web.json_response(body)

        app.middlewares.append(record)
        return app

    async def current(self, request: web.Request) -> web.Response:
        return web.json_response({"data": [slot(utc(2025, 5, 1, 10, 30), 120.0, None)]})

    async def national_range(self, request: web.Request) -> web.Response:
        start = datetime.fromisoformat(request.match_info["start"])
        end = datetime.fromisoformat(request.match_info["end"])
        data = [slot(at, *national_value(at)) for at in half_hours(start, end)]
        return web.json_response({"data": data})

    async def national_forward(self, request: web.Request) -> web.Response:
        start = datetime.fromisoformat(request.match_info["start"]).replace(minute=30)
        data = [
            slot(at, 200.0 + i, None)
            for i, at in enumerate(half_hours(start, start + timedelta(hours=48)))
        ]
        return web.json_response({"data": data})

    def region(self, request: web.Request, slots: list[dict[str, object]]) -> dict[str, object]:
        region = int(request.match_info["region"])
        return {
            "regionid": region,
            "dnoregion": "UKPN London",
            "shortname": "London",
            "data": slots,
        }

    async def regional_current(self, request: web.Request) -> web.Response:
        slots = [slot(utc(2025, 5, 1, 10, 30), 95.0, regional=True)]
        return web.json_response({"data": [self.region(request, slots)]})

    async def regional_range(self, request: web.Request) -> web.Response:
        start = datetime.fromisoformat(request.match_info["start"])
        end = datetime.fromisoformat(request.match_info["end"])
        slots = [
            slot(at, 80.0 if at.minute else 60.0, regional=True) for at in half_hours(start, end)
        ]
        return web.json_response({"data": self.region(request, slots)})

    async def regional_forward(self, request: web.Request) -> web.Response:
        start = datetime.fromisoformat(request.match_info["start"])
        slots = [
            slot(at, 90.0, regional=True) for at in half_hours(start, start + timedelta(hours=48))
        ]
        return web.json_response({"data": self.region(request, slots)})


def slots_in(body: object) -> Iterator[dict[str, object]]:
    """Every half-hour slot in a response, however deep the regional nesting puts it."""
    if isinstance(body, dict):
        if "from" in body:
            yield body
        for value in body.values():
            yield from slots_in(value)
    elif isinstance(body, list):
        for item in body:
            yield from slots_in(item)


@pytest.fixture
def fake() -> FakeCarbonIntensity:
    return FakeCarbonIntensity()


def provider(session: aiohttp.ClientSession, url: str) -> UkCarbonIntensityProvider:
    return UkCarbonIntensityProvider(session, base_url=url, clock=FakeClock(NOW.timestamp()))


async def test_national_history_averages_half_hours_to_hours(
    session: aiohttp.ClientSession, fake: FakeCarbonIntensity
) -> None:
    async with serve(fake.app()) as url:
        readings = await provider(session, url).history(
            "GB", utc(2025, 5, 1, 0), utc(2025, 5, 1, 6)
        )
    assert fake.paths == ["/intensity/2025-05-01T00:00Z/2025-05-01T06:00Z"]
    by_hour = {r.at.hour: r for r in readings}
    assert sorted(by_hour) == [0, 1, 3, 4, 5]  # 02:00 had no value at all: absent, not invented
    assert by_hour[0].carbon_g_per_kwh == pytest.approx((110 + 140) / 2)  # actuals, not forecasts
    assert not by_hour[0].estimated
    # 04:30 had only a forecast: the hour mixes outturn and forecast and says so.
    assert by_hour[4].carbon_g_per_kwh == pytest.approx((110 + 150) / 2)
    assert by_hour[4].estimated
    assert all(r.signal_type == "average" and r.zone == "GB" for r in readings)


async def test_long_ranges_are_split_into_14_day_requests(
    session: aiohttp.ClientSession, fake: FakeCarbonIntensity
) -> None:
    async with serve(fake.app()) as url:
        readings = await provider(session, url).history("GB", utc(2025, 4, 1), utc(2025, 4, 20))
    assert fake.paths == [
        "/intensity/2025-04-01T00:00Z/2025-04-15T00:00Z",
        "/intensity/2025-04-15T00:00Z/2025-04-20T00:00Z",
    ]
    assert len(readings) == 19 * 23


async def test_regional_history_is_forecast_only_and_flagged_estimated(
    session: aiohttp.ClientSession, fake: FakeCarbonIntensity
) -> None:
    async with serve(fake.app()) as url:
        readings = await provider(session, url).history(
            "GB-LONDON", utc(2025, 5, 1, 0), utc(2025, 5, 1, 2)
        )
    assert fake.paths == ["/regional/intensity/2025-05-01T00:00Z/2025-05-01T02:00Z/regionid/13"]
    assert [r.carbon_g_per_kwh for r in readings] == [70.0, 70.0]
    assert all(r.estimated for r in readings)


async def test_latest_national_and_regional(
    session: aiohttp.ClientSession, fake: FakeCarbonIntensity
) -> None:
    async with serve(fake.app()) as url:
        national = await provider(session, url).latest("GB")
        regional = await provider(session, url).latest("GB-13")
    assert (national.at, national.carbon_g_per_kwh, national.estimated) == (
        utc(2025, 5, 1, 10, 30),
        120.0,
        True,
    )
    assert regional.carbon_g_per_kwh == 95.0
    assert fake.paths == ["/intensity", "/regional/regionid/13"]


async def test_forecasts_come_from_the_48_hour_endpoints(
    session: aiohttp.ClientSession, fake: FakeCarbonIntensity
) -> None:
    async with serve(fake.app()) as url:
        national = await provider(session, url).forecast("GB", utc(2025, 5, 1, 11), utc(2025, 5, 2))
        regional = await provider(session, url).forecast(
            "GB-2", utc(2025, 5, 1, 11), utc(2025, 5, 1, 13)
        )
    assert fake.paths == [
        "/intensity/2025-05-01T11:00Z/fw48h",
        "/regional/intensity/2025-05-01T11:00Z/fw48h/regionid/2",
    ]
    assert national is not None
    assert regional is not None
    assert national.points[0].at == utc(2025, 5, 1, 11)
    assert national.points[0].carbon_g_per_kwh == 200.0  # only the 11:30 slot falls in 11:00
    assert national.points[1].carbon_g_per_kwh == pytest.approx(201.5)
    assert [p.carbon_g_per_kwh for p in regional.points] == [90.0, 90.0]


async def test_unknown_zones_and_rate_limits(
    session: aiohttp.ClientSession, fake: FakeCarbonIntensity
) -> None:
    assert region_id("GB") is None
    assert region_id("GB-17") == 17
    with pytest.raises(SignalUnavailable, match="unknown zone 'GB-18'"):
        region_id("GB-18")
    with pytest.raises(SignalUnavailable):
        region_id("FR")
    fake.rate_limited = True
    async with serve(fake.app()) as url:
        with pytest.raises(SignalRateLimited) as limited:
            await provider(session, url).latest("GB")
    assert limited.value.retry_after_s == 5.0


ASK: dict[str, Callable[[UkCarbonIntensityProvider, str], Awaitable[object]]] = {
    "latest": lambda uk, zone: uk.latest(zone),
    "history": lambda uk, zone: uk.history(zone, utc(2025, 5, 1, 0), utc(2025, 5, 1, 6)),
    "forecast": lambda uk, zone: uk.forecast(zone, utc(2025, 5, 1, 11), utc(2025, 5, 2)),
}


@pytest.mark.parametrize(
    ("zone", "ask"),
    [
        ("GB", "latest"),
        ("GB-13", "latest"),
        ("GB", "history"),
        ("GB-13", "history"),
        ("GB", "forecast"),
        ("GB-2", "forecast"),
    ],
)
async def test_a_time_not_in_the_documented_format_is_unavailable(
    session: aiohttp.ClientSession, fake: FakeCarbonIntensity, zone: str, ask: str
) -> None:
    fake.malformed_time = True
    async with serve(fake.app()) as url:
        with pytest.raises(SignalUnavailable, match="unexpected format"):
            await ASK[ask](provider(session, url), zone)
