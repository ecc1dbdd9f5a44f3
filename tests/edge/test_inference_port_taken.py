"""A correctly signed `desired` document that names a deployment, on a node whose
inference port another program holds: the agent keeps running (its training work's
supervision included), reports every replica failed with a reason that names the port,
and listens once the port is free. And the inbox that hands messages to their handlers
drops a message whose handling raised, instead of ending the connection's tasks."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator

import aiomqtt
import pytest

from edge.agent.inbox import Inbox
from edge.inference.options import InferenceOptions
from shared.messages import REPORTED_DECODER, DesiredDeployment, DesiredState, ReportedState
from shared.settings import parse_mqtt_url
from shared.topics import Channel, Topics
from tests.support.brokers import BrokerUnderTest
from tests.support.fleet import mqtt_settings, publish_desired, running, simulated_agent
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(60)


async def applied_report(
    url: str, topic_root: str, desired: DesiredState, timeout_s: float = 15
) -> ReportedState:
    """Publish `desired` and return the first report of its deployments (one that
    observed its generation may come before them: training is applied first)."""
    endpoint = parse_mqtt_url(url)
    topic = Topics(topic_root).node(desired.node_id, Channel.REPORTED)
    async with aiomqtt.Client(endpoint.host, endpoint.port) as watcher:
        await watcher.subscribe(topic, qos=1)
        await publish_desired(url, topic_root, desired)
        async with asyncio.timeout(timeout_s):
            async for message in watcher.messages:
                assert isinstance(message.payload, bytes)
                if message.payload:
                    report = REPORTED_DECODER.decode(message.payload)
                    if report.observed_generation == desired.generation and report.deployments:
                        return report
    raise AssertionError("no report")


async def test_a_taken_inference_port_is_reported_and_the_agent_keeps_running(
    broker: BrokerUnderTest, topic_root: str
) -> None:
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = int(busy.getsockname()[1])
    try:
        agent = simulated_agent(
            "node-x",
            mqtt_settings(broker.url, topic_root),
            inference=InferenceOptions(host="127.0.0.1", port=port),
        )
        async with running(agent) as task:
            async with asyncio.timeout(10):
                await agent.announced.wait()
            desired = DesiredState(
                node_id="node-x",
                generation=1,
                issued_at=time.time(),
                for_instance=agent.instance_id,
                deployments=(
                    DesiredDeployment(deployment_id="d1", replica=0),
                    DesiredDeployment(deployment_id="d1", replica=1),
                ),
            )
            report = await applied_report(broker.url, topic_root, desired)
            assert [(d.deployment_id, d.replica, d.state) for d in report.deployments] == [
                ("d1", 0, "failed"),
                ("d1", 1, "failed"),
            ]
            assert all(f"port {port}" in d.reason for d in report.deployments), report
            assert not task.done()
            # The port freed: the endpoint listens there (tried again in the background).
            busy.close()
            await eventually(lambda: agent.inference_port == port, timeout_s=15)
            assert agent.inference is not None
            assert agent.inference.serving("d1") is not None
            assert not task.done()
    finally:
        busy.close()


class _Connection:
    """What `Inbox.run` reads from a client: its messages."""

    def __init__(self, messages: list[aiomqtt.Message]) -> None:
        self._messages = messages

    @property
    async def messages(self) -> AsyncIterator[aiomqtt.Message]:
        for message in self._messages:
            yield message


def message(topic: str, payload: bytes) -> aiomqtt.Message:
    return aiomqtt.Message(topic, payload, qos=1, retain=False, mid=1, properties=None)


async def test_the_inbox_drops_a_message_whose_handling_raised_and_reads_on() -> None:
    handled: list[bytes] = []

    async def handler(client: aiomqtt.Client, received: aiomqtt.Message) -> None:
        assert isinstance(received.payload, bytes)
        if received.payload == b"bad":
            raise OSError(98, "Address already in use")
        handled.append(received.payload)

    inbox = Inbox({"t/desired": handler})
    connection = _Connection(
        [message("t/desired", b"bad"), message("t/other", b"x"), message("t/desired", b"ok")]
    )
    async with asyncio.timeout(10):
        await inbox.run(connection)  # type: ignore[arg-type]
    assert handled == [b"ok"]
    assert inbox.failures == 1


async def test_the_inbox_lets_a_lost_connection_through() -> None:
    async def lost(client: aiomqtt.Client, received: aiomqtt.Message) -> None:
        raise aiomqtt.MqttError("Disconnected during message iteration")

    inbox = Inbox({"t/desired": lost})
    connection = _Connection([message("t/desired", b"doc")])
    with pytest.raises(aiomqtt.MqttError):
        async with asyncio.timeout(10):
            await inbox.run(connection)  # type: ignore[arg-type]
    assert inbox.failures == 0
