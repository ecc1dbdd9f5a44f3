"""`greenfed sim --processes N` stops a child that missed its SIGTERM (a busy child's
event loop can: asyncio's signal wakeup pipe full) by sending it again, rather than
waiting out the grace period and killing it, which loses its telemetry count."""

from __future__ import annotations

import asyncio
import signal
import sys

import pytest

from sim_devices import processes
from sim_devices.processes import _Child
from tests.support.waiting import eventually

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


# A child of `run_sim_processes` that says it is connected; shard 0 then stops as a child
# the terminal's Ctrl-C reached before its parent's SIGTERM: it says its stopped line and,
# on its way out, has the default SIGTERM handler again (asyncio.run restores it). Any
# other shard stops on SIGTERM. `NO_STOPPED_LINE` in the arguments: shard 0 says nothing.
FAKE_CHILD = """
import signal, sys, time
shard = sys.argv[sys.argv.index("--shard") + 1].split("/")[0]
print("simulated fleet: 1 nodes connected to mqtt://fake:1883 in 0.01 s", flush=True)
if shard == "0":
    if "NO_STOPPED_LINE" not in sys.argv:
        print("simulated fleet: 1 nodes stopped, 5 telemetry messages sent", flush=True)
else:
    def on_term(signum, frame):
        print("simulated fleet: 1 nodes stopped, 7 telemetry messages sent", flush=True)
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
while True:
    time.sleep(0.05)
"""


async def _run_fake_children(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str]:
    """(exit code, output) of `run_sim_processes` over two fake children, stopped once
    both are connected."""
    monkeypatch.setattr(
        processes,
        "child_command",
        lambda argv, shard, count, rate: [
            sys.executable,
            "-c",
            FAKE_CHILD,
            *processes.child_arguments(argv, shard, count, rate),
        ],
    )
    stop = asyncio.Event()
    output: list[str] = []

    def said(text: str) -> bool:
        output.append(capsys.readouterr().out)
        return text in "".join(output)

    async with asyncio.timeout(30):
        running = asyncio.create_task(processes.run_sim_processes(argv, 2, stop))
        await eventually(lambda: said("(2 processes)"), timeout_s=20)
        stop.set()
        code = await running
    said("")
    return code, "".join(output)


async def test_a_child_killed_by_sigterm_after_its_clean_stop_is_a_clean_stop(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Ctrl-C reaches every child as well as the parent: a child may have stopped, said
    # how much it sent, and be on its way out when the parent's SIGTERM arrives. The
    # command used to exit 241 (-SIGTERM) after a clean stop.
    code, output = await _run_fake_children(["sim"], monkeypatch, capsys)
    assert "simulated fleet: 2 nodes stopped, 12 telemetry messages sent" in output
    assert code == 0


async def test_a_child_killed_by_sigterm_before_its_stopped_line_is_a_failure(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, output = await _run_fake_children(["sim", "NO_STOPPED_LINE"], monkeypatch, capsys)
    assert "1 processes did not say how many telemetry messages they sent" in output
    assert code == -signal.SIGTERM
