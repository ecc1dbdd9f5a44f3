"""A broker shut down cleanly is no crash of every node (issue 25). Mosquitto publishes
each client's will (keeping it, retained, with persistence on) and then closes every
connection, the control plane's too; the control plane blames those wills on the
broker (`offline_cause` "broker") whether they reach it just before its own connection
ends or after it is back, and once the agents are back too, each node's outage says
the broker's, and that the same agent kept running. The embedded broker, stopped the
same way, leaves no node crashed either.

On Mosquitto the agents reach the broker through a proxy held shut while it restarts,
so the control plane is back first and reads the kept wills: without that, which wills
reach it live depends on the order Mosquitto happens to close connections in."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cloud.app_keys import INGESTOR, REGISTRY
from cloud.fleet.registry import NodeRegistry
from greenfed.broker import EmbeddedBroker
from shared.settings import CloudSettings
from shared.tasks import stop_task
from tests.api.support import Api, running_api
from tests.store.databases import DatabaseUnderTest
from tests.support.brokers import DynamicSecurity, MosquittoProcess
from tests.support.control_plane import FAST_LOOP, RecordingLauncher, fleet
from tests.support.enrolled_fleet import CLOUD_USERNAME, enrol, join_token
from tests.support.fleet import mqtt_settings, simulated_agent
from tests.support.tcp_proxy import TcpProxy
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(90)
NODE_IDS = ["a100-0", "a100-1", "a100-2"]


def causes(registry: NodeRegistry, node_ids: list[str]) -> dict[str, str | None]:
    found = {node_id: registry.get(node_id) for node_id in node_ids}
    return {n: (r.offline_cause if r is not None else "unknown") for n, r in found.items()}


def heard_after(registry: NodeRegistry, node_ids: list[str], since_s: float) -> bool:
    """Every node online and heard from since `since_s` (registry monotonic)."""
    records = [registry.get(node_id) for node_id in node_ids]
    return all(
        r is not None and r.state == "online" and r.last_seen_monotonic > since_s for r in records
    )


@contextlib.asynccontextmanager
async def fleet_behind_a_proxy(
    database: DatabaseUnderTest, workdir: Path
) -> AsyncIterator[tuple[Api, MosquittoProcess, TcpProxy]]:
    """Mosquitto with dynamic security and persistence; the control plane on it
    directly; enrolled agents on simulated GPU servers through `TcpProxy`."""
    broker = MosquittoProcess(workdir, dynamic_security=DynamicSecurity(), persistence=True)
    await broker.start()
    proxy = TcpProxy("127.0.0.1", broker.port)
    await proxy.start()
    root = f"gfstop-{uuid.uuid4().hex[:8]}"
    password = secrets.token_urlsafe(16)
    tasks: list[asyncio.Task[None]] = []
    try:
        await broker.bootstrap_control_plane(CLOUD_USERNAME, password, root)
        cloud = CloudSettings(
            invalid_log_interval_s=0, broker_accounts="dynamic-security", require_enrolment=True
        )
        mqtt = mqtt_settings(broker.url, root, username=CLOUD_USERNAME, password=password)
        async with running_api(database, mqtt=mqtt, scheduling=FAST_LOOP, cloud=cloud) as api:
            token = await join_token(api, uses=len(NODE_IDS))
            for node_id in NODE_IDS:
                enrolment = await enrol(api, token, node_id)
                account = enrolment["mqtt"]
                agent = simulated_agent(
                    node_id,
                    mqtt_settings(
                        proxy.url, root, username=account["username"], password=account["password"]
                    ),
                    "a100-4x",
                    site="cloud",
                    zone="DE",
                    region="europe-west3",
                    telemetry_interval_s=0.2,
                    training_launcher=RecordingLauncher(node_id, "a100-4x"),
                    control_plane_public_key=enrolment["control_plane_public_key"],
                )
                tasks.append(asyncio.create_task(agent.run(), name=node_id))
            try:
                yield api, broker, proxy
            finally:
                for task in tasks:
                    await stop_task(task, timeout_s=10.0)
    finally:
        await proxy.stop()
        await broker.stop()


# The outage is the broker's; the store plays no part in it.
@pytest.mark.parametrize("database", ["sqlite"], indirect=True)
async def test_mosquitto_stopped_cleanly_is_the_brokers_outage_not_a_crash_of_every_node(
    database: DatabaseUnderTest, tmp_path: Path
) -> None:
    async with fleet_behind_a_proxy(database, tmp_path) as (api, broker, proxy):
        registry = api.app[REGISTRY]
        ingestor = api.app[INGESTOR]
        await eventually(lambda: heard_after(registry, NODE_IDS, 0.0), timeout_s=15)

        await broker.stop()  # SIGTERM: every will (kept), then every connection closed
        await proxy.unplug()  # the agents stay away until the control plane is back
        await eventually(lambda: not ingestor.subscribed.is_set(), timeout_s=10)
        assert "crashed" not in causes(registry, NODE_IDS).values()

        stopped_at_s = registry.monotonic()
        await broker.start()
        await eventually(
            lambda: (
                ingestor.subscribed.is_set()
                and set(causes(registry, NODE_IDS).values()) == {"broker"}
            ),
            timeout_s=20,
            message=lambda: f"causes: {causes(registry, NODE_IDS)}",
        )

        await proxy.plug()
        await eventually(
            lambda: heard_after(registry, NODE_IDS, stopped_at_s),
            timeout_s=30,
            message=lambda: f"not back: {causes(registry, NODE_IDS)}",
        )
        for node_id in NODE_IDS:
            record = registry.get(node_id)
            assert record is not None, node_id
            outage = record.last_outage
            assert outage is not None, node_id
            assert (outage.cause, outage.ended_by) == ("broker", "partition"), node_id


@pytest.mark.parametrize("database", ["sqlite"], indirect=True)
async def test_the_embedded_broker_stopped_cleanly_leaves_no_node_crashed(
    database: DatabaseUnderTest,
) -> None:
    broker = EmbeddedBroker(port=0)
    await broker.start()
    try:
        async with fleet(database, (broker.url, "broker-stop"), cloud_nodes=2) as running:
            registry = running.api.app[REGISTRY]
            ingestor = running.api.app[INGESTOR]
            node_ids = list(running.agents)
            await eventually(lambda: heard_after(registry, node_ids, 0.0), timeout_s=10)

            await broker.stop()
            await eventually(lambda: not ingestor.subscribed.is_set(), timeout_s=10)
            assert "crashed" not in causes(registry, node_ids).values()

            stopped_at_s = registry.monotonic()
            await broker.start()  # the same port: the agents and the control plane return
            await eventually(
                lambda: (
                    ingestor.subscribed.is_set() and heard_after(registry, node_ids, stopped_at_s)
                ),
                timeout_s=30,
            )
            for node_id in node_ids:
                record = registry.get(node_id)
                assert record is not None
                assert record.last_outage is None or record.last_outage.cause != "crashed"
    finally:
        await broker.stop()
