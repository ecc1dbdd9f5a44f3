"""The embedded broker with accounts checks a login before it touches any session: amqtt
acted on a CONNECT first, so any client, refused or anonymous, that sent an agent's
client id deleted the agent's subscriptions (clean session: the agent, still connected,
got no more `desired` documents) or took over its session's username and will
(persistent session), and took its connection over."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import aiomqtt
import pytest

from cloud.broker_accounts.dynamic_security import DynamicSecurityAccounts
from cloud.broker_accounts.dynsec_protocol import node_client_id
from greenfed.broker import EmbeddedBroker
from shared.settings import MqttSettings, parse_mqtt_url
from shared.topics import Channel, Topics

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("clean_session", [True, False])
async def test_a_refused_login_with_an_agents_client_id_leaves_its_session_alone(
    tmp_path: Path, clean_session: bool
) -> None:
    async with EmbeddedBroker(
        port=0, accounts_file=tmp_path / "accounts.json", admin_password="admin-pw"
    ) as broker:
        root = f"gf{uuid.uuid4().hex[:8]}"
        admin = MqttSettings(
            url=broker.url, username="greenfed-cloud", password="admin-pw", topic_root=root
        )
        accounts = DynamicSecurityAccounts(admin, timeout_s=10)
        try:
            other = await accounts.provision("node-a")
            victim = await accounts.provision("node-b")
        finally:
            await accounts.close()
        topics = Topics(root)
        endpoint = parse_mqtt_url(broker.url)
        victim_id = node_client_id(topics, "node-b")
        desired = topics.node("node-b", Channel.DESIRED)
        async with (
            aiomqtt.Client(
                endpoint.host, endpoint.port, username="greenfed-cloud", password="admin-pw"
            ) as cloud,
            aiomqtt.Client(
                endpoint.host,
                endpoint.port,
                username=victim.username,
                password=victim.password,
                identifier=victim_id,
            ) as agent,
        ):
            await agent.subscribe(desired, qos=1)
            for username, password in (
                (other.username, other.password),  # another node's own account
                (None, None),  # anonymous
                (victim.username, "a wrong password"),
            ):
                intruder = aiomqtt.Client(
                    endpoint.host,
                    endpoint.port,
                    username=username,
                    password=password,
                    identifier=victim_id,
                    clean_session=clean_session,
                )
                with pytest.raises(aiomqtt.MqttError):
                    async with intruder:
                        pass
            await cloud.publish(desired, b"the agent's document", qos=1)
            async with asyncio.timeout(10):
                async for message in agent.messages:
                    assert message.payload == b"the agent's document"
                    break
            # Its session is still its own: it publishes on its channels as before.
            await agent.publish(topics.node("node-b", Channel.EVENTS), b"{}", qos=1)
