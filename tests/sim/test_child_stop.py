"""`greenfed sim --processes N` stops a child that missed its SIGTERM (a busy child's
event loop can: asyncio's signal wakeup pipe full) by sending it again, rather than
waiting out the grace period and killing it, which loses its telemetry count."""

from __future__ import annotations

import asyncio
import sys

import pytest

from sim_devices import processes
from sim_devices.processes import _Child

# Ignores the first SIGTERM, as a child whose loop missed it; exits cleanly on the next.
MISSES_ONE = """
import signal, sys, time
seen = []
def on_term(signum, frame):
    seen.append(signum)
    if len(seen) > 1:
        sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


async def test_a_child_that_missed_its_sigterm_is_sent_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(processes, "_SIGTERM_AGAIN_S", 0.2, raising=False)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", MISSES_ONE, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(20):
            assert await process.stdout.readline() == b"ready\n"
            code = await _Child(process).stop()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert code == 0  # exited on its own, not killed
