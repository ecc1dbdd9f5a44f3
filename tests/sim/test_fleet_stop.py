"""A simulated fleet stops whole: an agent whose cancellation was dropped (aiomqtt's
`asyncio.wait_for` on Python 3.11, shared/tasks.py) is cancelled again until it ends,
so its telemetry stops before the fleet says how much it sent, and its process exits."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import cast

from edge.agent import Agent
from sim_devices.fleet import load_fleet, scale_fleet
from sim_devices.runner import SimulatedFleet
from tests.support.fleet import mqtt_settings


@dataclass(frozen=True)
class _Identity:
    node_id: str


class CarriesOnOnce:
    """An agent whose first cancellation is lost, as when it arrives just as a publish's
    write completes; it then runs on until cancelled again."""

    def __init__(self, node_id: str) -> None:
        self.identity = _Identity(node_id)
        self.started = asyncio.Event()
        self.cancellations = 0

    async def run(self) -> None:
        self.started.set()
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                self.cancellations += 1
                if self.cancellations > 1:
                    raise


async def test_an_agent_that_carried_on_after_its_cancellation_is_cancelled_again() -> None:
    fleet = SimulatedFleet(
        scale_fleet(load_fleet(), 2), mqtt_settings("mqtt://127.0.0.1:1", "gftest-stop")
    )
    agents = [CarriesOnOnce("stubborn-0"), CarriesOnOnce("stubborn-1")]
    fleet.agents = cast(list[Agent], agents)
    running = asyncio.ensure_future(fleet.run())
    try:
        async with asyncio.timeout(10):
            await asyncio.gather(*(agent.started.wait() for agent in agents))
        assert not fleet.stopped.is_set()
        running.cancel()
        async with asyncio.timeout(10):
            await asyncio.gather(running, return_exceptions=True)
    finally:
        running.cancel()
    assert running.cancelled()
    assert fleet.stopped.is_set()
    assert [agent.cancellations for agent in agents] == [2, 2]
