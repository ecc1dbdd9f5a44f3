"""What node accounts must guarantee, checked the same way on any broker that has them
(Mosquitto with its dynamic security plugin, the embedded broker with accounts)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import aiomqtt
import pytest
from aiomqtt.exceptions import MqttConnectError

from cloud.broker_accounts import BrokerAccountError, BrokerAccounts, NodeCredentials
from cloud.broker_accounts.dynamic_security import DynamicSecurityAccounts
from cloud.broker_accounts.dynsec_protocol import (
    COMMANDS_ENCODER,
    CONTROL_TOPIC,
    RESPONSE_TOPIC,
    Command,
    CommandBatch,
    node_client_id,
)
from shared.mqtt import is_auth_failure
from shared.settings import MqttSettings, parse_mqtt_url
from shared.topics import Channel, Topics

REFUSED_SUBSCRIPTION = 0x80


@dataclass(frozen=True)
class AccountsBroker:
    """A broker with accounts, and the control plane's own (admin) account on it."""

    admin: MqttSettings

    @property
    def topics(self) -> Topics:
        return Topics(self.admin.topic_root)

    def client(
        self, username: str | None, password: str | None, *, client_id: str = ""
    ) -> aiomqtt.Client:
        endpoint = parse_mqtt_url(self.admin.url)
        return aiomqtt.Client(
            endpoint.host,
            endpoint.port,
            username=username,
            password=password,
            identifier=client_id or None,
            timeout=10,
        )

    def admin_client(self) -> aiomqtt.Client:
        return self.client(self.admin.username, self.admin.password)

    def node_client(self, credentials: NodeCredentials) -> aiomqtt.Client:
        """As the account's holder connects (a node's agent, a telemetry reader): with
        the one client id the account takes."""
        client_id = credentials.client_id or node_client_id(self.topics, credentials.username)
        return self.client(credentials.username, credentials.password, client_id=client_id)


def _codes(granted: object) -> list[int]:
    assert isinstance(granted, tuple | list)
    return [int(code.value if hasattr(code, "value") else code) for code in granted]


async def collect_until(subscriber: aiomqtt.Client, sentinel_topic: str) -> list[str]:
    """Topics received up to and including `sentinel_topic`: a publisher's later message
    shows that everything it published earlier was delivered or dropped."""
    seen: list[str] = []
    async with asyncio.timeout(10):
        async for message in subscriber.messages:
            seen.append(message.topic.value)
            if message.topic.value == sentinel_topic:
                return seen
    return seen


async def assert_refused_login(
    broker: AccountsBroker, username: str | None, password: str | None
) -> None:
    with pytest.raises(MqttConnectError) as refused:
        async with broker.client(username, password):
            pass
    assert is_auth_failure(refused.value), refused.value


async def check_nodes_are_confined_to_their_own_topics(
    broker: AccountsBroker, accounts: BrokerAccounts
) -> None:
    topics = broker.topics
    node_a = await accounts.provision("node-a")
    node_b = await accounts.provision("node-b")
    assert node_a.username == "node-a"
    assert node_a.password
    assert node_a.password != node_b.password
    async with (
        broker.admin_client() as cloud,
        broker.node_client(node_a) as agent_a,
        broker.node_client(node_b) as agent_b,
    ):
        await cloud.subscribe(f"{topics.nodes_prefix}#", qos=1)
        await cloud.subscribe(topics.telemetry_digest, qos=1)
        await agent_b.subscribe(topics.node("node-b", Channel.DESIRED), qos=1)

        # Node a may not read b's desired, nor everything's, nor replicas' digests.
        for topic_filter in (
            topics.node("node-b", Channel.DESIRED),
            f"{topics.nodes_prefix}#",
            topics.telemetry_digest,
        ):
            assert _codes(await agent_a.subscribe(topic_filter, qos=1)) == [REFUSED_SUBSCRIPTION]
        assert _codes(await agent_a.subscribe(topics.node("node-a", Channel.DESIRED), qos=1)) == [1]

        # Node a may not speak for b, nor write desired state (its own included).
        await agent_a.publish(topics.node("node-b", Channel.STATUS), b"forged", qos=1)
        await agent_a.publish(topics.node("node-b", Channel.DESIRED), b"forged", qos=1)
        await agent_a.publish(topics.node("node-a", Channel.DESIRED), b"forged", qos=1)
        # Nor a replica's telemetry digest (cloud/fleet/digest.py).
        await agent_a.publish(topics.telemetry_digest, b"forged", qos=1)
        own_status = topics.node("node-a", Channel.STATUS)
        await agent_a.publish(own_status, b"real", qos=1)
        assert await collect_until(cloud, own_status) == [own_status]

        # The control plane writes both desired documents; each node gets only its own.
        await cloud.publish(topics.node("node-b", Channel.DESIRED), b"for-b", qos=1)
        own_desired = topics.node("node-a", Channel.DESIRED)
        await cloud.publish(own_desired, b"for-a", qos=1)
        assert await collect_until(agent_a, own_desired) == [own_desired]
        assert await collect_until(agent_b, topics.node("node-b", Channel.DESIRED))


