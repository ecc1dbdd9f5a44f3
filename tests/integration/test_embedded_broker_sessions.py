"""What a broker does with a client's connection, whichever broker greenfed runs on:
it drops a client that went silent past its keep-alive and publishes its will, and a new
connection with a client id ends the old one, will first. Mosquitto is the reference; the
embedded broker (amqtt) must agree. Then what only the embedded broker can show here: a
subscriber that stops reading costs it a bounded amount of memory, not one message
more for every message published.

The clients are raw sockets: a half-open link is one that sends nothing and does not
close, which no MQTT library does on purpose."""

from __future__ import annotations

import asyncio
import socket
import struct
import tracemalloc
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiomqtt
import pytest

from greenfed.broker import EmbeddedBroker
from shared.settings import parse_mqtt_url
from tests.support.brokers import BrokerUnderTest

pytestmark = pytest.mark.timeout(60)

CONNACK_ACCEPTED = b"\x20\x02\x00\x00"
# MQTT 3.1.1 §3.1.2.10: a broker drops a client silent for 1.5 keep-alive periods.
KEEPALIVE_S = 2
WAIT_S = 15.0


def _string(value: bytes) -> bytes:
    return struct.pack("!H", len(value)) + value


def _remaining_length(length: int) -> bytes:
    encoded = bytearray()
    while True:
        digit, length = length % 128, length // 128
        encoded.append(digit | (0x80 if length else 0))
        if not length:
            return bytes(encoded)


def _connect_packet(client_id: str, keepalive_s: int, will_topic: str, will: bytes) -> bytes:
    """A clean-session CONNECT with a retained QoS 1 will (what an agent sends)."""
    flags = 0x20 | 0x08 | 0x04 | 0x02  # will retain, will QoS 1, will, clean session
    header = _string(b"MQTT") + bytes([4, flags]) + struct.pack("!H", keepalive_s)
    body = header + _string(client_id.encode()) + _string(will_topic.encode()) + _string(will)
    return b"\x10" + _remaining_length(len(body)) + body


def _publish_packet(topic: str, payload: bytes, *, retain: bool) -> bytes:
    body = _string(topic.encode()) + payload
    return bytes([0x30 | int(retain)]) + _remaining_length(len(body)) + body


def _subscribe_packet(topic_filter: str) -> bytes:
    body = struct.pack("!H", 1) + _string(topic_filter.encode()) + b"\x00"
    return b"\x82" + _remaining_length(len(body)) + body


