"""`greenfed sim`: a simulated fleet against any broker."""

from __future__ import annotations

import asyncio
import time

from shared.redact import redact_url
from shared.runtime import run_until_stopped
from shared.settings import Settings
from sim_devices.fleet import Fleet
from sim_devices.runner import SimulatedFleet


async def run_sim(
    settings: Settings, fleet: Fleet, stop: asyncio.Event, connects_per_s: float = 200.0
) -> int:
    simulated = SimulatedFleet(
        fleet,
        settings.mqtt,
        telemetry_interval_s=settings.agent.telemetry_interval_s,
        telemetry_jitter_ratio=settings.agent.telemetry_jitter_ratio,
        connects_per_s=connects_per_s,
        control_plane_public_key=settings.agent.control_plane_public_key,
    )
    started = time.monotonic()

    async def report_when_connected() -> None:
        await simulated.all_announced()
        print(
            f"simulated fleet: {len(simulated.agents)} nodes connected to "
            f"{redact_url(settings.mqtt.url)} "
            f"in {time.monotonic() - started:.2f} s",
            flush=True,
        )
        await stop.wait()

    await run_until_stopped(stop, simulated.run(), report_when_connected())
    return 0