async def _drain(client: aiomqtt.Client) -> None:
    async with asyncio.timeout(10):
        async for _ in client.messages:
            pass


async def check_revoke_drops_the_node_and_reprovision_restores_it(
    broker: AccountsBroker, accounts: BrokerAccounts
) -> None:
    first = await accounts.provision("node-r")
    async with broker.node_client(first) as agent:
        await agent.subscribe(broker.topics.node("node-r", Channel.DESIRED), qos=1)
        await accounts.revoke("node-r")
        with pytest.raises(aiomqtt.MqttError):  # the broker drops the connection at once
            await _drain(agent)
    await assert_refused_login(broker, first.username, first.password)
    await accounts.revoke("node-r")  # idempotent
    await accounts.revoke("never-provisioned")

    second = await accounts.provision("node-r")
    assert second.password != first.password
    async with broker.node_client(second) as agent:
        status = broker.topics.node("node-r", Channel.STATUS)
        await agent.publish(status, b"back", qos=1)
    await assert_refused_login(broker, first.username, first.password)


async def check_a_node_cannot_send_account_commands(
    broker: AccountsBroker, accounts: BrokerAccounts
) -> None:
    """A node's own login may not administer accounts: its commands go unanswered (the
    broker never says so) and change nothing. Another login without the admin role (a
    reader's: a node's account takes only its agent's client id) gets a timeout that
    says which role is missing."""
    node = await accounts.provision("node-n")
    forged = CommandBatch(
        (Command(command="createClient", username="node-y", password="anything"),)
    )
    own_status = broker.topics.node("node-n", Channel.STATUS)
    async with broker.admin_client() as cloud, broker.node_client(node) as agent:
        await cloud.subscribe(own_status, qos=1)
        await agent.publish(CONTROL_TOPIC, COMMANDS_ENCODER.encode(forged), qos=1)
        # Published after the command, on the same connection: the command was handled.
        await agent.publish(own_status, b"after", qos=1)
        assert await collect_until(cloud, own_status) == [own_status]
    await assert_refused_login(broker, "node-y", "anything")
    await _create_plain_account(broker, "plain-n", "plain-password")
    as_plain = DynamicSecurityAccounts(
        MqttSettings(
            url=broker.admin.url,
            username="plain-n",
            password="plain-password",
            topic_root=broker.admin.topic_root,
        ),
        timeout_s=2,
    )
    try:
        with pytest.raises(BrokerAccountError, match=r"did not answer.*admin role"):
            await as_plain.provision("node-y")
    finally:
        await as_plain.close()
    await assert_refused_login(broker, "node-y", "anything")