@asynccontextmanager
async def _raw_connection(
    url: str, connect: bytes
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    endpoint = parse_mqtt_url(url)
    reader, writer = await asyncio.open_connection(endpoint.host, endpoint.port)
    try:
        writer.write(connect)
        async with asyncio.timeout(WAIT_S):
            assert await reader.readexactly(4) == CONNACK_ACCEPTED
        yield reader, writer
    finally:
        writer.transport.abort()


async def _closed_by_broker(reader: asyncio.StreamReader) -> bool:
    """Whether the broker closes this connection (it sends nothing else to it)."""
    try:
        async with asyncio.timeout(WAIT_S):
            return await reader.read(100) == b""
    except TimeoutError:
        return False
    except ConnectionError:
        return True


def _observer(url: str) -> aiomqtt.Client:
    endpoint = parse_mqtt_url(url)
    return aiomqtt.Client(endpoint.host, endpoint.port, identifier=f"o-{uuid.uuid4().hex[:8]}")


async def test_a_silent_client_is_dropped_after_its_keepalive_and_its_will_published(
    broker: BrokerUnderTest, topic_root: str
) -> None:
    will_topic = f"{topic_root}/status"
    loop = asyncio.get_running_loop()
    async with _observer(broker.url) as observer:
        await observer.subscribe(will_topic, qos=1)
        connect = _connect_packet(
            f"silent-{uuid.uuid4().hex[:8]}", KEEPALIVE_S, will_topic, b"gone"
        )
        async with _raw_connection(broker.url, connect) as (reader, _):
            silent_since = loop.time()
            async with asyncio.timeout(WAIT_S):
                message = await anext(aiter(observer.messages))
            will_after_s = loop.time() - silent_since
            assert await _closed_by_broker(reader)
    assert message.payload == b"gone"
    # A client that sends something within its keep-alive period is never dropped.
    assert will_after_s >= KEEPALIVE_S


async def test_a_new_connection_with_the_client_id_ends_the_old_one_will_first(
    broker: BrokerUnderTest, topic_root: str
) -> None:
    """An agent whose link went half-open reconnects with its client id and announces
    itself: its old connection must not stay open (publishing), and its will (offline)
    must come before the new birth, never after, or a connected node looks offline."""
    status = f"{topic_root}/status"
    client_id = f"agent-{uuid.uuid4().hex[:8]}"
    connect = _connect_packet(client_id, 60, status, b"offline")
    seen: list[bytes] = []
    async with _observer(broker.url) as observer:
        await observer.subscribe(status, qos=1)
        # One after the other: the old connection is up when the new one comes.
        async with (
            _raw_connection(broker.url, connect) as (old_reader, _),
            _raw_connection(broker.url, connect) as (_, new_writer),
        ):
            new_writer.write(_publish_packet(status, b"online", retain=True))
            async with asyncio.timeout(WAIT_S):
                async for message in observer.messages:
                    seen.append(bytes(message.payload))
                    if message.payload == b"online":
                        break
            assert await _closed_by_broker(old_reader)
            async with _observer(broker.url) as late:
                await late.subscribe(status, qos=1)
                async with asyncio.timeout(WAIT_S):
                    retained = await anext(aiter(late.messages))
    assert seen == [b"offline", b"online"]
    assert retained.payload == b"online"


async def test_a_subscriber_that_stops_reading_costs_the_embedded_broker_bounded_memory() -> None:
    """A third-party telemetry reader on a slow link stops reading: the embedded broker
    (in the control plane's process, under `greenfed up`) keeps at most
    `max_queued_messages` for it, drops the QoS 0 messages past that, counted, and goes
    on serving everyone else."""
    max_queued_messages, message_count, payload = 100, 3000, b"x" * 8192
    topic_root = f"gftest-{uuid.uuid4().hex[:12]}"
    already_tracing = tracemalloc.is_tracing()
    if not already_tracing:
        tracemalloc.start()
    try:
        async with EmbeddedBroker(port=0, max_queued_messages=max_queued_messages) as broker:
            endpoint = parse_mqtt_url(broker.url)
            # A small receive buffer, so the broker soon has to hold what it cannot send;
            # the reader stops reading by itself once 2 kB wait in it (its limit).
            stalled = socket.socket()
            stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            stalled.setblocking(False)
            await asyncio.get_running_loop().sock_connect(stalled, (endpoint.host, endpoint.port))
            reader, writer = await asyncio.open_connection(sock=stalled, limit=1024)
            try:
                body = _string(b"MQTT") + bytes([4, 0x02]) + struct.pack("!H", 600)
                body += _string(b"stalled-reader")
                writer.write(b"\x10" + _remaining_length(len(body)) + body)
                writer.write(_subscribe_packet(f"{topic_root}/#"))
                async with asyncio.timeout(WAIT_S):
                    assert await reader.readexactly(4) == CONNACK_ACCEPTED
                    await reader.readexactly(5)  # SUBACK
                async with (
                    _observer(broker.url) as healthy,
                    aiomqtt.Client(
                        endpoint.host, endpoint.port, max_queued_outgoing_messages=0
                    ) as publisher,
                ):
                    await healthy.subscribe(f"{topic_root}/last", qos=0)
                    traced_before, _ = tracemalloc.get_traced_memory()
                    for index in range(message_count):
                        await publisher.publish(f"{topic_root}/n{index % 50}", payload, qos=0)
                    # One broadcast queue: once this arrives, every message before it has
                    # been handed to (or dropped for) the stalled reader.
                    await publisher.publish(f"{topic_root}/last", b"last", qos=0)
                    async with asyncio.timeout(WAIT_S):
                        last = await anext(aiter(healthy.messages))
                    traced_after, _ = tracemalloc.get_traced_memory()
                assert last.payload == b"last"
                held_bytes = traced_after - traced_before
                # Unbounded, it held about 20 MB here (every message it could not send).
                assert held_bytes < 6 * 2**20, f"the broker held {held_bytes} bytes"
                assert broker.dropped_messages >= message_count // 2
            finally:
                writer.transport.abort()
    finally:
        if not already_tracing:
            tracemalloc.stop()
