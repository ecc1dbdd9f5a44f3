"""Waiting for conditions without fixed sleeps: poll briefly, fail with a message on timeout."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable


async def eventually(
    condition: Callable[[], bool],
    *,
    timeout_s: float = 10.0,
    interval_s: float = 0.02,
    message: str | Callable[[], str] = "condition not met",
) -> None:
    """Return as soon as `condition()` holds; raise AssertionError after `timeout_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        if loop.time() > deadline:
            text = message() if callable(message) else message
            raise AssertionError(f"timed out after {timeout_s} s: {text}")
        await asyncio.sleep(interval_s)


async def eventually_async(
    condition: Callable[[], Awaitable[bool]],
    *,
    timeout_s: float = 10.0,
    interval_s: float = 0.02,
    message: str | Callable[[], str] = "condition not met",
) -> None:
    """Like `eventually`, for a condition that has to await (an HTTP call, say)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await condition():
        if loop.time() > deadline:
            text = message() if callable(message) else message
            raise AssertionError(f"timed out after {timeout_s} s: {text}")
        await asyncio.sleep(interval_s)
