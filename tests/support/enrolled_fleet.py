"""A fleet deployed the way issue 12 asks production to be: a private Mosquitto with
its dynamic security plugin, a control plane that provisions node accounts and admits
only enrolled nodes, and agents that enrolled over REST with a join token and connect
with their own credentials. The fault-injection tests run on it."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiomqtt

from cloud.app_keys import REGISTRY
from edge.agent import Agent
from edge.agent.birth import ExecutionFacts
from shared.settings import CloudSettings, MqttSettings, SchedulingSettings, parse_mqtt_url
from shared.tasks import stop_task
from shared.topics import Channel, Topics
from tests.api.support import Api, bearer, running_api
from tests.store.databases import DatabaseUnderTest
from tests.support.brokers import DynamicSecurity, MosquittoProcess
from tests.support.control_plane import FAST_LOOP, RecordingLauncher
from tests.support.fleet import mqtt_settings, simulated_agent

CLOUD_USERNAME = "greenfed-cloud"


@dataclass
class EnrolledNode:
    node_id: str
    mqtt: MqttSettings  # the node's own account
    public_key: str
    agent: Agent
    launcher: RecordingLauncher
    task: asyncio.Task[None] | None = None


@dataclass
class EnrolledFleet:
    api: Api
    broker: MosquittoProcess
    cloud_mqtt: MqttSettings  # the control plane's account (admin of accounts)
    nodes: dict[str, EnrolledNode] = field(default_factory=dict)

    @property
    def topics(self) -> Topics:
        return Topics(self.cloud_mqtt.topic_root)

    def start_agent(self, node_id: str) -> None:
        node = self.nodes[node_id]
        node.agent = cloud_agent(node_id, node.mqtt, node.public_key, node.launcher)
        node.task = asyncio.create_task(node.agent.run(), name=node_id)

    async def stop_agent(self, node_id: str) -> None:
        node = self.nodes[node_id]
        if node.task is not None:
            await stop_task(node.task, timeout_s=10.0)
            node.task = None

    def states(self) -> dict[str, str]:
        registry = self.api.app[REGISTRY]
        found = {node_id: registry.get(node_id) for node_id in self.nodes}
        return {node_id: (r.state if r else "unknown") for node_id, r in found.items()}

    async def retained_desired(self) -> dict[str, bytes]:
        """Every node's retained `desired` payload on the broker, read as the admin."""
        endpoint = parse_mqtt_url(self.cloud_mqtt.url)
        sentinel = f"{self.topics.root}/_sentinel/{uuid.uuid4().hex}"
        found: dict[str, bytes] = {}
        async with aiomqtt.Client(
            endpoint.host,
            endpoint.port,
            username=self.cloud_mqtt.username,
            password=self.cloud_mqtt.password,
        ) as client:
            await client.subscribe(self.topics.all_nodes(Channel.DESIRED), qos=1)
            await client.subscribe(sentinel, qos=1)
            await client.publish(sentinel, b"end", qos=1)
            async with asyncio.timeout(10):
                async for message in client.messages:
                    if message.topic.value == sentinel:
                        break
                    if isinstance(message.payload, bytes) and message.payload:
                        found[self.topics.parse(message.topic.value).node_id] = message.payload
        return found


def cloud_agent(
    node_id: str,
    settings: MqttSettings,
    public_key: str,
    launcher: RecordingLauncher,
    execution: ExecutionFacts | None = None,
) -> Agent:
    """A simulated 4-GPU cloud node in DE on its own account; `execution`: what its birth
    says of how it runs work (default: the launcher's)."""
    return simulated_agent(
        node_id,
        settings,
        "a100-4x",
        site="cloud",
        zone="DE",
        region="europe-west3",
        telemetry_interval_s=0.2,
        training_launcher=launcher,
        execution=execution or launcher.execution,
        control_plane_public_key=public_key,
    )


async def enrol(api: Api, token: str, node_id: str) -> dict[str, Any]:
    response = await api.client.post(
        "/v1/nodes/enrol", json={"token": token, "node_id": node_id, "site": "cloud"}
    )
    assert response.status == 200, await response.text()
    body = await response.json()
    assert isinstance(body, dict)
    return body


async def join_token(api: Api, uses: int) -> str:
    response = await api.client.post(
        "/v1/nodes/join-tokens", json={"uses": uses}, headers=bearer(api.admin_token)
    )
    assert response.status == 201, await response.text()
    token = (await response.json())["token"]
    assert isinstance(token, str)
    return token


@contextlib.asynccontextmanager
async def enrolled_fleet(
    database: DatabaseUnderTest,
    workdir: Path,
    *,
    cloud_nodes: int = 2,
    scheduling: SchedulingSettings = FAST_LOOP,
    extra_accounts: tuple[str, ...] = (),
) -> AsyncIterator[EnrolledFleet]:
    """`extra_accounts`: node ids enrolled (credentials in `nodes`) but not started."""
    broker = MosquittoProcess(workdir, dynamic_security=DynamicSecurity())
    await broker.start()
    root = f"gffault-{uuid.uuid4().hex[:8]}"
    password = secrets.token_urlsafe(16)
    try:
        await broker.bootstrap_control_plane(CLOUD_USERNAME, password, root)
        cloud_mqtt = mqtt_settings(broker.url, root, username=CLOUD_USERNAME, password=password)
        cloud = CloudSettings(
            invalid_log_interval_s=0,
            broker_accounts="dynamic-security",
            require_enrolment=True,
        )
        async with running_api(
            database, mqtt=cloud_mqtt, scheduling=scheduling, cloud=cloud
        ) as api:
            running = EnrolledFleet(api, broker, cloud_mqtt)
            node_ids = [f"a100-{index}" for index in range(cloud_nodes)]
            token = await join_token(api, uses=len(node_ids) + len(extra_accounts))
            for node_id in (*node_ids, *extra_accounts):
                enrolment = await enrol(api, token, node_id)
                account = enrolment["mqtt"]
                settings = mqtt_settings(
                    broker.url, root, username=account["username"], password=account["password"]
                )
                launcher = RecordingLauncher(node_id, "a100-4x")
                public_key = enrolment["control_plane_public_key"]
                running.nodes[node_id] = EnrolledNode(
                    node_id,
                    settings,
                    public_key,
                    cloud_agent(node_id, settings, public_key, launcher),
                    launcher,
                )
            try:
                for node_id in node_ids:
                    running.start_agent(node_id)
                async with asyncio.timeout(15):
                    await asyncio.gather(
                        *(running.nodes[n].agent.announced.wait() for n in node_ids)
                    )
                yield running
            finally:
                for node_id in list(running.nodes):
                    await running.stop_agent(node_id)
    finally:
        await broker.stop()
