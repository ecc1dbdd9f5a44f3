"""`desired` publishing survives the broker going away: what the loop handed over while
it was down goes out when it returns, newest document per node, retained."""

from __future__ import annotations

import asyncio

import aiomqtt
import pytest

from cloud.loop.publisher import DesiredPublisher
from greenfed.broker import EmbeddedBroker
from shared.messages import DESIRED_DECODER, DesiredState
from shared.tasks import stop_task
from shared.topics import Channel, Topics
from tests.support.brokers import free_port
from tests.support.fleet import mqtt_settings
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(60)


def document(node_id: str, generation: int) -> DesiredState:
    return DesiredState(node_id=node_id, generation=generation, issued_at=1.0)


async def retained(url: str, root: str, expected: int) -> dict[str, int]:
    """Generation per node from the broker's retained `desired` documents."""
    host, port = url.removeprefix("mqtt://").split(":")
    found: dict[str, int] = {}
    async with aiomqtt.Client(host, int(port), identifier="test-reader") as client:
        await client.subscribe(Topics(root).all_nodes(Channel.DESIRED), qos=1)
        async with asyncio.timeout(10):
            async for message in client.messages:
                assert isinstance(message.payload, bytes)
                desired = DESIRED_DECODER.decode(message.payload)
                found[desired.node_id] = desired.generation
                if len(found) == expected:
                    return found
    return found


async def test_documents_handed_over_while_the_broker_is_down_go_out_when_it_returns() -> None:
    port = free_port()
    broker = EmbeddedBroker(port=port)
    await broker.start()
    settings = mqtt_settings(broker.url, "publisher")
    publisher = DesiredPublisher(settings)
    task = asyncio.create_task(publisher.run())
    try:
        await eventually(publisher.connected.is_set, timeout_s=10)
        publisher.submit(document("n1", 1))
        await eventually(lambda: publisher.published_total == 1, timeout_s=10)

        await broker.stop()
        await eventually(lambda: not publisher.connected.is_set(), timeout_s=10)
        # The loop never waits for the broker: these return at once.
        for node_id, generation in (("n1", 2), ("n2", 1), ("n1", 3)):
            publisher.submit(document(node_id, generation))
        assert publisher.is_current("n1", 3)
        assert not publisher.is_current("n1", 4)

        broker = EmbeddedBroker(port=port)
        await broker.start()
        await eventually(lambda: publisher.published_total == 3, timeout_s=15)
        # The newest document per node, retained for agents that connect later.
        assert await retained(broker.url, "publisher", expected=2) == {"n1": 3, "n2": 1}
    finally:
        await stop_task(task)
        await broker.stop()
