"""A will is a publish like any other: a broker with accounts sends it only where the
account may publish. A node account that registers a retained will on another node's
status or desired document (or a reader on any topic) and then drops its connection,
or connects again with its client id to end the old connection at once, publishes
nothing. Mosquitto with its dynamic security plugin is the reference (it accepts the
CONNECT and checks the will against the ACLs when it would send it); the embedded broker
(`greenfed up`) must agree.

The clients are raw sockets: a connection that ends without DISCONNECT is what fires a
will, and no MQTT library ends one that way on purpose."""

from __future__ import annotations

import asyncio
import struct
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cloud.broker_accounts import NodeCredentials
from cloud.broker_accounts.dynamic_security import DynamicSecurityAccounts
from cloud.broker_accounts.dynsec_protocol import node_client_id
from greenfed.broker import EmbeddedBroker
from shared.settings import MqttSettings, parse_mqtt_url
from shared.topics import Channel
from tests.support.broker_accounts import AccountsBroker, collect_until
from tests.support.brokers import DynamicSecurity, MosquittoProcess

pytestmark = pytest.mark.timeout(60)

CLOUD_USER, CLOUD_PASSWORD = "greenfed-cloud", "cloud-password"
CONNACK_ACCEPTED = b"\x20\x02\x00\x00"
WAIT_S = 10.0


@pytest.fixture(params=["embedded", "mosquitto-dynsec"])
async def accounts_broker(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[AccountsBroker]:
    root = f"gftest-{uuid.uuid4().hex[:12]}"
    if request.param == "embedded":
        async with EmbeddedBroker(
            port=0, accounts_file=tmp_path / "broker-accounts.json", admin_password=CLOUD_PASSWORD
        ) as embedded:
            yield AccountsBroker(
                MqttSettings(
                    url=embedded.url, username=CLOUD_USER, password=CLOUD_PASSWORD, topic_root=root
                )
            )
        return
    mosquitto = MosquittoProcess(tmp_path, dynamic_security=DynamicSecurity())
    await mosquitto.start()
    try:
        await mosquitto.bootstrap_control_plane(CLOUD_USER, CLOUD_PASSWORD, root)
        yield AccountsBroker(
            MqttSettings(
                url=mosquitto.url, username=CLOUD_USER, password=CLOUD_PASSWORD, topic_root=root
            )
        )
    finally:
        await mosquitto.stop()


@pytest.fixture
async def accounts(accounts_broker: AccountsBroker) -> AsyncIterator[DynamicSecurityAccounts]:
    accounts = DynamicSecurityAccounts(accounts_broker.admin, timeout_s=10)
    yield accounts
    await accounts.close()


def _string(value: bytes) -> bytes:
    return struct.pack("!H", len(value)) + value


def _remaining_length(length: int) -> bytes:
    encoded = bytearray()
    while True:
        digit, length = length % 128, length // 128
        encoded.append(digit | (0x80 if length else 0))
        if not length:
            return bytes(encoded)


def _connect_packet(client_id: str, username: str, password: str, will_topic: str | None) -> bytes:
    """A clean-session CONNECT with a login and, given a topic, a retained QoS 1 will."""
    flags = 0x80 | 0x40 | 0x02  # username, password, clean session
    will = b""
    if will_topic is not None:
        flags |= 0x20 | 0x08 | 0x04  # will retain, will QoS 1, will
        will = _string(will_topic.encode()) + _string(b"will of " + username.encode())
    header = _string(b"MQTT") + bytes([4, flags]) + struct.pack("!H", 60)
    body = (
        header
        + _string(client_id.encode())
        + will
        + _string(username.encode())
        + _string(password.encode())
    )
    return b"\x10" + _remaining_length(len(body)) + body


class _RawClient:
    """One account's connections, all with its one client id."""

    def __init__(self, broker: AccountsBroker, credentials: NodeCredentials) -> None:
        self._endpoint = parse_mqtt_url(broker.admin.url)
        self._client_id = credentials.client_id or node_client_id(
            broker.topics, credentials.username
        )
        assert credentials.password is not None
        self._login = (credentials.username, credentials.password)

    async def connect(self, will_topic: str | None) -> asyncio.StreamWriter:
        """Connected and accepted. A broker answers a CONNECT with a client id in use only
        after it has ended the connection that had it and sent (or dropped) its will."""
        reader, writer = await asyncio.open_connection(self._endpoint.host, self._endpoint.port)
        writer.write(_connect_packet(self._client_id, *self._login, will_topic))
        async with asyncio.timeout(WAIT_S):
            assert await reader.readexactly(4) == CONNACK_ACCEPTED
        return writer

    async def connect_and_drop(self, will_topic: str | None) -> None:
        """Connect, then end the connection without DISCONNECT: the will is due."""
        (await self.connect(will_topic)).transport.abort()


async def _retained(broker: AccountsBroker) -> list[str]:
    """The topics a new subscriber to everything gets retained messages on."""
    sentinel = f"{broker.admin.topic_root}/test-sentinel"
    async with broker.admin_client() as late:
        await late.subscribe(f"{broker.admin.topic_root}/#", qos=1)
        await late.publish(sentinel, b"end", qos=1)
        return [topic for topic in await collect_until(late, sentinel) if topic != sentinel]


async def test_a_will_on_a_topic_the_account_may_not_publish_is_never_sent(
    accounts_broker: AccountsBroker, accounts: DynamicSecurityAccounts
) -> None:
    broker, topics = accounts_broker, accounts_broker.topics
    node_a = _RawClient(broker, await accounts.provision("node-a"))
    await accounts.provision("node-b")
    reader = _RawClient(broker, await accounts.provision_reader("dash"))
    forged_by_node = [
        topics.node("node-b", Channel.STATUS),
        topics.node("node-b", Channel.REPORTED),
        topics.node("node-b", Channel.DESIRED),
        topics.node("node-a", Channel.DESIRED),
        topics.telemetry_digest,
        topics.node("node-made-up", Channel.STATUS),
    ]
    own_status = topics.node("node-a", Channel.STATUS)
    async with broker.admin_client() as cloud:
        await cloud.subscribe(f"{broker.admin.topic_root}/#", qos=1)
        await reader.connect_and_drop(topics.node("node-c", Channel.STATUS))
        await reader.connect_and_drop(None)
        for will_topic in forged_by_node:
            await node_a.connect_and_drop(will_topic)
        # The node's own offline will goes out: the end of what the cloud can get.
        await node_a.connect_and_drop(own_status)
        assert await collect_until(cloud, own_status) == [own_status]
    assert await _retained(broker) == [own_status]


async def test_a_new_connection_does_not_send_the_old_ones_forbidden_will(
    accounts_broker: AccountsBroker, accounts: DynamicSecurityAccounts
) -> None:
    """Reconnecting with its client id ends a connection at once, will first: without
    the check that made a publish-anywhere, no waiting for a keep-alive."""
    broker, topics = accounts_broker, accounts_broker.topics
    node_a = _RawClient(broker, await accounts.provision("node-a"))
    await accounts.provision("node-b")
    own_status = topics.node("node-a", Channel.STATUS)
    async with broker.admin_client() as cloud:
        await cloud.subscribe(f"{broker.admin.topic_root}/#", qos=1)
        forging = await node_a.connect(topics.node("node-b", Channel.STATUS))
        try:
            taking_over = await node_a.connect(own_status)
            taking_over.transport.abort()
        finally:
            forging.transport.abort()
        assert await collect_until(cloud, own_status) == [own_status]
    assert await _retained(broker) == [own_status]
