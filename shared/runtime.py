"""Process lifecycle for every long-running command: signals, bounded shutdown.

SIGINT (Ctrl-C) and SIGTERM set a stop event; the command then cancels its work
and has `SHUTDOWN_BUDGET_S` to finish. No traceback is printed for a normal stop.

A stop signal is never lost, however busy the process. asyncio's `add_signal_handler`
alone hears a signal only as a byte in the loop's self-pipe (the signal wakeup fd),
the pipe every `call_soon_threadsafe` (each `asyncio.to_thread` completion) also
writes to; when that pipe is full the byte is dropped ("Exception ignored when trying
to write to the signal wakeup fd") and the stop with it, which a sim of 2,000 agents at
load 11 did (benchmarks/RESULTS.md, issue 28). So the stop is also set by a Python-level
handler, which CPython runs in the main thread for every delivered signal whether or not
the wakeup byte was written; the wakeup fd stays, so an idle loop wakes at once (and a
full pipe wakes it anyway: it is readable).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable, Coroutine
from types import FrameType
from typing import Any

from shared.lean_logs import get_logger
from shared.tasks import cancel_and_wait

SHUTDOWN_BUDGET_S = 4.0

MainFunction = Callable[[asyncio.Event], Awaitable[int]]


def run_main(main: MainFunction) -> int:
    """Run `main(stop_event)` in a fresh event loop; return its exit code."""

    async def runner() -> int:
        stop = asyncio.Event()
        _install_stop_signals(asyncio.get_running_loop(), stop)
        return await main(stop)

    try:
        return asyncio.run(runner())
    except KeyboardInterrupt:  # a second Ctrl-C during shutdown
        return 130


def _install_stop_signals(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
    """SIGINT and SIGTERM set `stop`, through the wakeup fd and a Python-level handler.

    `add_signal_handler` points the wakeup fd at the loop's self-pipe and has the loop
    restore the default handlers when it closes; the handler installed over its no-op
    one then sets `stop` even when the pipe was full and the byte lost. Both routes
    only set an event, so a signal heard twice is harmless.
    """

    def on_stop_signal(signum: int, frame: FrameType | None) -> None:
        # Runs in the main thread between two bytecodes, possibly inside the loop's own
        # code: hand the set to the loop rather than touch the event from here.
        with contextlib.suppress(RuntimeError):  # the loop has closed: nothing to stop
            loop.call_soon_threadsafe(stop.set)

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
        signal.signal(signum, on_stop_signal)
        signal.siginterrupt(signum, False)  # as add_signal_handler had it: SA_RESTART
    # A full pipe no longer loses a stop, so CPython's warning about it is only noise.
    wakeup_fd = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(wakeup_fd, warn_on_full_buffer=False)


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
