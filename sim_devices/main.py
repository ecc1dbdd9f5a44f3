"""`greenfed sim`: a simulated fleet against any broker.

It prints one line once every node has announced itself and one when it has
stopped, with how many telemetry messages its agents sent (what a benchmark
compares with what the control plane ingested); sim_devices/processes.py reads
both from each process of a fleet split over several.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from shared.redact import redact_url
from shared.runtime import run_until_stopped
from shared.settings import Settings
from sim_devices.fleet import Fleet
from sim_devices.runner import STOP_BUDGET_S, Shard, SimulatedFleet


def connected_line(nodes: int, url: str, seconds: float) -> str:
    return f"simulated fleet: {nodes} nodes connected to {url} in {seconds:.2f} s"


def stopped_line(nodes: int, telemetry_sent: int) -> str:
    return f"simulated fleet: {nodes} nodes stopped, {telemetry_sent} telemetry messages sent"


async def run_sim(
    settings: Settings,
    fleet: Fleet,
    stop: asyncio.Event,
    connects_per_s: float = 200.0,
    shard: Shard | None = None,
) -> int:
    simulated = SimulatedFleet(
        fleet,
        settings.mqtt,
        telemetry_interval_s=settings.agent.telemetry_interval_s,
        telemetry_jitter_ratio=settings.agent.telemetry_jitter_ratio,
        connects_per_s=connects_per_s,
        control_plane_public_key=settings.agent.control_plane_public_key,
        shard=shard,
    )
    started = time.monotonic()

    async def report_when_connected() -> None:
        await simulated.all_announced()
        url = redact_url(settings.mqtt.url)
        print(connected_line(len(simulated.agents), url, time.monotonic() - started), flush=True)
        await stop.wait()

    try:
        await run_until_stopped(stop, simulated.run(), report_when_connected())
    finally:
        # run_until_stopped gives its work SHUTDOWN_BUDGET_S; thousands of agents on a
        # busy machine take longer, and until all have stopped the count is not final.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STOP_BUDGET_S + 10.0):
                await simulated.stopped.wait()
        nodes, sent = len(simulated.agents), simulated.telemetry_sent()
        if simulated.stopped.is_set():
            print(stopped_line(nodes, sent), flush=True)
        else:  # not the stopped line: a benchmark then has no count rather than a short one
            print(
                f"simulated fleet: {nodes} nodes not all stopped, {sent} telemetry "
                "messages sent so far",
                flush=True,
            )
    return 0
