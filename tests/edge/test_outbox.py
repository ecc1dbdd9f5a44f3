"""The outbox (edge/agent/outbox.py) over connections that come and go: what the broker
has not acknowledged goes out on the next connection, without waiting for another
message to be raised."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import cast

import aiomqtt
import msgspec
import pytest

from edge.agent.context import AgentContext, AgentCounters, NodeIdentity
from edge.agent.outbox import Outbox
from edge.agent.spool import MemorySpool
from shared.lean_logs import get_logger
from shared.messages import NodeEvent
from shared.topics import Topics

pytestmark = pytest.mark.timeout(30)


class DyingLink:
    """A connection whose publishes wait for an acknowledgement that never comes, until
    the link is noticed as lost."""

    def __init__(self) -> None:
        self.publishing = asyncio.Event()
        self.lost = asyncio.Event()

    async def publish(self, topic: str, payload: bytes, *, qos: int, retain: bool) -> None:
        self.publishing.set()
        await self.lost.wait()
        raise aiomqtt.MqttError("connection lost")


class WorkingLink:
    def __init__(self) -> None:
        self.payloads: list[bytes] = []
        self.published = asyncio.Event()

    async def publish(self, topic: str, payload: bytes, *, qos: int, retain: bool) -> None:
        self.payloads.append(payload)
        self.published.set()


def outbox() -> Outbox:
    context = AgentContext(
        identity=NodeIdentity(node_id="outbox-1", site="edge", zone="z", region="r"),
        instance_id="i1",
        topics=Topics("greenfed"),
        counters=AgentCounters(),
        wall_clock=time.time,
        log=get_logger("test"),
    )
    return Outbox(context, MemorySpool(max_bytes=1 << 20, max_age_s=3600.0, clock=time.time))


async def connected(box: Outbox, link: object) -> asyncio.Task[None]:
    """The agent's order on each connection: every module's `on_connect`, then `run`."""
    client = cast(aiomqtt.Client, link)
    await box.on_connect(client)
    return asyncio.create_task(box.run(client))


async def test_an_event_in_flight_when_the_link_drops_goes_out_on_the_next_connection() -> None:
    box = outbox()
    dying = DyingLink()
    first = await connected(box, dying)
    box.raise_event("probe-failed", subject="in-flight", detail="raised as the link died")
    await asyncio.wait_for(dying.publishing.wait(), 5)
    dying.lost.set()
    with pytest.raises(aiomqtt.MqttError):
        await first

    working = WorkingLink()
    second = await connected(box, working)
    try:
        # Nothing else is raised: the spooled event must go out by itself.
        await asyncio.wait_for(working.published.wait(), 5)
    finally:
        second.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await second
    event = msgspec.json.decode(working.payloads[0], type=NodeEvent)
    assert event.subject == "in-flight"
    assert box.pending_bytes == 0
