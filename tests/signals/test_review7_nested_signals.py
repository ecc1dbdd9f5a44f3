"""A carbon or price provider's answer nested too deeply to read (msgspec and the JSON
module raise RecursionError there, not their decode errors) is an answer in an
unexpected format: `SignalUnavailable`, which the signal service reports as the
provider failing, never as a crash with a traceback (cloud/signals/http_client.py).
A login token whose claims are nested so is a token without a readable expiry
(cloud/signals/watttime.py), as any other token that is not a readable JWT."""

from __future__ import annotations

import base64

import aiohttp
import msgspec
import pytest
from aiohttp import web

from cloud.signals.http_client import HttpSource
from cloud.signals.model import SignalUnavailable
from cloud.signals.watttime import TOKEN_LIFETIME_S, WattTimeProvider

from .support import FakeClock, serve, utc

pytestmark = pytest.mark.timeout(30)

# Far deeper than any recursion guard (Python's default limit is 1,000 frames).
NESTING = 10_000
NESTED = b"[" * NESTING + b"]" * NESTING
NOW = utc(2025, 5, 1, 10, 2)


class Reading(msgspec.Struct, frozen=True):
    value: float | None


def answering(body: bytes) -> web.Application:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_get("/v1/reading", handler)
    return app


async def test_an_answer_nested_too_deeply_is_signal_unavailable(
    session: aiohttp.ClientSession,
) -> None:
    # In a field the provider's struct does not have: skipped, yet walked all the same.
    body = b'{"extra":' + NESTED + b',"value":1.5}'
    async with serve(answering(body)) as url:
        source = HttpSource(session, provider="test", base_url=url, timeout_s=5.0)
        with pytest.raises(SignalUnavailable, match="reading answered in an unexpected format"):
            await source.get("v1/reading", msgspec.json.Decoder(Reading))


def nested_claims_token() -> str:
    """A JWT whose claims are nested too deeply, short enough for an HTTP header."""
    depth = 2_000
    claims = base64.urlsafe_b64encode(b"[" * depth + b"]" * depth).decode().rstrip("=")
    return f"eyJhbGciOiJIUzI1NiJ9.{claims}.c2lnbmF0dXJl"


async def test_a_login_token_with_claims_nested_too_deeply_is_used_for_the_default_lifetime(
    session: aiohttp.ClientSession,
) -> None:
    token = nested_claims_token()
    point = {"point_time": NOW.replace(minute=0).isoformat(), "value": 1000.0}
    meta = {
        "region": "CAISO_NORTH",
        "signal_type": "co2_moer",
        "units": "lbs_co2_per_mwh",
        "data_point_period_seconds": 300,
        "generated_at": NOW.replace(minute=0).isoformat(),
    }
    logins = 0

    async def login(request: web.Request) -> web.Response:
        nonlocal logins
        logins += 1
        return web.json_response({"token": token})

    async def forecast(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {token}":
            return web.json_response({"error": "token"}, status=401)
        return web.json_response({"data": [point], "meta": meta})

    app = web.Application()
    app.router.add_get("/login", login)
    app.router.add_get("/v3/forecast", forecast)
    clock = FakeClock(NOW.timestamp())
    async with serve(app) as url:
        client = WattTimeProvider(
            session, username="greenfed", password="hunter2", base_url=url, clock=clock
        )
        latest = await client.latest("US-CAL-CISO")
        assert latest.carbon_g_per_kwh > 0
        # Kept for the lifetime a token without a readable expiry gets, then renewed.
        clock.advance(TOKEN_LIFETIME_S / 2)
        await client.latest("US-CAL-CISO")
        assert logins == 1
