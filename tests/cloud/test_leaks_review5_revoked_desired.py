"""A node the registry forgets (revoked, or no longer admitted) leaves the `desired`
publisher: its retained document is cleared once, is not put back on a broker
reconnect, and no newer generation of it goes out; the publisher keeps nothing of it.
Born again (enrolled anew), it gets its documents as any node does. An agent takes a
cleared `desired` as nothing to apply (cloud/loop/publisher.py `drop`)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path

import msgspec
import pytest

from cloud.app_keys import REGISTRY, SCHEDULER
from cloud.fleet.registry import NodeRegistry
from cloud.loop.publisher import DesiredPublisher
from shared.desired_signature import verify_desired
from shared.messages import DesiredState
from shared.tasks import stop_task
from shared.topics import Channel, Topics
from tests.api.support import Api, bearer
from tests.integration.test_agent_instance_binding import publish
from tests.integration.test_shared_ingestion import birth
from tests.integration.test_signed_desired import retained_desired
from tests.store.databases import DatabaseUnderTest
from tests.support.brokers import BrokerUnderTest, MosquittoProcess
from tests.support.control_plane import fleet, reaches, work
from tests.support.fleet import (
    TEST_SIGNING_KEY,
    mqtt_settings,
    running,
    signed,
    simulated_agent,
)
from tests.support.waiting import eventually, eventually_async

pytestmark = pytest.mark.timeout(90)


def document(node_id: str, generation: int) -> DesiredState:
    return DesiredState(node_id=node_id, generation=generation, issued_at=1.0, cluster_id="c1")


async def generations(url: str, root: str) -> dict[str, int]:
    """The generation of every retained `desired` document on the broker, by node."""
    public_key = TEST_SIGNING_KEY.public_key()
    return {
        node_id: verify_desired(payload, public_key).generation
        for node_id, payload in (await retained_desired(url, root)).items()
    }


def held(publisher: DesiredPublisher, node_id: str) -> list[str]:
    """What the publisher still keeps of a node (what a long-lived leader would leak)."""
    tables: dict[str, Mapping[str, object]] = {
        "latest": publisher._latest,
        "generations": publisher._generations,
        "published": publisher._published,
        "echoes": publisher._echoes,
        "queue": publisher._queue,
    }
    return [name for name, table in tables.items() if node_id in table]


async def test_a_forgotten_node_s_document_is_cleared_and_never_sent_again(
    tmp_path: Path,
) -> None:
    mosquitto = MosquittoProcess(tmp_path)  # no persistence: a restart loses what it held
    await mosquitto.start()
    settings = mqtt_settings(mosquitto.url, "forgotten")
    registry = NodeRegistry()
    for node_id in ("n1", "n2"):
        registry.apply_status(birth(node_id))
    publisher = DesiredPublisher(settings, signing_key=TEST_SIGNING_KEY, cluster_id="c1")
    publisher.follow_instances(registry)
    task = asyncio.create_task(publisher.run())
    try:
        await eventually(publisher.swept.is_set, timeout_s=10)
        publisher.submit(document("n1", 1))
        publisher.submit(document("n2", 1))
        await eventually(lambda: publisher.published_total == 2, timeout_s=10)
        assert await generations(mosquitto.url, "forgotten") == {"n1": 1, "n2": 1}

        assert registry.forget("n1")  # revoked
        retained: dict[str, int] = {}

        async def cleared() -> bool:
            # What the broker retains now (an update alone would keep what an earlier
            # look saw before the clearing publish arrived, and never pass).
            now = await generations(mosquitto.url, "forgotten")
            retained.clear()
            retained.update(now)
            return "n1" not in retained

        await eventually_async(cleared, timeout_s=10, message=lambda: f"retained: {retained}")
        # Its work was requeued: the store moved its generation on. Nothing to hand over.
        assert publisher.is_current("n1", 2)
        assert not publisher.republish("n1")
        await eventually(
            lambda: held(publisher, "n1") == [], message=lambda: str(held(publisher, "n1"))
        )

        await mosquitto.kill()
        await eventually(lambda: not publisher.connected.is_set(), timeout_s=10)
        await mosquitto.start()  # empty: every document of the publisher's goes out again
        await eventually(publisher.connected.is_set, timeout_s=15)
        await eventually(lambda: publisher.published_total == 3, timeout_s=10)
        assert await generations(mosquitto.url, "forgotten") == {"n2": 1}
        assert held(publisher, "n1") == []

        # Enrolled again: born anew, it is handed its documents as any node.
        registry.apply_status(msgspec.structs.replace(birth("n1"), instance_id="agent-2"))
        assert not publisher.is_current("n1", 2)
        publisher.submit(document("n1", 2))
        await eventually(lambda: publisher.published_total == 4, timeout_s=10)
        assert await generations(mosquitto.url, "forgotten") == {"n1": 2, "n2": 1}
    finally:
        await stop_task(task)
        await mosquitto.stop()


async def test_an_agent_takes_a_cleared_desired_as_nothing_to_apply(
    broker: BrokerUnderTest, topic_root: str
) -> None:
    settings = mqtt_settings(broker.url, topic_root)
    agent = simulated_agent("e1", settings)
    topic = Topics(topic_root).node("e1", Channel.DESIRED)
    async with running(agent):
        await publish(broker.url, topic, signed(document("e1", 1)))
        await eventually(lambda: agent.observed_generation == 1)
        await publish(broker.url, topic, b"")  # what the publisher sends a forgotten node
        await publish(broker.url, topic, signed(document("e1", 2)))
        await eventually(lambda: agent.observed_generation == 2)  # the clear came between
        assert agent.counters.desired_rejected == 0


async def test_revoking_a_node_with_work_clears_its_desired_for_good(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    url, root = mosquitto_root
    async with fleet(database, mosquitto_root, cloud_nodes=2) as running_fleet:
        api = running_fleet.api
        token = await api.tenant("acme")
        spec = {"name": "long", "command": ["python", "t.py"], "estimated_duration_s": 3600}
        job_id = await api.submitted(token, spec)
        placed = await reaches(api, token, job_id, "running")
        [node_id] = placed["nodes"]
        assert node_id in await retained_desired(url, root)

        headers = bearer(api.admin_token) | {"Greenfed-Confirm": "bulk"}
        response = await api.client.post(f"/v1/nodes/{node_id}/revoke", headers=headers)
        assert response.status == 200, await response.text()
        await running_fleet.stop_agent(node_id)
        # Its work goes elsewhere (the store moves the revoked node's generation on too).
        await eventually_async(
            lambda: _runs_elsewhere(api, token, job_id, node_id), timeout_s=30, interval_s=0.1
        )
        loop = api.app[SCHEDULER]
        passes = loop.stats.passes
        await eventually(lambda: loop.stats.passes >= passes + 2, timeout_s=10)
        assert api.app[REGISTRY].get(node_id) is None
        assert node_id not in await retained_desired(url, root)
        assert held(loop._publisher, node_id) == []


async def _runs_elsewhere(api: Api, token: str, job_id: str, node_id: str) -> bool:
    body = await work(api, token, job_id)
    return body["state"] == "running" and bool(body["nodes"]) and node_id not in body["nodes"]
