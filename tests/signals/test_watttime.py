"""WattTime v3 client: login token with expiry, re-login, co2_moer in lbs/MWh → g/kWh."""

from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

import aiohttp
import pytest
from aiohttp import web

from cloud.signals.model import SignalAuthError, SignalRateLimited, SignalUnavailable
from cloud.signals.watttime import WattTimeProvider, jwt_expiry_s

from .support import FakeClock, serve, utc

USER, PASSWORD = "greenfed", "hunter2"
NOW = utc(2025, 5, 1, 10, 2)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def jwt(claims: dict[str, object]) -> str:
    def part(data: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")

    return f"{part({'alg': 'HS256', 'typ': 'JWT'})}.{part(claims)}.c2lnbmF0dXJl"


def iso(at: datetime) -> str:
    return at.isoformat()  # WattTime writes "+00:00" offsets


def meta(units: str = "lbs_co2_per_mwh") -> dict[str, object]:
    return {
        "region": "CAISO_NORTH",
        "signal_type": "co2_moer",
        "units": units,
        "data_point_period_seconds": 300,
        "generated_at_period_seconds": 300,
        "generated_at": iso(utc(2025, 5, 1, 10)),
        "model": {"date": "2023-03-01", "type": "binned_regression"},
        "warnings": [],
    }


class FakeWattTime:
    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.valid_tokens: set[str] = set()
        self.logins = 0
        self.issue_jwt_lifetime_s: float | None = None
        self.queries: list[tuple[str, dict[str, str]]] = []
        self.units = "lbs_co2_per_mwh"
        self.rate_limited = False
        # Where one time is not in the documented format: "forecast", "historical"
        # (a point's point_time) or "generated_at" (the meta's).
        self.malformed_time_in: set[str] = set()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/login", self.login)
        app.router.add_get("/v3/forecast", self.guarded("forecast", self.forecast))
        app.router.add_get("/v3/historical", self.guarded("historical", self.historical))
        app.router.add_get("/v3/signal-index", self.guarded("signal-index", self.signal_index))
        return app

    async def login(self, request: web.Request) -> web.Response:
        expected = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        if request.headers.get("Authorization") != expected:
            return web.json_response({"error": "invalid credentials"}, status=403)
        self.logins += 1
        token = f"token-{self.logins}"
        if self.issue_jwt_lifetime_s is not None:
            token = jwt({"sub": USER, "exp": int(self.clock() + self.issue_jwt_lifetime_s)})
        self.valid_tokens.add(token)
        return web.json_response({"token": token})

    def guarded(self, name: str, handler: Handler) -> Handler:
        async def handle(request: web.Request) -> web.StreamResponse:
            self.queries.append((name, dict(request.query)))
            token = request.headers.get("Authorization", "").removeprefix("Bearer ")
            if token not in self.valid_tokens:
                return web.json_response({"error": "token expired"}, status=401)
            if self.rate_limited:
                return web.json_response(
                    {"error": "rate"}, status=429, headers={"Retry-After": "42"}
                )
            if request.query.get("signal_type") != "co2_moer":
                return web.json_response({"error": "signal_type"}, status=400)
            return await handler(request)

        return handle

    async def forecast(self, request: web.Request) -> web.Response:
        horizon = int(request.query["horizon_hours"])
        start = utc(2025, 5, 1, 10)
        count = max(1, horizon * 12)
        data = [
            {"point_time": iso(start + timedelta(minutes=5 * i)), "value": 1000.0 + i}
            for i in range(count)
        ]
        return self.answer("forecast", data)

    def answer(self, endpoint: str, data: list[dict[str, object]]) -> web.Response:
        about = meta(self.units)
        if endpoint in self.malformed_time_in:
            data[len(data) // 2]["point_time"] = "2025-05-01T10:30:00+00:00junk"
        if "generated_at" in self.malformed_time_in:
            about["generated_at"] = "yesterday"
        return web.json_response({"data": data, "meta": about})

    async def historical(self, request: web.Request) -> web.Response:
        start = datetime.fromisoformat(request.query["start"])
        end = datetime.fromisoformat(request.query["end"])
        data: list[dict[str, object]] = []
        at = start
        while at < end:
            # 5-minute points; every point at minute 5 is null, hour 03:00 entirely missing.
            if at.hour != 3:
                data.append({"point_time": iso(at), "value": None if at.minute == 5 else 800.0})
            at += timedelta(minutes=5)
        return self.answer("historical", data)

    async def signal_index(self, request: web.Request) -> web.Response:
        data = [{"point_time": iso(utc(2025, 5, 1, 10)), "value": 73.0}]
        return web.json_response({"data": data, "meta": meta("percentile")})


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(NOW.timestamp())


@pytest.fixture
def fake(clock: FakeClock) -> FakeWattTime:
    return FakeWattTime(clock)


def provider(
    session: aiohttp.ClientSession, url: str, clock: FakeClock, password: str = PASSWORD
) -> WattTimeProvider:
    return WattTimeProvider(session, username=USER, password=password, base_url=url, clock=clock)


async def test_latest_is_the_current_moer_in_grams_per_kwh(
    session: aiohttp.ClientSession, fake: FakeWattTime, clock: FakeClock
) -> None:
    async with serve(fake.app()) as url:
        reading = await provider(session, url, clock).latest("US-CAL-CISO")
    assert reading.carbon_g_per_kwh == pytest.approx(1000.0 * 0.453592)
    assert reading.signal_type == "marginal"
    assert reading.at == utc(2025, 5, 1, 10)
    assert fake.queries == [
        ("forecast", {"region": "CAISO_NORTH", "signal_type": "co2_moer", "horizon_hours": "0"})
    ]


async def test_the_token_is_reused_until_it_expires_then_renewed(
    session: aiohttp.ClientSession, fake: FakeWattTime, clock: FakeClock
) -> None:
    async with serve(fake.app()) as url:
        client = provider(session, url, clock)
        await client.latest("CAISO_NORTH")
        clock.advance(20 * 60)
        await client.latest("CAISO_NORTH")
        assert (client.logins, fake.logins) == (1, 1)
        clock.advance(10 * 60)  # 30 minutes after login: the token is about to expire
        await client.latest("CAISO_NORTH")
        assert (client.logins, fake.logins) == (2, 2)


async def test_a_jwt_expiry_claim_is_honoured(
    session: aiohttp.ClientSession, fake: FakeWattTime, clock: FakeClock
) -> None:
    fake.issue_jwt_lifetime_s = 300
    async with serve(fake.app()) as url:
        client = provider(session, url, clock)
        await client.latest("CAISO_NORTH")
        clock.advance(200)
        await client.latest("CAISO_NORTH")
        assert client.logins == 1
        clock.advance(60)  # within a minute of exp: renew before it is refused
        await client.latest("CAISO_NORTH")
        assert client.logins == 2


async def test_a_401_on_data_logs_in_again_once(
    session: aiohttp.ClientSession, fake: FakeWattTime, clock: FakeClock
) -> None:
    async with serve(fake.app()) as url:
        client = provider(session, url, clock)
        await client.latest("CAISO_NORTH")
        fake.valid_tokens.clear()  # revoked server-side, long before its expiry
        reading = await client.latest("CAISO_NORTH")
        assert reading.carbon_g_per_kwh > 0
        assert client.logins == 2
        assert [name for name, _ in fake.queries] == ["forecast", "forecast", "forecast"]


async def test_wrong_credentials_are_an_auth_error(
    session: aiohttp.ClientSession, fake: FakeWattTime, clock: FakeClock
) -> None:
    async with serve(fake.app()) as url:
        with pytest.raises(SignalAuthError, match="login answered HTTP 403"):
            await provider(session, url, clock, password="wrong").latest("CAISO_NORTH")


async def test_history_is_hourly_means_without_nulls_or_invented_hours(
    session: aiohttp.ClientSession, fake: FakeWattTime, clock: FakeClock
) -> None:
    async with serve(fake.app()) as url:
        readings = await provider(session, url, clock).history(
            "CAISO_NORTH", utc(2025, 5, 1, 1), utc(2025, 5, 1, 6)
        )
    assert [r.at for r in readings] == [utc(2025, 5, 1, h) for h in (1, 2, 4, 5)]
    assert all(r.carbon_g_per_kwh == pytest.approx(800 * 0.453592) for r in readings)
    assert all(r.signal_type == "marginal" for r in readings)


async def test_long_history_is_fetched_in_chunks_within_the_32_day_limit(
    session: aiohttp.ClientSession, fake: FakeWattTime, clock: FakeClock
) -> None:
    async with serve(fake.app()) as url:
        readings = await provider(session, url, clock).history(
            "CAISO_NORTH", utc(2025, 3, 1), utc(2025, 4, 10)
        )
    chunks = [query for name, query in fake.queries if name == "historical"]
    assert [(q["start"], q["end"]) for q in chunks] == [
        ("2025-03-01T00:00:00+00:00", "2025-03-31T00:00:00+00:00"),
        ("2025-03-31T00:00:00+00:00", "2025-04-10T00:00:00+00:00"),
    ]
    assert len(readings) == 40 * 23  # every hour but 03:00


async def test_the_forecast_is_averaged_to_hours(
    session: aiohttp.ClientSession, fake: FakeWattTime, clock: FakeClock
) -> None:
    async with serve(fake.app()) as url:
        forecast = await provider(session, url, clock).forecast(
            "CAISO_NORTH", utc(2025, 5, 1, 11), utc(2025, 5, 1, 14)
        )
    assert forecast is not None
    assert fake.queries[-1][1]["horizon_hours"] == "4"
    assert [p.at for p in forecast.points] == [utc(2025, 5, 1, h) for h in (11, 12, 13)]
    # Hour 11:00 holds points 12..23 (values 1012..1023): mean 1017.5 lbs/MWh.
    assert forecast.points[0].carbon_g_per_kwh == pytest.approx(1017.5 * 0.453592)
    assert forecast.signal_type == "marginal"
    assert forecast.issued_at == utc(2025, 5, 1, 10)


async def test_the_signal_index_is_a_percentile(
    session: aiohttp.ClientSession, fake: FakeWattTime, clock: FakeClock
) -> None:
    async with serve(fake.app()) as url:
        assert await provider(session, url, clock).signal_index("CAISO_NORTH") == 73.0
    assert fake.queries[-1] == (
        "signal-index",
        {"region": "CAISO_NORTH", "signal_type": "co2_moer"},
    )


async def test_unknown_units_are_refused_rather_than_misread(
    session: aiohttp.ClientSession, fake: FakeWattTime, clock: FakeClock
) -> None:
    fake.units = "percentile"
    async with serve(fake.app()) as url:
        with pytest.raises(SignalUnavailable, match="unknown units 'percentile'"):
            await provider(session, url, clock).latest("CAISO_NORTH")


async def test_rate_limiting_reports_retry_after(
    session: aiohttp.ClientSession, fake: FakeWattTime, clock: FakeClock
) -> None:
    fake.rate_limited = True
    async with serve(fake.app()) as url:
        with pytest.raises(SignalRateLimited) as limited:
            await provider(session, url, clock).latest("CAISO_NORTH")
    assert limited.value.retry_after_s == 42.0


@pytest.mark.parametrize("where", ["forecast", "historical", "generated_at"])
async def test_a_time_not_in_the_documented_format_is_unavailable(
    session: aiohttp.ClientSession, fake: FakeWattTime, clock: FakeClock, where: str
) -> None:
    fake.malformed_time_in = {where}
    async with serve(fake.app()) as url:
        watttime = provider(session, url, clock)
        asked = (
            watttime.history("CAISO_NORTH", utc(2025, 5, 1, 8), utc(2025, 5, 1, 11))
            if where == "historical"
            else watttime.forecast("CAISO_NORTH", utc(2025, 5, 1, 11), utc(2025, 5, 1, 14))
        )
        with pytest.raises(SignalUnavailable, match="unexpected format"):
            await asked


def test_jwt_expiry_is_read_from_the_claims() -> None:
    assert jwt_expiry_s(jwt({"exp": 1746093600})) == 1746093600.0
    assert jwt_expiry_s("not-a-jwt") is None
    assert jwt_expiry_s("a.!!!.c") is None
