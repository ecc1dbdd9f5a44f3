"""Carbon Aware SDK Web API client against a local server with its documented format."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

import aiohttp
import pytest
from aiohttp import web

from cloud.signals.carbonaware import CarbonAwareSdkProvider
from cloud.signals.model import SignalUnavailable

from .support import FakeClock, serve, utc

NOW = utc(2025, 5, 1, 10, 12)


def stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%S+00:00")


class FakeCarbonAwareSdk:
    def __init__(self) -> None:
        self.queries: list[tuple[str, dict[str, str]]] = []
        self.delay_s = 0.0
        # Where one time is not in the documented format: "time" (an emissions row),
        # "timestamp" (a forecast point) or "generatedAt" (the forecast's).
        self.malformed_time_in: set[str] = set()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/emissions/bylocation", self.by_location)
        app.router.add_get("/emissions/forecasts/current", self.forecast)
        return app

    def _problem(self, location: str) -> web.Response:
        return web.json_response(
            {
                "type": "https://tools.ietf.org/html/rfc7231#section-6.5.1",
                "title": "Bad Request",
                "status": 400,
                "errors": {"location": [f"Unknown location: '{location}'"]},
            },
            status=400,
        )

    async def by_location(self, request: web.Request) -> web.Response:
        self.queries.append(("bylocation", dict(request.query)))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        location = request.query["location"]
        if location == "quiet":
            return web.Response(status=204)
        if location != "westeurope":
            return self._problem(location)
        start = datetime.fromisoformat(request.query["time"])
        end = datetime.fromisoformat(request.query["toTime"])
        rows = []
        at = start
        index = 0
        while at < end:
            rating = None if index == 1 else 300.0 + index
            rows.append(
                {
                    "location": "westeurope",
                    "time": stamp(at),
                    "rating": rating,
                    "duration": "00:30:00",
                }
            )
            at += timedelta(minutes=30)
            index += 1
        if "time" in self.malformed_time_in:
            rows[len(rows) // 2]["time"] = "10:30 yesterday"
        return web.json_response(rows)

    async def forecast(self, request: web.Request) -> web.Response:
        self.queries.append(("forecast", dict(request.query)))
        location = request.query["location"]
        if location == "static-source":
            return web.json_response(
                {
                    "title": "Not Implemented",
                    "status": 501,
                    "detail": "data source does not support forecasting",
                },
                status=501,
            )
        if location != "westeurope":
            return self._problem(location)
        start = datetime.fromisoformat(request.query["dataStartAt"])
        points = [
            {
                "location": "NL",
                "timestamp": stamp(start + timedelta(minutes=5 * i)),
                "duration": 5,
                "value": 400.0 + (i // 12),
            }
            for i in range(36)
        ]
        if "timestamp" in self.malformed_time_in:
            points[len(points) // 2]["timestamp"] = "10:30 tomorrow"
        generated_at = stamp(utc(2025, 5, 1, 10, 5))
        if "generatedAt" in self.malformed_time_in:
            generated_at = "just now"
        return web.json_response(
            [
                {
                    "requestedAt": stamp(NOW),
                    "generatedAt": generated_at,
                    "location": location,
                    "dataStartAt": request.query["dataStartAt"],
                    "dataEndAt": request.query["dataEndAt"],
                    "windowSize": 5,
                    "optimalDataPoints": [points[0]],
                    "forecastData": points,
                }
            ]
        )


@pytest.fixture
def fake() -> FakeCarbonAwareSdk:
    return FakeCarbonAwareSdk()


def provider(
    session: aiohttp.ClientSession, url: str, timeout_s: float = 2.0
) -> CarbonAwareSdkProvider:
    return CarbonAwareSdkProvider(
        session,
        base_url=url,
        timeout_s=timeout_s,
        locations={"NL": "westeurope"},
        signal_type="average",
        clock=FakeClock(NOW.timestamp()),
    )


async def test_emissions_by_location_become_hourly_readings(
    session: aiohttp.ClientSession, fake: FakeCarbonAwareSdk
) -> None:
    async with serve(fake.app()) as url:
        readings = await provider(session, url).history(
            "NL", utc(2025, 5, 1, 6), utc(2025, 5, 1, 8)
        )
    assert fake.queries == [
        (
            "bylocation",
            {
                "location": "westeurope",
                "time": "2025-05-01T06:00:00Z",
                "toTime": "2025-05-01T08:00:00Z",
            },
        )
    ]
    # 06:00 → 300, 06:30 → null (skipped); 07:00 → 302, 07:30 → 303.
    assert [(r.at, r.carbon_g_per_kwh) for r in readings] == [
        (utc(2025, 5, 1, 6), 300.0),
        (utc(2025, 5, 1, 7), 302.5),
    ]
    assert all(r.signal_type == "average" for r in readings)


async def test_latest_is_the_newest_rating_of_the_last_two_hours(
    session: aiohttp.ClientSession, fake: FakeCarbonAwareSdk
) -> None:
    async with serve(fake.app()) as url:
        reading = await provider(session, url).latest("NL")
    assert reading.at == utc(2025, 5, 1, 9, 42)
    assert reading.carbon_g_per_kwh == 303.0


async def test_no_content_is_unavailable(
    session: aiohttp.ClientSession, fake: FakeCarbonAwareSdk
) -> None:
    async with serve(fake.app()) as url:
        with pytest.raises(SignalUnavailable, match="no recent emissions data"):
            await provider(session, url).latest("quiet")
        assert await provider(session, url).history("quiet", utc(2025, 5, 1), NOW) == []


async def test_the_current_forecast_is_averaged_to_hours(
    session: aiohttp.ClientSession, fake: FakeCarbonAwareSdk
) -> None:
    async with serve(fake.app()) as url:
        forecast = await provider(session, url).forecast(
            "NL", utc(2025, 5, 1, 11), utc(2025, 5, 1, 14)
        )
    assert forecast is not None
    assert [(p.at, p.carbon_g_per_kwh) for p in forecast.points] == [
        (utc(2025, 5, 1, 11), 400.0),
        (utc(2025, 5, 1, 12), 401.0),
        (utc(2025, 5, 1, 13), 402.0),
    ]
    assert forecast.issued_at == utc(2025, 5, 1, 10, 5)
    assert fake.queries[-1][1]["dataEndAt"] == "2025-05-01T14:00:00Z"


async def test_a_data_source_without_forecasts_gives_none(
    session: aiohttp.ClientSession, fake: FakeCarbonAwareSdk
) -> None:
    async with serve(fake.app()) as url:
        assert await provider(session, url).forecast("static-source", NOW, NOW) is None


async def test_an_unknown_location_and_a_slow_server_are_unavailable(
    session: aiohttp.ClientSession, fake: FakeCarbonAwareSdk
) -> None:
    async with serve(fake.app()) as url:
        with pytest.raises(SignalUnavailable, match="HTTP 400"):
            await provider(session, url).forecast("mars", NOW, NOW)
        fake.delay_s = 1.0
        with pytest.raises(SignalUnavailable, match="timed out"):
            await provider(session, url, timeout_s=0.1).latest("NL")


ASK: dict[str, Callable[[CarbonAwareSdkProvider], Awaitable[object]]] = {
    "latest": lambda sdk: sdk.latest("NL"),
    "history": lambda sdk: sdk.history("NL", utc(2025, 5, 1, 0), utc(2025, 5, 1, 6)),
    "forecast": lambda sdk: sdk.forecast("NL", utc(2025, 5, 1, 11), utc(2025, 5, 1, 14)),
}


@pytest.mark.parametrize(
    ("where", "ask"),
    [
        ("time", "latest"),
        ("time", "history"),
        ("timestamp", "forecast"),
        ("generatedAt", "forecast"),
    ],
)
async def test_a_time_not_in_the_documented_format_is_unavailable(
    session: aiohttp.ClientSession, fake: FakeCarbonAwareSdk, where: str, ask: str
) -> None:
    fake.malformed_time_in = {where}
    async with serve(fake.app()) as url:
        with pytest.raises(SignalUnavailable, match="unexpected format"):
            await ASK[ask](provider(session, url))
