"""Test helpers for signals: a fake clock and a local HTTP server on a free port."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime

from aiohttp import web
from aiohttp.test_utils import TestServer


class FakeClock:
    """A clock that only moves when a test moves it."""

    def __init__(self, now_s: float) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += seconds


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=UTC)


def epoch(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> float:
    return utc(year, month, day, hour, minute).timestamp()


@asynccontextmanager
async def serve(app: web.Application) -> AsyncIterator[str]:
    """Run `app` on 127.0.0.1 at a free port; yields its base URL (no trailing slash)."""
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("/")).rstrip("/")
    finally:
        await server.close()
