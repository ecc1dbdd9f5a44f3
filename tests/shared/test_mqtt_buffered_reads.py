"""`shared/mqtt.py` `_PacketReads`: MQTT packets split from chunks of the socket, every
one delivered whatever way the bytes are split, none left behind in memory; QoS 0
messages straight to the sink, everything else through paho's own handling."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import MQTTErrorCode

from shared.mqtt import _PacketReads

Wired = tuple[mqtt.Client, socket.socket, list[tuple[str, bytes]]]


def remaining_length(length: int) -> bytes:
    encoded = bytearray()
    while True:
        byte, length = length % 128, length // 128
        encoded.append(byte | (128 if length else 0))
        if not length:
            return bytes(encoded)


def publish_packet(
    topic: str | bytes, payload: bytes, *, qos: int = 0, retain: bool = False
) -> bytes:
    """An MQTT 3.1.1 PUBLISH."""
    name = topic.encode() if isinstance(topic, str) else topic
    body = len(name).to_bytes(2, "big") + name + (b"\x00\x07" if qos else b"") + payload
    command = 0x30 | qos << 1 | int(retain)
    return bytes([command]) + remaining_length(len(body)) + body


@pytest.fixture
def wired() -> Iterator[Wired]:
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    paho = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)  # type: ignore[attr-defined]
    received: list[tuple[str, bytes]] = []

    def sink(topic: str, payload: bytes | bytearray) -> None:
        received.append((topic, bytes(payload)))

    # As shared/mqtt.py `_deliver_to` wires it: paho's own deliveries to the sink too.
    paho.on_message = lambda client, userdata, message: sink(message.topic, message.payload)
    paho._sock = ours  # what paho holds once connected
    _PacketReads.install(paho, sink)
    yield paho, theirs, received
    ours.close()
    theirs.close()


def test_packets_split_anyhow_are_each_delivered_once(wired: Wired) -> None:
    paho, broker, received = wired
    sent = [(f"n/{i}/telemetry", bytes([i % 256]) * (i * 37 % 900)) for i in range(300)]
    stream = b"".join(
        publish_packet(topic, payload, retain=i % 7 == 0) for i, (topic, payload) in enumerate(sent)
    )
    # In pieces that cut packets anywhere (a remaining length included), each read as
    # the event loop would.
    for size in (5003, 1, 2, 3, 70_000):
        received.clear()
        for start in range(0, len(stream), size):
            broker.sendall(stream[start : start + size])
            assert paho.loop_read() == MQTTErrorCode.MQTT_ERR_SUCCESS
        assert received == sent


def test_a_packet_of_many_chunks_is_delivered_whole(wired: Wired) -> None:
    paho, broker, received = wired
    payload = bytes(range(256)) * 2000  # 512 kB: eight chunks
    packet = publish_packet("n/1/logs", payload)
    broker.setblocking(False)
    sent = 0
    while sent < len(packet):
        try:
            sent += broker.send(packet[sent:])
        except BlockingIOError:
            paho.loop_read()
    while not received:
        paho.loop_read()
    assert received == [("n/1/logs", payload)]


def test_a_wake_up_reads_a_bounded_amount_and_the_socket_keeps_the_rest(wired: Wired) -> None:
    paho, broker, received = wired
    payload = b"x" * 1000
    count = _PacketReads.MAX_CHUNKS * _PacketReads.CHUNK_BYTES // 1000 + 500
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


def test_qos1_messages_go_through_paho_which_acknowledges_them(wired: Wired) -> None:
    paho, broker, received = wired
    broker.sendall(
        publish_packet("n/1/telemetry", b"a")
        + publish_packet("n/1/status", b"birth", qos=1, retain=True)
        + publish_packet("n/1/telemetry", b"b")
        + bytes([0xD0, 0x00])  # PINGRESP, between messages
        + publish_packet("n/1/telemetry", b"c")
    )
    assert paho.loop_read() == MQTTErrorCode.MQTT_ERR_SUCCESS
    assert received == [
        ("n/1/telemetry", b"a"),
        ("n/1/status", b"birth"),
        ("n/1/telemetry", b"b"),
        ("n/1/telemetry", b"c"),
    ]
    # paho's PUBACK for message id 7: sent, or queued for the next write.
    queued = b"".join(bytes(p["packet"]) for p in paho._out_packet)
    broker.setblocking(False)
    try:
        written = broker.recv(100)
    except BlockingIOError:
        written = b""
    assert written + queued == b"\x40\x02\x00\x07"


def test_a_topic_that_is_not_utf8_is_delivered_for_ingestion_to_refuse(wired: Wired) -> None:
    paho, broker, received = wired
    broker.sendall(
        publish_packet(b"n/\xff/telemetry", b"x") + publish_packet("n/1/telemetry", b"y")
    )
    assert paho.loop_read() == MQTTErrorCode.MQTT_ERR_SUCCESS
    assert received == [("n/\ufffd/telemetry", b"x"), ("n/1/telemetry", b"y")]


@pytest.mark.parametrize(
    "stream",
    [
        bytes([0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x01]),  # a remaining length of five bytes
        bytes([0x30, 0x01, 0x00]),  # a PUBLISH too short for its topic's length
        bytes([0x00, 0x00]),  # no such packet type
    ],
)
def test_a_malformed_packet_ends_the_connection(wired: Wired, stream: bytes) -> None:
    paho, broker, received = wired
    broker.sendall(publish_packet("n/1/telemetry", b"ok") + stream)
    assert paho.loop_read() > 0
    assert paho._sock is None
    assert received == [("n/1/telemetry", b"ok")]


def test_a_closed_socket_is_a_lost_connection(wired: Wired) -> None:
    paho, broker, received = wired
    broker.sendall(publish_packet("n/1/telemetry", b"last"))
    broker.close()
    assert paho.loop_read() == MQTTErrorCode.MQTT_ERR_SUCCESS  # the message, then EOF
    assert paho.loop_read() == MQTTErrorCode.MQTT_ERR_CONN_LOST
    assert received == [("n/1/telemetry", b"last")]
    assert paho._sock is None
