"""A real training node says in its birth how it contains work (issue 24): the agent
started as it is installed (`greenfed edge run`'s own code path, as root, with the
platform's tools) announces its isolation level, its cgroup limits, its container
runtime and the public half of the sealing key it keeps in its data directory; a node
told to run work unisolated says that, never more."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiomqtt
import pytest

from edge.main import run_agent
from edge.sandbox import cgroup_files, cgroups
from edge.sealing_key import load_or_create_sealing_key, sealing_key_path
from shared.messages import STATUS_DECODER, NodeStatus
from shared.sealing import public_key_text
from shared.settings import AgentSettings, MqttSettings, Settings, parse_mqtt_url
from shared.topics import Channel, Topics
from tests.support.brokers import BrokerUnderTest
from tests.support.sandboxed_node import TESTS_ROOT, require_isolation_tools

pytestmark = pytest.mark.timeout(60)


@contextlib.asynccontextmanager
async def running_agent(settings: Settings) -> AsyncIterator[None]:
    stop = asyncio.Event()
    task = asyncio.create_task(run_agent(settings, stop))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)


async def first_birth(url: str, topic: str) -> NodeStatus:
    endpoint = parse_mqtt_url(url)
    async with aiomqtt.Client(endpoint.host, endpoint.port) as client:
        await client.subscribe(topic, qos=1)
        async for message in client.messages:
            if isinstance(message.payload, bytes) and message.payload:
                status = STATUS_DECODER.decode(message.payload)
                if status.state == "online":
                    return status
    raise AssertionError("no birth")


@pytest.mark.parametrize("isolation", ["auto", "none"])
async def test_a_training_node_announces_how_it_isolates_work_and_its_sealing_key(
    broker: BrokerUnderTest, topic_root: str, isolation: str
) -> None:
    require_isolation_tools()
    TESTS_ROOT.mkdir(mode=0o755, exist_ok=True)
    root = TESTS_ROOT / f"birth-{uuid.uuid4().hex[:8]}"
    cgroup_root = f"greenfed-test-{root.name}"
    agent = AgentSettings(
        node_id="trainer-1",
        site="cloud",
        data_dir=str(root / "data"),
        probes=("cpu",),
        isolation=isolation,  # type: ignore[arg-type]
        cgroup_root=cgroup_root,
        telemetry_interval_s=0.2,
    )
    settings = Settings(mqtt=MqttSettings(url=broker.url, topic_root=topic_root), agent=agent)
    topic = Topics(topic_root).node("trainer-1", Channel.STATUS)
    try:
        births = asyncio.create_task(first_birth(broker.url, topic))
        async with running_agent(settings):
            status = await asyncio.wait_for(births, 30)
        key = load_or_create_sealing_key(sealing_key_path(agent))
        assert status.sealing_public_key == public_key_text(key)
        assert status.runs_training is True
        assert {"memory", "pids"} <= set(status.resource_limits)
        if isolation == "none":
            assert status.isolation == "none"
            assert "unisolated" in status.isolation_note
        else:
            assert status.isolation == "sandbox"
            assert "bubblewrap" in status.isolation_note
            if shutil.which("podman"):
                assert status.container_runtimes == ("podman",)
        # The data directory can be passed through, not listed; the key is the agent's.
        assert (root / "data").stat().st_mode & 0o777 == 0o711
        assert sealing_key_path(agent).stat().st_mode & 0o777 == 0o600
    finally:
        every = [str(m / cgroup_root) for m in _mounts()]
        cgroup_files.remove_groups(every)
        shutil.rmtree(root, ignore_errors=True)


def _mounts() -> tuple[Path, ...]:
    layout = cgroups.discover_layout()
    return layout.every_mount() if layout is not None else ()
