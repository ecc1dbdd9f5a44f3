"""A message is delivered at the lower of the QoS it was published with and the QoS of
the subscription (MQTT 3.1.1, 3.8.4): third-party subscribers see telemetry at QoS 0 as
the topic contract says (docs/mqtt.md), whichever broker greenfed runs on. Mosquitto is
the reference; the embedded broker (amqtt) must agree."""

from __future__ import annotations

import asyncio
import uuid

import aiomqtt
import pytest

from shared.settings import parse_mqtt_url
from tests.support.brokers import BrokerUnderTest

pytestmark = pytest.mark.timeout(60)


async def test_delivery_is_at_the_lower_of_publish_and_subscription_qos(
    broker: BrokerUnderTest,
) -> None:
    endpoint = parse_mqtt_url(broker.url)
    topic = f"qos-test/{uuid.uuid4().hex}"
    async with (
        aiomqtt.Client(endpoint.host, endpoint.port, identifier=f"s-{uuid.uuid4().hex[:8]}") as sub,
        aiomqtt.Client(endpoint.host, endpoint.port, identifier=f"p-{uuid.uuid4().hex[:8]}") as pub,
    ):
        await sub.subscribe(f"{topic}/sub1", qos=1)
        await sub.subscribe(f"{topic}/sub0", qos=0)
        sent = [("sub1", 0), ("sub1", 1), ("sub0", 1), ("sub0", 0)]
        for suffix, qos in sent:
            await pub.publish(f"{topic}/{suffix}", f"{suffix}-{qos}".encode(), qos=qos)
        received: dict[str, int] = {}
        async with asyncio.timeout(30):
            async for message in sub.messages:
                received[bytes(message.payload).decode()] = message.qos
                if len(received) == len(sent):
                    break
    assert received == {"sub1-0": 0, "sub1-1": 1, "sub0-1": 0, "sub0-0": 0}
