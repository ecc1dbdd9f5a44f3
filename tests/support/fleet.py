"""Building agents and a cloud ingestion pipeline for integration tests.

Agents trust `TEST_SIGNING_KEY` unless told otherwise: a test that plays the control
plane publishes `signed(document)`; one with a real control plane hands its agents
that control plane's key (tests/support/control_plane.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiomqtt
import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from cloud.fleet.ingest import Ingestor
from cloud.fleet.registry import NodeRegistry
from edge.agent import Agent, NodeIdentity
from edge.agent.birth import ExecutionFacts
from edge.inference.options import InferenceOptions
from edge.training.runs import LauncherFactory, TrainingLauncher
from shared.desired_signature import public_key_base64, sign_desired
from shared.messages import DesiredState, JobLogChunk, NodeEvent, Site
from shared.mqtt import MqttSession
from shared.settings import AgentSettings, MqttSettings, parse_mqtt_url
from shared.tasks import stop_task
from shared.topics import Channel, Topics
from sim_devices.probes import SimulatedNode
from sim_devices.profiles import get_profile
from sim_devices.training import SimulatedLauncher

# The control plane's key as far as tests without a control plane are concerned.
TEST_SIGNING_KEY = Ed25519PrivateKey.generate()
TEST_PUBLIC_KEY = public_key_base64(TEST_SIGNING_KEY)


def signed(document: DesiredState, key: Ed25519PrivateKey = TEST_SIGNING_KEY) -> bytes:
    """The payload a control plane holding `key` would publish for `document`."""
    return sign_desired(document, key)


async def publish_desired(url: str, topic_root: str, desired: DesiredState) -> None:
    """Publish `desired`, signed with the test key, as the control plane would (retained)."""
    endpoint = parse_mqtt_url(url)
    async with aiomqtt.Client(endpoint.host, endpoint.port) as controller:
        await controller.publish(
            Topics(topic_root).node(desired.node_id, Channel.DESIRED),
            signed(desired),
            qos=1,
            retain=True,
        )


def mqtt_settings(url: str, topic_root: str, **changes: object) -> MqttSettings:
    base = MqttSettings(
        url=url, topic_root=topic_root, reconnect_initial_s=0.05, reconnect_max_s=0.5, keepalive_s=5
    )
    return msgspec.structs.replace(base, **changes)


def simulated_agent(
    node_id: str,
    settings: MqttSettings,
    profile: str = "jetson-orin-nano",
    *,
    site: Site = "edge",
    zone: str = "CA-ON",
    region: str = "northamerica-northeast2",
    telemetry_interval_s: float = 0.1,
    seed: int = 1,
    training_launcher: TrainingLauncher | LauncherFactory | None = None,
    trains: bool = False,
    inference: InferenceOptions | None = None,
    control_plane_public_key: str = TEST_PUBLIC_KEY,
    taints: tuple[str, ...] = (),
    state_dir: Path | None = None,
    simulated_nodes: dict[str, SimulatedNode] | None = None,
    execution: ExecutionFacts | None = None,
) -> Agent:
    """A real agent on simulated hardware; `trains` gives it simulated training workers;
    it applies `desired` documents signed with the key whose public half is given;
    `state_dir`: where it keeps its state (None: in memory only)."""
    node = SimulatedNode(node_id, get_profile(profile), random.Random(seed))
    if simulated_nodes is not None:
        simulated_nodes[node_id] = node  # so a test can make its devices fail
    if training_launcher is None and trains:
        training_launcher = SimulatedLauncher(node.accelerators)
    identity = NodeIdentity(
        node_id=node_id,
        site=site,
        zone=zone,
        region=region,
        labels={"test": "yes"},
        taints=AgentSettings(taints=taints).node_taints(),
    )
    return Agent(
        identity,
        node.probes(),
        settings,
        telemetry_interval_s=telemetry_interval_s,
        telemetry_jitter_ratio=0.0,
        rng=random.Random(seed),
        training_launcher=_factory(training_launcher),
        inference=inference,
        control_plane_public_key=control_plane_public_key,
        state_dir=state_dir,
        execution=execution,
    )


def _factory(launcher: TrainingLauncher | LauncherFactory | None) -> LauncherFactory | None:
    """What the agent takes: a launcher given as it is, or one made from the inventory."""
    if launcher is None or callable(launcher):
        return launcher
    return lambda _: launcher


@dataclass
class RunningCloud:
    registry: NodeRegistry
    ingestor: Ingestor
    session: MqttSession
    events: list[NodeEvent]
    logs: list[JobLogChunk]


@contextlib.asynccontextmanager
async def running_ingestion(settings: MqttSettings) -> AsyncIterator[RunningCloud]:
    """Registry + ingestion subscribed to the broker, as the cloud runs them."""
    registry = NodeRegistry()
    events: list[NodeEvent] = []
    logs: list[JobLogChunk] = []
    ingestor = Ingestor(
        registry,
        Topics(settings.topic_root),
        max_payload_bytes=settings.max_payload_bytes,
        invalid_log_interval_s=0,
        on_event=events.append,
        on_log=logs.append,
    )
    session = ingestor.session(settings, client_id=f"test-cloud-{random.getrandbits(32):x}")
    task = asyncio.create_task(ingestor.run(session))
    try:
        async with asyncio.timeout(10):
            await ingestor.subscribed.wait()
        yield RunningCloud(registry, ingestor, session, events, logs)
    finally:
        await stop_task(task)


@contextlib.asynccontextmanager
async def running(agent: Agent) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(agent.run())
    try:
        yield task
    finally:
        await stop_task(task)
