"""Electricity Maps v3 client against a local server speaking the documented format."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

import aiohttp
import pytest
from aiohttp import web

from cloud.signals.datasets import EmissionFactor
from cloud.signals.electricitymaps import ElectricityMapsProvider
from cloud.signals.model import SignalAuthError, SignalRateLimited, SignalUnavailable
from cloud.signals.service import SignalService

from .support import FakeClock, serve, utc

TOKEN = "em-secret"
NOW = utc(2025, 5, 1, 10, 20)


def point(at: datetime, value: float | None, estimated: bool = False) -> dict[str, object]:
    return {
        "zone": "DE",
        "carbonIntensity": value,
        "datetime": at.strftime("%Y-%m-%dT%H:%M:%S.000Z"),
        "updatedAt": "2025-05-01T10:05:12.123Z",
        "createdAt": "2025-04-28T10:03:00.000Z",
        "emissionFactorType": "lifecycle",
        "isEstimated": estimated,
        "estimationMethod": "TIME_SLICER_AVERAGE" if estimated else None,
    }


class FakeElectricityMaps:
    def __init__(self) -> None:
        self.queries: list[tuple[str, dict[str, str]]] = []
        self.past_range_forbidden = False
        self.status_override: tuple[int, dict[str, str]] | None = None
        self.delay_s = 0.0
        # Endpoints whose body carries one time not in the documented format.
        self.malformed_time_in: set[str] = set()

    def app(self) -> web.Application:
        app = web.Application()
        for name in ("latest", "history", "past-range", "forecast"):
            app.router.add_get(f"/v3/carbon-intensity/{name}", self.handler(name))
        return app

    def handler(self, name: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handle(request: web.Request) -> web.StreamResponse:
            response = await answer(request)
            if name not in self.malformed_time_in or not isinstance(response, web.Response):
                return response
            assert response.text is not None
            body = json.loads(response.text)
            points = body.get("history") or body.get("data") or body.get("forecast") or [body]
            points[len(points) // 2]["datetime"] = "2025-05-01T18:00:00.000Zjunk"
            return web.json_response(body, status=response.status)

        async def answer(request: web.Request) -> web.StreamResponse:
            self.queries.append((name, dict(request.query)))
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            if request.headers.get("auth-token") != TOKEN:
                return web.json_response({"status": "error", "message": "Unauthorized"}, status=401)
            if self.status_override:
                status, headers = self.status_override
                return web.json_response({"message": "slow down"}, status=status, headers=headers)
            zone = request.query.get("zone")
            if zone == "PL" and name == "latest":  # known zone, no value right now
                return web.json_response(point(utc(2025, 5, 1, 10), None) | {"zone": "PL"})
            if zone != "DE":
                return web.json_response(
                    {"status": "error", "message": f"Zone '{zone}' does not exist."}, status=404
                )
            if name == "latest":
                return web.json_response(point(utc(2025, 5, 1, 10), 302.0))
            if name == "history":
                hours = [utc(2025, 4, 30, 11) + timedelta(hours=h) for h in range(24)]
                values: list[float | None] = [300.0 + h for h in range(24)]
                values[5] = None  # a null in the middle of history
                return web.json_response(
                    {
                        "zone": "DE",
                        "history": [
                            point(a, v, h == 23)
                            for h, (a, v) in enumerate(zip(hours, values, strict=True))
                        ],
                    }
                )
            if name == "past-range":
                if self.past_range_forbidden:
                    return web.json_response({"message": "not in your plan"}, status=403)
                start = datetime.fromisoformat(request.query["start"])
                end = datetime.fromisoformat(request.query["end"])
                data = []
                at = start
                while at < end:
                    data.append(point(at, 200.0))
                    at += timedelta(hours=1)
                return web.json_response({"zone": "DE", "data": data})
            forecast = [
                {
                    "carbonIntensity": 250 + h,
                    "datetime": (utc(2025, 5, 1, 11) + timedelta(hours=h)).strftime(
                        "%Y-%m-%dT%H:%M:%S.000Z"
                    ),
                }
                for h in range(int(request.query.get("horizonHours", "24")))
            ]
            return web.json_response(
                {"zone": "DE", "forecast": forecast, "updatedAt": "2025-05-01T10:00:00.000Z"}
            )

        return handle


@pytest.fixture
def fake() -> FakeElectricityMaps:
    return FakeElectricityMaps()


def provider(
    session: aiohttp.ClientSession,
    url: str,
    token: str = TOKEN,
    emission_factor: EmissionFactor = "lifecycle",
    timeout_s: float = 2.0,
) -> ElectricityMapsProvider:
    return ElectricityMapsProvider(
        session,
        token=token,
        base_url=url + "/v3",
        clock=FakeClock(NOW.timestamp()),
        emission_factor=emission_factor,
        timeout_s=timeout_s,
    )


async def test_latest_sends_the_token_and_emission_factor(
    session: aiohttp.ClientSession, fake: FakeElectricityMaps
) -> None:
    async with serve(fake.app()) as url:
        reading = await provider(session, url, emission_factor="direct").latest("DE")
    assert (reading.zone, reading.at, reading.carbon_g_per_kwh) == (
        "DE",
        utc(2025, 5, 1, 10),
        302.0,
    )
    assert reading.signal_type == "average"
    assert reading.price_per_mwh is None
    assert fake.queries == [("latest", {"zone": "DE", "emissionFactorType": "direct"})]


async def test_history_skips_nulls_and_keeps_the_window(
    session: aiohttp.ClientSession, fake: FakeElectricityMaps
) -> None:
    async with serve(fake.app()) as url:
        readings = await provider(session, url).history(
            "DE", utc(2025, 5, 1, 0), utc(2025, 5, 1, 11)
        )
    hours = [r.at for r in readings]
    assert hours[0] == utc(2025, 5, 1, 0)
    assert hours[-1] == utc(2025, 5, 1, 10)
    assert utc(2025, 4, 30, 16) not in hours  # the null hour, outside anyway
    assert len(readings) == 11
    assert readings[-1].estimated
    assert not readings[0].estimated
    async with serve(fake.app()) as url:
        full = await provider(session, url).history("DE", utc(2025, 4, 30, 11), utc(2025, 5, 1, 11))
    assert len(full) == 23  # 24 hours, one of them null: skipped, not invented
    assert utc(2025, 4, 30, 16) not in [r.at for r in full]


async def test_older_windows_use_past_range_in_ten_day_pages(
    session: aiohttp.ClientSession, fake: FakeElectricityMaps
) -> None:
    async with serve(fake.app()) as url:
        readings = await provider(session, url).history("DE", utc(2025, 4, 10), utc(2025, 4, 25))
    assert len(readings) == 15 * 24
    pages = [query for name, query in fake.queries if name == "past-range"]
    assert [(q["start"], q["end"]) for q in pages] == [
        ("2025-04-10T00:00:00Z", "2025-04-20T00:00:00Z"),
        ("2025-04-20T00:00:00Z", "2025-04-25T00:00:00Z"),
    ]


async def test_without_past_range_in_the_plan_the_last_24_hours_are_used(
    session: aiohttp.ClientSession, fake: FakeElectricityMaps
) -> None:
    fake.past_range_forbidden = True
    async with serve(fake.app()) as url:
        readings = await provider(session, url).history("DE", utc(2025, 4, 24), utc(2025, 5, 1, 11))
    assert len(readings) == 23
    assert [name for name, _ in fake.queries] == ["past-range", "history"]


async def test_forecast_asks_for_the_horizon_it_needs(
    session: aiohttp.ClientSession, fake: FakeElectricityMaps
) -> None:
    async with serve(fake.app()) as url:
        forecast = await provider(session, url).forecast("DE", utc(2025, 5, 1, 11), utc(2025, 5, 3))
    assert forecast is not None
    assert fake.queries[-1][1]["horizonHours"] == "38"
    assert forecast.points[0].at == utc(2025, 5, 1, 11)
    assert forecast.points[0].carbon_g_per_kwh == 250.0
    assert len(forecast.points) == 37  # 11:00 on the 1st up to, not including, the 3rd
    assert forecast.issued_at == utc(2025, 5, 1, 10)
    assert forecast.signal_type == "average"


async def test_a_wrong_token_is_an_auth_error(
    session: aiohttp.ClientSession, fake: FakeElectricityMaps
) -> None:
    async with serve(fake.app()) as url:
        with pytest.raises(SignalAuthError, match="HTTP 401"):
            await provider(session, url, token="wrong").latest("DE")


async def test_an_unknown_zone_is_unavailable(
    session: aiohttp.ClientSession, fake: FakeElectricityMaps
) -> None:
    async with serve(fake.app()) as url:
        with pytest.raises(SignalUnavailable, match="does not exist"):
            await provider(session, url).latest("XX")


async def test_a_null_current_value_is_unavailable_not_zero(
    session: aiohttp.ClientSession, fake: FakeElectricityMaps
) -> None:
    async with serve(fake.app()) as url:
        with pytest.raises(SignalUnavailable, match="no current carbon intensity for PL"):
            await provider(session, url).latest("PL")


async def test_rate_limiting_reports_retry_after(
    session: aiohttp.ClientSession, fake: FakeElectricityMaps
) -> None:
    fake.status_override = (429, {"Retry-After": "17"})
    async with serve(fake.app()) as url:
        with pytest.raises(SignalRateLimited) as limited:
            await provider(session, url).history("DE", utc(2025, 5, 1), utc(2025, 5, 1, 10))
    assert limited.value.retry_after_s == 17.0


async def test_a_slow_server_times_out(
    session: aiohttp.ClientSession, fake: FakeElectricityMaps
) -> None:
    fake.delay_s = 1.0
    async with serve(fake.app()) as url:
        with pytest.raises(SignalUnavailable, match="timed out"):
            await provider(session, url, timeout_s=0.1).latest("DE")


@pytest.mark.parametrize(
    ("endpoint", "ask"),
    [
        ("latest", lambda em: em.latest("DE")),
        ("history", lambda em: em.history("DE", utc(2025, 5, 1), utc(2025, 5, 1, 11))),
        ("past-range", lambda em: em.history("DE", utc(2025, 4, 20), utc(2025, 4, 25))),
        ("forecast", lambda em: em.forecast("DE", utc(2025, 5, 1, 11), utc(2025, 5, 3))),
    ],
)
async def test_a_time_not_in_the_documented_format_is_unavailable(
    session: aiohttp.ClientSession,
    fake: FakeElectricityMaps,
    endpoint: str,
    ask: Callable[[ElectricityMapsProvider], Awaitable[object]],
) -> None:
    fake.malformed_time_in = {endpoint}
    async with serve(fake.app()) as url:
        with pytest.raises(SignalUnavailable, match="unexpected format"):
            await ask(provider(session, url))


async def test_a_malformed_forecast_keeps_the_zones_live_history(
    session: aiohttp.ClientSession, fake: FakeElectricityMaps
) -> None:
    fake.malformed_time_in = {"forecast"}
    clock = FakeClock(NOW.timestamp())
    async with serve(fake.app()) as url:
        em = provider(session, url)
        signals = SignalService(
            [em], clock=clock, history_hours=3, horizon_hours=2, forecaster="persistence"
        )
        series = (await signals.snapshot(["DE"])).zones["DE"]
    assert (series.source, series.stale) == ("electricitymaps", False)
    assert series.carbon_at(NOW.timestamp()) == 323.0  # the recorded 10:00 value
    assert series.carbon_at(NOW.timestamp() + 3600) == 323.0  # ours, not the provider's
