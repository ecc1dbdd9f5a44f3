"""The agent's side of births and replays (edge/agent/birth.py, edge/agent/desired.py),
on a real broker: an agent keeps its own birth on its `status`, and an agent that has
applied nothing from the broker yet applies only a `desired` document issued for its own
instance."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import aiomqtt
import msgspec
import pytest

from edge.agent import Agent
from shared.messages import STATUS_DECODER, DesiredState, DesiredTraining, NodeStatus, encode
from shared.settings import parse_mqtt_url
from shared.topics import Channel, Topics
from tests.support.brokers import BrokerUnderTest
from tests.support.fleet import mqtt_settings, running, signed, simulated_agent
from tests.support.waiting import eventually, eventually_async

pytestmark = pytest.mark.timeout(60)


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


async def publish(url: str, topic: str, payload: bytes) -> None:
    async with client_of(url) as client:
        await client.publish(topic, payload, qos=1, retain=True)


def own_birth_retained(url: str, topic: str, agent: Agent) -> Callable[[], object]:
    async def check() -> bool:
        payload = await retained(url, topic)
        if not payload:
            return False
        status: NodeStatus = STATUS_DECODER.decode(payload)
        return status.instance_id == agent.instance_id and status.state == "online"

    return check


def job(job_id: str) -> DesiredTraining:
    return DesiredTraining(job_id=job_id, command=("python", "t.py"), reference_duration_s=60.0)


def document(generation: int, for_instance: str | None, *jobs: str) -> DesiredState:
    return DesiredState(
        node_id="v100-1",
        generation=generation,
        issued_at=float(generation),
        cluster_id="c1",
        for_instance=for_instance,
        training=tuple(job(job_id) for job_id in jobs),
    )


def running_jobs(agent: Agent) -> set[str]:
    assert agent.training is not None
    return {entry.job_id for entry in agent.training.reported() if entry.state == "running"}


@pytest.mark.parametrize(
    "supersede",
    ["another instance's birth", "a copy of its own will", "a cleared status"],
)
async def test_an_agent_announces_itself_again_when_its_birth_is_superseded(
    broker: BrokerUnderTest, topic_root: str, supersede: str
) -> None:
    agent = simulated_agent("orin-7", mqtt_settings(broker.url, topic_root))
    topic = Topics(topic_root).node("orin-7", Channel.STATUS)
    async with running(agent):
        await eventually(lambda: agent.announced.is_set())
        check = own_birth_retained(broker.url, topic, agent)
        await eventually_async(check)  # type: ignore[arg-type]
        own = await retained(broker.url, topic)
        own_status: NodeStatus = STATUS_DECODER.decode(own)
        if supersede == "another instance's birth":
            payload = encode(msgspec.structs.replace(own_status, instance_id="forged"))
        elif supersede == "a copy of its own will":
            payload = encode(
                msgspec.structs.replace(
                    own_status, state="offline", offline_reason="connection-lost"
                )
            )
        else:
            payload = b""

        await publish(broker.url, topic, payload)

        await eventually(lambda: agent.counters.births_repeated >= 1)
        assert agent.counters.births_superseded >= 1
        await eventually_async(check)  # type: ignore[arg-type]
        assert agent.counters.births == 1  # one birth on connecting, the rest repeated


async def test_an_agent_that_applied_nothing_runs_only_a_document_issued_for_itself(
    broker: BrokerUnderTest, topic_root: str
) -> None:
    agent = simulated_agent("v100-1", mqtt_settings(broker.url, topic_root), "v100-8x", trains=True)
    topic = Topics(topic_root).node("v100-1", Channel.DESIRED)
    async with running(agent):
        await eventually(lambda: agent.announced.is_set())
        # Re-published by someone with broker access: the control plane's document of
        # before this agent's birth, with a job cancelled since.
        await publish(broker.url, topic, signed(document(7, "earlier-instance", "cancelled")))
        await eventually(lambda: agent.counters.desired_not_for_this_instance == 1)
        assert agent.observed_generation == 0

        # The control plane answers the birth: the current document, issued for it.
        await publish(broker.url, topic, signed(document(8, agent.instance_id, "current")))
        await eventually(lambda: running_jobs(agent) == {"current"})

        # Now it goes by generations: the replay is older, the newest applies whoever
        # it was issued for.
        await publish(broker.url, topic, signed(document(7, "earlier-instance", "cancelled")))
        await publish(broker.url, topic, signed(document(9, "earlier-instance", "current", "new")))
        await eventually(lambda: running_jobs(agent) == {"current", "new"})
        assert agent.observed_generation == 9


async def test_an_agent_that_applied_nothing_applies_an_unbound_document_of_an_old_control_plane(
    broker: BrokerUnderTest, topic_root: str
) -> None:
    agent = simulated_agent("v100-1", mqtt_settings(broker.url, topic_root), "v100-8x", trains=True)
    topic = Topics(topic_root).node("v100-1", Channel.DESIRED)
    async with running(agent):
        await eventually(lambda: agent.announced.is_set())
        await publish(broker.url, topic, signed(document(3, None, "old-control-plane")))
        await eventually(lambda: running_jobs(agent) == {"old-control-plane"})


async def test_once_it_has_seen_bound_documents_a_fresh_agent_ignores_unbound_ones(
    broker: BrokerUnderTest, topic_root: str
) -> None:
    agent = simulated_agent("v100-1", mqtt_settings(broker.url, topic_root), "v100-8x", trains=True)
    topic = Topics(topic_root).node("v100-1", Channel.DESIRED)
    async with running(agent):
        await eventually(lambda: agent.announced.is_set())
        await publish(broker.url, topic, signed(document(5, "earlier-instance")))
        await eventually(lambda: agent.counters.desired_not_for_this_instance == 1)
        # A document from before the control plane bound them, replayed.
        await publish(broker.url, topic, signed(document(4, None, "cancelled")))
        await eventually(lambda: agent.counters.desired_not_for_this_instance == 2)
        assert running_jobs(agent) == set()


async def test_an_agent_restored_from_disk_waits_for_a_document_issued_for_itself(
    broker: BrokerUnderTest, topic_root: str, tmp_path: Path
) -> None:
    """A newer document issued for the instance before may be a superseded one that
    someone re-published: the document on disk runs until the control plane answers this
    instance's birth; from then on newer documents apply whoever they were issued for."""
    settings = mqtt_settings(broker.url, topic_root)
    topic = Topics(topic_root).node("v100-1", Channel.DESIRED)
    first = simulated_agent("v100-1", settings, "v100-8x", trains=True, state_dir=tmp_path)
    async with running(first):
        await eventually(lambda: first.announced.is_set())
        await publish(broker.url, topic, signed(document(2, first.instance_id, "kept")))
        await eventually(lambda: running_jobs(first) == {"kept"})
    second = simulated_agent("v100-1", settings, "v100-8x", trains=True, state_dir=tmp_path)
    async with running(second):
        await eventually(lambda: second.observed_generation == 2)  # from disk
        await publish(broker.url, topic, signed(document(3, first.instance_id, "kept", "more")))
        await eventually(lambda: second.counters.desired_not_for_this_instance == 1)
        assert running_jobs(second) == {"kept"}

        await publish(broker.url, topic, signed(document(3, second.instance_id, "kept", "more")))
        await eventually(lambda: running_jobs(second) == {"kept", "more"})
        await publish(broker.url, topic, signed(document(4, first.instance_id, "more")))
        await eventually(lambda: running_jobs(second) == {"more"})
        assert second.counters.desired_not_for_this_instance == 1


async def test_an_unanswered_birth_is_announced_again(
    broker: BrokerUnderTest, topic_root: str
) -> None:
    """A document for another instance, and no answer for this one: the control plane may
    have missed the birth (its status topic was overwritten), so the agent says it again."""
    agent = simulated_agent("v100-1", mqtt_settings(broker.url, topic_root), "v100-8x", trains=True)
    topic = Topics(topic_root).node("v100-1", Channel.DESIRED)
    async with running(agent):
        await eventually(lambda: agent.announced.is_set())
        await publish(broker.url, topic, signed(document(5, "earlier-instance")))
        await eventually(lambda: agent.counters.births_repeated >= 1, timeout_s=15)
        repeated = agent.counters.births_repeated
        # Answered: no more.
        await publish(broker.url, topic, signed(document(5, agent.instance_id)))
        await eventually(lambda: agent.observed_generation == 5)
        assert agent.counters.births_repeated == repeated
