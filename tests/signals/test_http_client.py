"""The one GET every HTTP client uses: status codes mapped to SignalErrors, Retry-After read."""

from __future__ import annotations

import asyncio
from email.utils import format_datetime

import aiohttp
import msgspec
import pytest
from aiohttp import web

from cloud.signals.http_client import HttpSource, parse_retry_after
from cloud.signals.model import SignalAuthError, SignalRateLimited, SignalUnavailable

from .support import FakeClock, epoch, serve, utc


class Body(msgspec.Struct, frozen=True):
    value: float | None


DECODER = msgspec.json.Decoder(Body)
NOW_S = epoch(2025, 3, 1, 12)


def test_retry_after_is_read_as_seconds_or_an_http_date() -> None:
    assert parse_retry_after("120", NOW_S) == 120.0
    in_90_s = format_datetime(utc(2025, 3, 1, 12, 1).replace(second=30), usegmt=True)
    assert parse_retry_after(in_90_s, NOW_S) == 90.0
    past = format_datetime(utc(2025, 3, 1, 11), usegmt=True)
    assert parse_retry_after(past, NOW_S) == 0.0
    assert parse_retry_after(None, NOW_S) is None
    assert parse_retry_after("soon", NOW_S) is None


def app_answering(
    status: int, body: str = "", headers: dict[str, str] | None = None, delay_s: float = 0.0
) -> web.Application:
    async def handler(request: web.Request) -> web.Response:
        if delay_s:
            await asyncio.sleep(delay_s)
        return web.Response(
            status=status, text=body, headers=headers, content_type="application/json"
        )

    app = web.Application()
    app.router.add_get("/v1/thing", handler)
    return app


async def get(
    session: aiohttp.ClientSession, app: web.Application, timeout_s: float = 2.0
) -> Body | None:
    async with serve(app) as url:
        source = HttpSource(
            session,
            provider="test",
            base_url=url + "/v1/",
            timeout_s=timeout_s,
            clock=FakeClock(NOW_S),
        )
        return await source.get("thing", DECODER)


async def test_a_body_is_decoded_into_its_struct(session: aiohttp.ClientSession) -> None:
    assert await get(session, app_answering(200, '{"value": 4.5, "extra": 1}')) == Body(4.5)
    assert await get(session, app_answering(200, '{"value": null}')) == Body(None)
    assert await get(session, app_answering(204)) is None


@pytest.mark.parametrize("status", [401, 403])
async def test_refused_credentials_are_auth_errors(
    session: aiohttp.ClientSession, status: int
) -> None:
    with pytest.raises(SignalAuthError, match=f"HTTP {status}"):
        await get(session, app_answering(status, '{"error": "bad token"}'))


async def test_429_carries_retry_after(session: aiohttp.ClientSession) -> None:
    with pytest.raises(SignalRateLimited) as seconds:
        await get(session, app_answering(429, headers={"Retry-After": "30"}))
    assert seconds.value.retry_after_s == 30.0
    date = format_datetime(utc(2025, 3, 1, 12, 5), usegmt=True)
    with pytest.raises(SignalRateLimited) as dated:
        await get(session, app_answering(429, headers={"Retry-After": date}))
    assert dated.value.retry_after_s == 300.0
    with pytest.raises(SignalRateLimited) as absent:
        await get(session, app_answering(429))
    assert absent.value.retry_after_s is None


@pytest.mark.parametrize("status", [400, 404, 500, 502, 503, 418])
async def test_other_failures_are_unavailable(session: aiohttp.ClientSession, status: int) -> None:
    with pytest.raises(SignalUnavailable, match=f"HTTP {status}"):
        await get(session, app_answering(status, "nope"))


async def test_a_slow_answer_times_out(session: aiohttp.ClientSession) -> None:
    with pytest.raises(SignalUnavailable, match="timed out"):
        await get(session, app_answering(200, '{"value": 1}', delay_s=1.0), timeout_s=0.1)


async def test_an_unexpected_format_is_unavailable(session: aiohttp.ClientSession) -> None:
    with pytest.raises(SignalUnavailable, match="unexpected format"):
        await get(session, app_answering(200, '{"value": "high"}'))
    with pytest.raises(SignalUnavailable, match="unexpected format"):
        await get(session, app_answering(200, "<html>maintenance</html>"))


async def test_a_closed_port_is_unavailable(session: aiohttp.ClientSession) -> None:
    async with serve(web.Application()) as url:
        pass  # the server is gone now: nothing listens on that port
    source = HttpSource(session, provider="test", base_url=url, timeout_s=2.0)
    with pytest.raises(SignalUnavailable, match="failed"):
        await source.get("thing", DECODER)
