"""Stopping tasks reliably.

On Python 3.11, `asyncio.wait_for` can swallow a cancellation that arrives just
as the awaited future completes (CPython gh-86296, fixed in 3.12); aiomqtt waits
for every CONNACK, SUBACK and PUBACK that way. A task cancelled at that moment
carries on as if nothing happened, and whoever awaits it waits for ever. Owners
therefore cancel again until the task really ends, within a bound.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Any

from shared.lean_logs import get_logger

# Longer than a stopping agent's goodbye (edge.agent.module.GOODBYE_TIMEOUT_S), so a second
# cancellation never cuts a clean goodbye short.
RECANCEL_INTERVAL_S = 1.5


async def cancel_and_wait(
    tasks: Iterable[asyncio.Task[Any]], timeout_s: float = 5.0
) -> set[asyncio.Task[Any]]:
    """Cancel `tasks` (repeatedly, see above) and wait for them; return those still running."""
    pending = {task for task in tasks if not task.done()}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while pending and loop.time() < deadline:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(
            pending, timeout=min(RECANCEL_INTERVAL_S, max(0.0, deadline - loop.time()))
        )
    return pending


async def stop_task(task: asyncio.Task[Any], timeout_s: float = 5.0) -> None:
    """Cancel one task and wait for it; re-raise what it failed with, if not cancellation."""
    await cancel_and_wait([task], timeout_s)
    if task.done():
        with contextlib.suppress(asyncio.CancelledError):
            task.result()


async def stop_tasks(tasks: Iterable[asyncio.Task[Any]], timeout_s: float = 5.0) -> None:
    """Stop `tasks` one after the other as `stop_task` does, every one of them even when
    one failed (those after it would otherwise run on, unowned); then re-raise the first
    failure. A later failure of another kind is logged, one of the same kind is the same
    failure again (a refused broker login fails every session of the process)."""
    failures: list[tuple[str, Exception]] = []
    for task in tasks:
        try:
            await stop_task(task, timeout_s)
        except Exception as failure:
            failures.append((task.get_name(), failure))
    if not failures:
        return
    (_, first), *others = failures
    for name, other in others:
        if type(other) is not type(first):
            get_logger("greenfed").warning("task failed too", task=name, exc_info=other)
    raise first
