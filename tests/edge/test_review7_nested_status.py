"""Whoever can write a node's `status` cannot hide a forged birth behind JSON nested too
deeply to decode (msgspec raises RecursionError there, not DecodeError): the agent takes
it as a superseded birth like any other and announces itself again
(edge/agent/birth.py). And a handler that keeps failing fills the agent's log with one
line per interval, not one traceback per message (edge/agent/inbox.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiomqtt
import pytest
from structlog.testing import capture_logs

from edge.agent.inbox import Inbox
from shared.messages import STATUS_DECODER, NodeStatus
from shared.settings import parse_mqtt_url
from shared.topics import Channel, Topics
from tests.support.brokers import BrokerUnderTest
from tests.support.fleet import mqtt_settings, running, simulated_agent
from tests.support.waiting import eventually, eventually_async

pytestmark = pytest.mark.timeout(60)

# Deeper than msgspec's recursion guard, and small enough for any broker's limits.
NESTING = 10_000
NESTED_STATUS = b'{"node_id":"orin-7","x":' + b"[" * NESTING + b"]" * NESTING + b"}"
DROPPED = "incoming message dropped"


def client_of(url: str) -> aiomqtt.Client:
    endpoint = parse_mqtt_url(url)
    return aiomqtt.Client(endpoint.host, endpoint.port)


async def retained(url: str, topic: str) -> bytes:
    """The retained payload of `topic` (b"" when there is none), read with a sentinel."""
    sentinel = f"{topic}/_sentinel"
    found = b""
    async with client_of(url) as client:
        await client.subscribe(topic, qos=1)
        await client.subscribe(sentinel, qos=1)
        await client.publish(sentinel, b"end", qos=1)
        async with asyncio.timeout(10):
            async for message in client.messages:
                if message.topic.value == sentinel:
                    return found
                if message.retain and isinstance(message.payload, bytes):
                    found = message.payload
    return found


async def test_a_status_nested_too_deeply_to_decode_is_a_superseded_birth_announced_again(
    broker: BrokerUnderTest, topic_root: str
) -> None:
    agent = simulated_agent("orin-7", mqtt_settings(broker.url, topic_root))
    topic = Topics(topic_root).node("orin-7", Channel.STATUS)

    async def own_birth_retained() -> bool:
        payload = await retained(broker.url, topic)
        if not payload or payload == NESTED_STATUS:
            return False
        status: NodeStatus = STATUS_DECODER.decode(payload)
        return status.instance_id == agent.instance_id and status.state == "online"

    with capture_logs() as logs:
        async with running(agent):
            await eventually(agent.announced.is_set)
            await eventually_async(own_birth_retained)
            async with client_of(broker.url) as client:
                await client.publish(topic, NESTED_STATUS, qos=1, retain=True)

            await eventually(lambda: agent.counters.births_repeated >= 1)
            assert agent.counters.births_superseded >= 1
            await eventually_async(own_birth_retained)  # the forgery no longer stands

    assert [entry for entry in logs if str(entry["event"]).startswith(DROPPED)] == []
    superseded = [entry for entry in logs if str(entry["event"]).startswith("birth superseded")]
    assert [entry["found"] for entry in superseded] == ["unreadable"]


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


async def test_a_handler_failing_on_every_message_is_logged_once_per_topic_with_its_traceback() -> (
    None
):
    async def broken(client: aiomqtt.Client, received: aiomqtt.Message) -> None:
        raise RuntimeError("a bug in the handler")

    inbox = Inbox({"t/status": broken, "t/desired": broken})
    flood = [message("t/status", b"x")] * 200 + [message("t/desired", b"y")] * 3
    with capture_logs() as logs:
        async with asyncio.timeout(10):
            await inbox.run(_Connection(flood))  # type: ignore[arg-type]

    assert inbox.failures == 203  # every one counted
    dropped = [entry for entry in logs if str(entry["event"]).startswith(DROPPED)]
    assert [entry["topic"] for entry in dropped] == ["t/status", "t/desired"]
    assert all(entry.get("exc_info") for entry in dropped)  # the bug is still seen, once
