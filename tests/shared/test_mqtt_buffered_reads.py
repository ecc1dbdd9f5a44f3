"""`shared/mqtt.py` `_BufferedReads`: paho's packets read from chunks of the socket, every
one delivered whatever way the bytes are split, and none left behind in memory."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import paho.mqtt.client as mqtt
import pytest

from shared.mqtt import _BufferedReads


def publish_packet(topic: str, payload: bytes) -> bytes:
    """An MQTT 3.1.1 PUBLISH, QoS 0."""
    body = len(topic).to_bytes(2, "big") + topic.encode() + payload
    length, encoded = len(body), bytearray()
    while True:
        byte, length = length % 128, length // 128
        encoded.append(byte | (128 if length else 0))
        if not length:
            return bytes([0x30]) + bytes(encoded) + body


@pytest.fixture
def wired() -> Iterator[tuple[mqtt.Client, socket.socket, list[tuple[str, bytes]]]]:
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    paho = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)  # type: ignore[attr-defined]
    received: list[tuple[str, bytes]] = []
    paho.on_message = lambda client, userdata, message: received.append(
        (message.topic, bytes(message.payload))
    )
    paho._sock = ours  # what paho holds once connected
    _BufferedReads.install(paho)
    yield paho, theirs, received
    ours.close()
    theirs.close()


def test_packets_split_anyhow_are_each_delivered_once(
    wired: tuple[mqtt.Client, socket.socket, list[tuple[str, bytes]]],
) -> None:
    paho, broker, received = wired
    sent = [(f"n/{i}/telemetry", bytes([i % 256]) * (i * 37 % 900)) for i in range(300)]
    stream = b"".join(publish_packet(topic, payload) for topic, payload in sent)
    # In pieces that cut packets anywhere, each read as the event loop would.
    for start in range(0, len(stream), 5003):
        broker.sendall(stream[start : start + 5003])
        paho.loop_read()
    assert received == sent


def test_a_wake_up_reads_a_bounded_amount_and_the_socket_keeps_the_rest(
    wired: tuple[mqtt.Client, socket.socket, list[tuple[str, bytes]]],
) -> None:
    paho, broker, received = wired
    payload = b"x" * 1000
    count = _BufferedReads.MAX_CHUNKS * _BufferedReads.CHUNK_BYTES // 1000 + 500
    stream = b"".join(publish_packet("n/1/telemetry", payload) for _ in range(count))
    broker.setblocking(False)
    sent = 0
    while sent < len(stream):  # the socket's buffer is smaller than the stream
        try:
            sent += broker.send(stream[sent:])
        except BlockingIOError:
            paho.loop_read()
    first = len(received)
    paho.loop_read()
    assert len(received) > first  # bounded per wake-up, yet nothing stuck in memory
    while len(received) < count:
        before = len(received)
        paho.loop_read()
        assert len(received) > before  # every call makes progress from the socket
    assert received == [("n/1/telemetry", payload)] * count