async def _create_plain_account(broker: AccountsBroker, username: str, password: str) -> None:
    """An account with no role and no client id bound (as an operator might make by
    hand), through the admin's own dynamic-security commands."""
    batch = CommandBatch(
        (
            Command(
                command="createClient",
                username=username,
                password=password,
                correlation_data=username,
            ),
        )
    )
    async with broker.admin_client() as admin:
        await admin.subscribe(RESPONSE_TOPIC, qos=1)
        await admin.publish(CONTROL_TOPIC, COMMANDS_ENCODER.encode(batch), qos=1)
        async with asyncio.timeout(10):
            async for message in admin.messages:
                if username.encode() in bytes(message.payload):
                    break
    async with broker.client(username, password):
        pass


async def check_a_telemetry_reader_reads_telemetry_and_births_only(
    broker: AccountsBroker, accounts: BrokerAccounts
) -> None:
    """A third party's account: every node's telemetry and births, never a `desired`
    document (nor anything else), and it can publish nothing."""
    topics = broker.topics
    node = await accounts.provision("node-t")
    reader = await accounts.provision_reader("grafana-agent")
    assert reader.username == "grafana-agent"
    assert reader.password
    telemetry = topics.node("node-t", Channel.TELEMETRY)
    status = topics.node("node-t", Channel.STATUS)
    desired = topics.node("node-t", Channel.DESIRED)
    async with (
        broker.admin_client() as cloud,
        broker.node_client(node) as agent,
        broker.node_client(reader) as subscriber,
    ):
        granted = await subscriber.subscribe(
            [
                (f"{topics.nodes_prefix}+/telemetry", 0),
                (f"{topics.nodes_prefix}+/status", 1),
                (f"{topics.nodes_prefix}+/desired", 1),
                (f"{topics.nodes_prefix}#", 1),
            ]
        )
        assert _codes(granted) == [0, 1, REFUSED_SUBSCRIPTION, REFUSED_SUBSCRIPTION]
        await cloud.publish(desired, b"secret plan", qos=1)
        await subscriber.publish(status, b"forged", qos=1)  # dropped: it publishes nothing
        await agent.publish(telemetry, b"sample", qos=0)
        await agent.publish(status, b"birth", qos=1)
        assert await collect_until(subscriber, status) == [telemetry, status]
    # Revoked: refused at once; provisioned again: a new password.
    await accounts.revoke_reader("grafana-agent")
    await assert_refused_login(broker, reader.username, reader.password)
    again = await accounts.provision_reader("grafana-agent")
    assert again.password != reader.password
    # A node's account, or the control plane's, is never turned into a reader's.
    for taken in ("node-t", broker.admin.username or ""):
        with pytest.raises(BrokerAccountError):
            await accounts.provision_reader(taken)


async def check_a_reader_cannot_take_an_agents_client_id(
    broker: AccountsBroker, accounts: BrokerAccounts
) -> None:
    """A broker disconnects the older of two connections with one client id: a
    telemetry reader (a third party's account) that could log in with an agent's client
    id could knock that agent offline again and again. It may use only its own."""
    node = await accounts.provision("node-k")
    reader = await accounts.provision_reader("dashboards")
    agents_id = node_client_id(broker.topics, node.username)
    status = broker.topics.node("node-k", Channel.STATUS)
    async with broker.admin_client() as cloud, broker.node_client(node) as agent:
        await cloud.subscribe(status, qos=1)
        with pytest.raises(MqttConnectError) as refused:
            async with broker.client(reader.username, reader.password, client_id=agents_id):
                pass
        assert is_auth_failure(refused.value), refused.value
        # The agent's session was never taken over: it still publishes.
        await agent.publish(status, b"still here", qos=1)
        assert await collect_until(cloud, status) == [status]
    # With its own client id the reader logs in.
    assert reader.client_id == broker.topics.reader_client_id("dashboards")
    async with broker.client(
        reader.username, reader.password, client_id=reader.client_id
    ) as subscriber:
        telemetry = f"{broker.topics.nodes_prefix}+/telemetry"
        assert _codes(await subscriber.subscribe(telemetry, 0)) == [0]
