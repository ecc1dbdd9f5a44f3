"""What binds a node's broker account beyond its ACL role (cloud/broker_accounts/): it
connects only with its own agent's client id, so no other node's account can take the
agent's session over (the broker would drop the agent and publish its will, and the
control plane would mark the node offline); and it publishes only on its own channels,
nothing else below its own topics (which the broker would keep, if retained)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiomqtt
import msgspec
import pytest
from aiomqtt.exceptions import MqttConnectError

from cloud.broker_accounts.dynamic_security import DynamicSecurityAccounts
from cloud.broker_accounts.dynsec_protocol import (
    COMMANDS_ENCODER,
    NODE_CHANNELS,
    Command,
    CommandBatch,
    node_client_id,
)
from edge.doctor import check_broker
from greenfed.broker import EmbeddedBroker
from greenfed.embedded_accounts import EmbeddedAccounts
from shared.mqtt import is_auth_failure
from shared.settings import AgentSettings, MqttSettings, Settings, parse_mqtt_url
from shared.topics import Channel
from tests.support.broker_accounts import AccountsBroker, collect_until
from tests.support.brokers import DynamicSecurity, MosquittoProcess
from tests.support.fleet import mqtt_settings, running, simulated_agent

pytestmark = pytest.mark.timeout(60)

CLOUD_USER, CLOUD_PASSWORD = "greenfed-cloud", "cloud-password"


async def assert_refused(client: aiomqtt.Client) -> None:
    with pytest.raises(MqttConnectError) as refused:
        async with client:
            pass
    assert is_auth_failure(refused.value), refused.value


@pytest.fixture
async def mosquitto(tmp_path: Path) -> AsyncIterator[AccountsBroker]:
    process = MosquittoProcess(tmp_path, dynamic_security=DynamicSecurity())
    await process.start()
    root = f"gftest-{uuid.uuid4().hex[:12]}"
    await process.bootstrap_control_plane(CLOUD_USER, CLOUD_PASSWORD, root)
    yield AccountsBroker(
        MqttSettings(url=process.url, username=CLOUD_USER, password=CLOUD_PASSWORD, topic_root=root)
    )
    await process.stop()


@pytest.fixture
async def embedded(tmp_path: Path) -> AsyncIterator[AccountsBroker]:
    accounts_file = tmp_path / "broker-accounts.json"
    async with EmbeddedBroker(
        port=0, accounts_file=accounts_file, admin_password=CLOUD_PASSWORD
    ) as broker:
        yield AccountsBroker(
            MqttSettings(
                url=broker.url,
                username=CLOUD_USER,
                password=CLOUD_PASSWORD,
                topic_root=f"gftest-{uuid.uuid4().hex[:12]}",
            )
        )


@pytest.fixture(params=["mosquitto", "embedded"])
def broker(request: pytest.FixtureRequest) -> AccountsBroker:
    found: AccountsBroker = request.getfixturevalue(request.param)
    return found


@pytest.fixture
async def accounts(broker: AccountsBroker) -> AsyncIterator[DynamicSecurityAccounts]:
    accounts = DynamicSecurityAccounts(broker.admin, timeout_s=10)
    yield accounts
    await accounts.close()


async def test_a_nodes_account_cannot_take_another_nodes_session_over(
    mosquitto: AccountsBroker,
) -> None:
    """On Mosquitto with its dynamic security plugin: node a's credentials with node b's
    client id are refused, and node b stays connected (no will published)."""
    broker = mosquitto
    accounts = DynamicSecurityAccounts(broker.admin, timeout_s=10)
    try:
        node_a = await accounts.provision("node-a")
        node_b = await accounts.provision("node-b")
    finally:
        await accounts.close()
    status_b = broker.topics.node("node-b", Channel.STATUS)
    victim_id = node_client_id(broker.topics, "node-b")
    endpoint = parse_mqtt_url(broker.admin.url)
    victim = aiomqtt.Client(
        endpoint.host,
        endpoint.port,
        identifier=victim_id,
        username=node_b.username,
        password=node_b.password,
        will=aiomqtt.Will(status_b, b"will", qos=1, retain=True),
        timeout=10,
    )
    async with broker.admin_client() as cloud, victim:
        await cloud.subscribe(status_b, qos=1)
        await assert_refused(broker.client(node_a.username, node_a.password, client_id=victim_id))
        # Node b's connection is the same one: what it publishes now comes first, and
        # no will came before it.
        await victim.publish(status_b, b"still here", qos=1)
        async with asyncio.timeout(10):
            async for message in cloud.messages:
                assert message.payload == b"still here"
                break


async def test_a_provisioned_agent_connects_with_its_bound_client_id(
    mosquitto: AccountsBroker,
) -> None:
    """The client id the agent connects with (edge/agent/core.py) is the one bound."""
    broker = mosquitto
    accounts = DynamicSecurityAccounts(broker.admin, timeout_s=10)
    try:
        credentials = await accounts.provision("node-c")
    finally:
        await accounts.close()
    settings = mqtt_settings(
        broker.admin.url,
        broker.admin.topic_root,
        username=credentials.username,
        password=credentials.password,
    )
    agent = simulated_agent("node-c", settings)
    async with running(agent), asyncio.timeout(15):
        await agent.announced.wait()
    assert agent.session is not None
    assert agent.session.refused_credentials == 0


async def test_another_client_id_is_refused_on_either_broker(
    broker: AccountsBroker, accounts: DynamicSecurityAccounts
) -> None:
    node_a = await accounts.provision("node-a")
    await accounts.provision("node-b")
    for client_id in (node_client_id(broker.topics, "node-b"), "anything-else"):
        await assert_refused(broker.client(node_a.username, node_a.password, client_id=client_id))
    async with broker.node_client(node_a):
        pass
    # Provisioned again (a node enrolled again): still bound, to the same id.
    again = await accounts.provision("node-a")
    await assert_refused(broker.client(again.username, again.password, client_id="anything-else"))
    async with broker.node_client(again):
        pass


async def test_a_node_publishes_only_on_its_own_channels(
    broker: AccountsBroker, accounts: DynamicSecurityAccounts
) -> None:
    topics = broker.topics
    node = await accounts.provision("node-j")
    own = f"{topics.nodes_prefix}node-j"
    async with broker.admin_client() as cloud, broker.node_client(node) as agent:
        await cloud.subscribe(f"{own}/#", qos=1)
        for junk in (f"{own}/junk", f"{own}/status/extra", f"{own}/logs/x/y"):
            await agent.publish(junk, b"x" * 100, qos=1, retain=True)
        channels = [topics.node("node-j", channel) for channel in NODE_CHANNELS]
        for topic in channels:
            await agent.publish(topic, b"real", qos=1)
        assert await collect_until(cloud, channels[-1]) == channels
    assert set(NODE_CHANNELS) == {
        Channel.STATUS,
        Channel.TELEMETRY,
        Channel.REPORTED,
        Channel.EVENTS,
        Channel.LOGS,
    }


async def test_the_embedded_accounts_bind_a_client_id_as_mosquitto_does() -> None:
    table = EmbeddedAccounts(None, admin_username=CLOUD_USER, admin_password=CLOUD_PASSWORD)

    async def run(*commands: Command) -> None:
        outcome = await table.handle_commands(COMMANDS_ENCODER.encode(CommandBatch(commands)))
        assert b'"error"' not in outcome.reply, outcome.reply

    await run(Command(command="createClient", username="n1", password="pw", clientid="id-1"))
    assert await table.authenticate("n1", "pw", "id-1")
    assert not await table.authenticate("n1", "pw", "id-2")
    assert not await table.authenticate("n1", "pw", None)
    # An account made before client ids were bound: bound by modifyClient, "" unbinds.
    await run(Command(command="createClient", username="n2", password="pw"))
    assert await table.authenticate("n2", "pw", "whatever")
    await run(Command(command="modifyClient", username="n2", clientid="id-2"))
    assert not await table.authenticate("n2", "pw", "whatever")
    assert await table.authenticate("n2", "pw", "id-2")
    await run(Command(command="modifyClient", username="n2", clientid=""))
    assert await table.authenticate("n2", "pw", "whatever")
    # The admin is bound to nothing: the control plane runs several sessions.
    assert await table.authenticate(CLOUD_USER, CLOUD_PASSWORD, "any-id")


async def test_the_doctor_checks_a_bound_account_as_the_agent_only_while_it_is_stopped(
    broker: AccountsBroker, accounts: DynamicSecurityAccounts, tmp_path: Path
) -> None:
    """`greenfed edge doctor` logged in with a client id of its own, which a bound
    account refuses: its broker check failed on every node with the right password."""
    node = await accounts.provision("node-d")
    settings = Settings(
        mqtt=MqttSettings(
            url=broker.admin.url,
            username=node.username,
            password=node.password,
            topic_root=broker.admin.topic_root,
        ),
        agent=AgentSettings(node_id="node-d", data_dir=str(tmp_path / "data")),
    )
    assert (await check_broker(settings, agent_runs=lambda: False)).verdict == "ok"
    # Beside a running agent it never takes the agent's session over: it says why not.
    beside = await check_broker(settings, agent_runs=lambda: True)
    assert beside.verdict == "skip"
    assert "running agent" in beside.detail
    wrong = msgspec.structs.replace(
        settings, mqtt=msgspec.structs.replace(settings.mqtt, password="wrong")
    )
    assert (await check_broker(wrong, agent_runs=lambda: False)).verdict == "FAIL"
