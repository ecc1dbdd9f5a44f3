"""Process lifecycle for every long-running command: signals, bounded shutdown.

SIGINT (Ctrl-C) and SIGTERM set a stop event; the command then cancels its work
and has `SHUTDOWN_BUDGET_S` to finish. No traceback is printed for a normal stop.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from shared.lean_logs import get_logger
from shared.tasks import cancel_and_wait

SHUTDOWN_BUDGET_S = 4.0

MainFunction = Callable[[asyncio.Event], Awaitable[int]]


def run_main(main: MainFunction) -> int:
    """Run `main(stop_event)` in a fresh event loop; return its exit code."""

    async def runner() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        return await main(stop)

    try:
        return asyncio.run(runner())
    except KeyboardInterrupt:  # a second Ctrl-C during shutdown
        return 130


async def run_until_stopped(stop: asyncio.Event, *work: Coroutine[Any, Any, None]) -> None:
    """Run `work` until `stop` is set or one piece ends; then cancel the rest, bounded.

    A piece of work that fails re-raises its exception here after the others stop,
    so a fatal error (say, refused MQTT credentials) ends the command with it.
    """
    tasks = [asyncio.ensure_future(coroutine) for coroutine in work]
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([stopper, *tasks], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
        pending = await cancel_and_wait(tasks, SHUTDOWN_BUDGET_S)
        if pending:
            get_logger("greenfed").warning(
                "shutdown budget exceeded", still_running=[t.get_name() for t in pending]
            )
    for task in tasks:
        if task.done() and not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
