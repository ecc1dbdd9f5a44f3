"""A stop signal reaches `run_main`'s stop event even when the loop's signal wakeup
pipe is full: asyncio's own handling hears a signal only as a byte written to that pipe,
and a busy process's threads (`call_soon_threadsafe`, each `to_thread` completion) can
keep it full, which lost a sim's SIGTERM under load (benchmarks/RESULTS.md, issue 28)."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]

# SIGTERM is blocked until the wakeup pipe is full, so it arrives exactly then; threads
# flood the loop with wake-ups throughout, as a busy sim's do.
CHILD = """
import asyncio, os, signal, sys, threading, time
from shared.runtime import run_main

def flood(loop):
    try:
        while True:
            loop.call_soon_threadsafe(lambda: None)
    except RuntimeError:  # the loop closed
        pass

async def main(stop):
    loop = asyncio.get_running_loop()
    for _ in range(4):
        threading.Thread(target=flood, args=(loop,), daemon=True).start()
    wakeup_fd = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(wakeup_fd, warn_on_full_buffer=False)
    if wakeup_fd == -1:
        print("no wakeup fd", flush=True)
        return 3
    while True:  # the loop is held here, so nothing drains the pipe
        try:
            os.write(wakeup_fd, b"\\0" * 4096)
        except BlockingIOError:
            break
    print("full", flush=True)
    while signal.SIGTERM not in signal.sigpending():
        time.sleep(0.01)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    print("delivered", flush=True)
    await stop.wait()
    print("stopped", flush=True)
    return 0

signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
sys.exit(run_main(main))
"""


async def test_sigterm_stops_a_loop_whose_wakeup_pipe_is_full() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CHILD, cwd=REPOSITORY, stdout=asyncio.subprocess.PIPE
    )
    assert process.stdout is not None
    try:
        async with asyncio.timeout(20):
            assert await process.stdout.readline() == b"full\n"
            process.send_signal(signal.SIGTERM)
            assert await process.stdout.readline() == b"delivered\n"
        # Without a Python-level handler the signal's byte was dropped: no stop, ever.
        async with asyncio.timeout(15):
            rest = await process.stdout.read()
            code = await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert rest == b"stopped\n"
    assert code == 0
