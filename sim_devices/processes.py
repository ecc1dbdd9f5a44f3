"""`greenfed sim --processes N`: one simulated fleet split over N processes.

One event loop carries a few thousand agents (each its own MQTT connection,
telemetry round and keep-alive; benchmarks/RESULTS.md); a larger fleet is
split so that it uses more than one core. Each child is `greenfed sim` with
the same arguments and `--shard i/N` (sim_devices/runner.py: node k runs in
shard k mod N), a share of the connect rate, and its own event loop. This
process only starts them, says when all are connected and, once stopped, how
many telemetry messages they sent in all; a child that exits on its own
stops the others and its exit code is the command's.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import sys
import time
from dataclasses import dataclass, field

from shared.runtime import SHUTDOWN_BUDGET_S, run_until_stopped
from sim_devices.main import connected_line, stopped_line

_CONNECTED = re.compile(r"^simulated fleet: (\d+) nodes connected to (\S+) in [\d.]+ s$")
_STOPPED = re.compile(r"^simulated fleet: (\d+) nodes stopped, (\d+) telemetry messages sent$")
# A child stops its agents within its own shutdown budget, but a few thousand of them
# unwinding on a busy machine have taken over a minute to exit; killed, a child leaves
# no count of what it sent.
_CHILD_EXIT_GRACE_S = SHUTDOWN_BUDGET_S + 176.0
_SIGTERM_AGAIN_S = 10.0


@dataclass
class _Child:
    process: asyncio.subprocess.Process
    nodes: int = 0
    url: str = ""
    telemetry_sent: int | None = None  # None until it has said, on stopping
    connected: asyncio.Event = field(default_factory=asyncio.Event)

    async def read_output(self) -> None:
        """Take this child's two lines; pass anything else it prints through."""
        assert self.process.stdout is not None
        async for raw in self.process.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            if match := _CONNECTED.match(line):
                self.nodes, self.url = int(match[1]), match[2]
                self.connected.set()
            elif match := _STOPPED.match(line):
                self.nodes, self.telemetry_sent = int(match[1]), int(match[2])
            else:
                print(line, flush=True)

    def stopped_cleanly(self, code: int) -> bool:
        """Whether exit status `code` ends a clean stop. Ctrl-C reaches the children too:
        one may have stopped, said its stopped line and be on its way out, its stop
        handlers gone (asyncio.run restores the default ones), when our SIGTERM kills it.
        Nothing is lost then: what it sent is said. Read once its output has ended."""
        return code == 0 or (code == -signal.SIGTERM and self.telemetry_sent is not None)

    async def stop(self) -> int:
        """SIGTERM, sent again every `_SIGTERM_AGAIN_S` until the child exits; killed
        after `_CHILD_EXIT_GRACE_S`. A busy child used to miss one (asyncio's signal
        wakeup pipe full of its threads' wake-ups, benchmarks/RESULTS.md, issue 28);
        shared/runtime.py now hears every stop signal, so the repeat is only a harmless
        second line of defence."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _CHILD_EXIT_GRACE_S
        while self.process.returncode is None and loop.time() < deadline:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(_SIGTERM_AGAIN_S, deadline - loop.time())):
                    await self.process.wait()
        if self.process.returncode is None:
            self.process.kill()
        return await self.process.wait()


def child_arguments(
    argv: list[str], shard: int, processes: int, connects_per_s: float
) -> list[str]:
    """The child's command line: this one's, its shard and its share of the connect rate
    (argparse takes the last of an option given twice)."""
    return [
        *argv,
        "--shard",
        f"{shard}/{processes}",
        "--connect-rate",
        repr(connects_per_s / processes),
    ]


def child_command(argv: list[str], shard: int, processes: int, connects_per_s: float) -> list[str]:
    """The program and arguments a child runs: `greenfed sim` with this interpreter."""
    return [
        sys.executable,
        "-m",
        "greenfed.cli",
        *child_arguments(argv, shard, processes, connects_per_s),
    ]


async def run_sim_processes(
    argv: list[str], processes: int, stop: asyncio.Event, connects_per_s: float = 200.0
) -> int:
    """Run `greenfed sim ARGV` as `processes` shards until `stop` is set or one exits."""
    started = time.monotonic()
    children: list[_Child] = []
    readers: list[asyncio.Task[None]] = []
    try:
        for shard in range(processes):
            process = await asyncio.create_subprocess_exec(
                *child_command(argv, shard, processes, connects_per_s),
                stdout=asyncio.subprocess.PIPE,
            )
            children.append(_Child(process))
            readers.append(asyncio.create_task(children[-1].read_output()))

        async def report_when_connected() -> None:
            await asyncio.gather(*(child.connected.wait() for child in children))
            line = connected_line(
                sum(child.nodes for child in children),
                children[0].url,
                time.monotonic() - started,
            )
            print(f"{line} ({processes} processes)", flush=True)
            await stop.wait()

        async def first_exit() -> None:
            waits = [asyncio.ensure_future(child.process.wait()) for child in children]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for wait in waits:
                    wait.cancel()

        await run_until_stopped(stop, report_when_connected(), first_exit())
    finally:
        codes = await asyncio.gather(*(child.stop() for child in children))
        await asyncio.gather(*readers, return_exceptions=True)
        nodes = sum(child.nodes for child in children)
        sent = [child.telemetry_sent for child in children]
        if all(count is not None for count in sent):
            print(stopped_line(nodes, sum(count or 0 for count in sent)), flush=True)
        else:  # a child killed or failed: no total, rather than one that is short
            silent = sum(1 for count in sent if count is None)
            print(
                f"simulated fleet: {nodes} nodes stopped, {silent} processes did not say "
                "how many telemetry messages they sent",
                flush=True,
            )
    # Stopped by us: SIGTERM, which each child takes as a normal stop (exit 0).
    return next(
        (
            code
            for child, code in zip(children, codes, strict=True)
            if not child.stopped_cleanly(code)
        ),
        0,
    )
