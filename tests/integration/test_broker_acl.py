"""deploy/mosquitto/greenfed.acl on a real Mosquitto: each agent writes only its own
channels (logs included) and reads only its own `desired`; the control plane reads
and writes everything. Third-party readers log in on a listener of their own
(greenfed-readers.acl): tests/deploy/test_acl_reader_rights.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiomqtt
import pytest

from tests.support.brokers import MosquittoProcess, make_password_file

pytestmark = pytest.mark.timeout(60)

ACL = Path(__file__).resolve().parents[2] / "deploy" / "mosquitto" / "greenfed.acl"
USERS = ("greenfed-cloud", "orin-1", "orin-2")


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[MosquittoProcess]:
    passwords = make_password_file(tmp_path, USERS[0], "pw", *((user, "pw") for user in USERS[1:]))
    mosquitto = MosquittoProcess(tmp_path, password_file=passwords, acl_file=ACL)
    await mosquitto.start()
    yield mosquitto
    await mosquitto.stop()


def client(broker: MosquittoProcess, user: str) -> aiomqtt.Client:
    return aiomqtt.Client("127.0.0.1", broker.port, username=user, password="pw", identifier=user)


async def collect(subscriber: aiomqtt.Client, until_topic: str) -> list[str]:
    """Topics received until (and including) `until_topic`: the sentinel that shows
    everything published before it by the same client has been delivered or dropped."""
    seen: list[str] = []
    async with asyncio.timeout(10):
        async for message in subscriber.messages:
            seen.append(message.topic.value)
            if message.topic.value == until_topic:
                return seen
    return seen


async def test_each_party_reads_and_writes_only_what_the_acl_allows(
    broker: MosquittoProcess,
) -> None:
    nodes = "greenfed/v1/nodes"
    async with (
        client(broker, "greenfed-cloud") as cloud,
        client(broker, "orin-1") as agent,
    ):
        await cloud.subscribe(f"{nodes}/#", qos=1)
        await agent.subscribe(f"{nodes}/+/desired", qos=1)

        # The control plane writes desired state; each agent reads only its own.
        await cloud.publish(f"{nodes}/orin-2/desired", b"{}", qos=1)
        await cloud.publish(f"{nodes}/orin-1/desired", b"{}", qos=1)
        assert await collect(agent, f"{nodes}/orin-1/desired") == [f"{nodes}/orin-1/desired"]

        # An agent writes its own channels, logs included, and no other node's.
        await agent.publish(f"{nodes}/orin-2/telemetry", b"{}", qos=1)  # impersonation
        await agent.publish(f"{nodes}/orin-1/desired", b"{}", qos=1)  # not its to write
        for channel in ("status", "reported", "events", "logs", "telemetry"):
            await agent.publish(f"{nodes}/orin-1/{channel}", b"{}", qos=1)
        received = await collect(cloud, f"{nodes}/orin-1/telemetry")
        assert f"{nodes}/orin-2/telemetry" not in received
        from_agent = [t for t in received if t.startswith(f"{nodes}/orin-1/")]
        assert [t.rsplit("/", 1)[1] for t in from_agent if not t.endswith("desired")] == [
            "status",
            "reported",
            "events",
            "logs",
            "telemetry",
        ]
        assert received.count(f"{nodes}/orin-1/desired") == 1  # the cloud's own, only


async def test_only_the_control_plane_writes_and_reads_replicas_digests(
    broker: MosquittoProcess,
) -> None:
    """Replicas share telemetry (`$share/...`, cloud/fleet/digest.py) under these ACLs:
    the cloud's shared subscription gets the samples, its digests reach its replicas,
    and a digest from an agent reaches no one (nor one from a reader:
    tests/deploy/test_acl_reader_rights.py)."""
    nodes, digest = "greenfed/v1/nodes", "greenfed/v1/cloud/telemetry-digest"
    async with (
        client(broker, "greenfed-cloud") as cloud,
        aiomqtt.Client(
            "127.0.0.1", broker.port, username="greenfed-cloud", password="pw", identifier="cloud-2"
        ) as replica,
        client(broker, "orin-1") as agent,
    ):
        await cloud.subscribe(f"$share/replicas/{nodes}/+/telemetry", qos=1)
        await replica.subscribe(digest, qos=1)
        await agent.subscribe(digest, qos=1)
        await agent.subscribe(f"{nodes}/orin-1/desired", qos=1)

        await agent.publish(f"{nodes}/orin-1/telemetry", b"{}", qos=1)
        assert await collect(cloud, f"{nodes}/orin-1/telemetry") == [f"{nodes}/orin-1/telemetry"]

        await agent.publish(digest, b"forged", qos=1)
        await cloud.publish(digest, b"real", qos=1)
        payloads: list[bytes] = []
        async with asyncio.timeout(10):
            async for message in replica.messages:
                assert isinstance(message.payload, bytes)
                payloads.append(message.payload)
                if message.payload == b"real":
                    break
        assert payloads == [b"real"]
        # The agent does not see the digests (a sentinel shows that everything before it
        # was delivered or dropped).
        await cloud.publish(f"{nodes}/orin-1/desired", b"{}", qos=1)
        assert await collect(agent, f"{nodes}/orin-1/desired") == [f"{nodes}/orin-1/desired"]
