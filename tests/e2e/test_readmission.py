"""The store lost without a backup (docs/operations.md "Without a backup"), on the real
Mosquitto with its dynamic-security plugin: agents that enrolled with join tokens run a
job; the control plane's database is lost; a new control plane starts on an empty one,
with only its signing key file kept. Every node is refused as not enrolled, but each
proves the enrolment certificate it was given, so an admin re-admits them all with one
command: no device is visited, no agent restarted, no broker password changed. The job
the lost store knew of is stopped rather than left running unseen, and new work (with a
secret sealed to a re-admitted node's own key) runs on the fleet again. A birth copied
onto another node id by an operator's account is never re-admitted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import shutil
import uuid
from pathlib import Path

import aiomqtt
import msgspec
import pytest

from cloud.api.enrolment import ENROLMENT_STATE
from cloud.app_keys import REGISTRY
from edge.agent import Agent
from edge.enrolment_proof import EnrolmentProof
from shared.messages import STATUS_DECODER, encode
from shared.settings import CloudSettings, MqttSettings, parse_mqtt_url
from shared.tasks import stop_task
from shared.topics import Channel, Topics
from tests.api.support import Api, bearer, running_api
from tests.e2e.test_store_restore import empty_database_like, finished, greenfed, job
from tests.store.databases import DatabaseUnderTest
from tests.support.brokers import DynamicSecurity, MosquittoProcess
from tests.support.control_plane import FAST_LOOP, RecordingLauncher, reaches
from tests.support.enrolled_fleet import CLOUD_USERNAME, cloud_agent, join_token
from tests.support.fleet import mqtt_settings
from tests.support.waiting import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

NODES = ("a100-0", "a100-1", "a100-2")
SCHEDULING = msgspec.structs.replace(FAST_LOOP, node_lost_grace_s=5.0, startup_settle_s=0.3)
CLOUD = CloudSettings(
    invalid_log_interval_s=0, broker_accounts="dynamic-security", require_enrolment=True
)
SECRET = "sealed-to-a-readmitted-node"


async def enrolled_agent(
    api: Api, token: str, node_id: str, broker: MosquittoProcess, root: str
) -> tuple[Agent, RecordingLauncher, MqttSettings]:
    launcher = RecordingLauncher(node_id, "a100-4x")
    response = await api.client.post(
        "/v1/nodes/enrol",
        json={
            "token": token,
            "node_id": node_id,
            "site": "cloud",
            "zone": "DE",
            "region": "europe-west3",
            "sealing_public_key": launcher.execution.sealing_public_key,
        },
    )
    assert response.status == 200, await response.text()
    enrolment = await response.json()
    account = enrolment["mqtt"]
    own = mqtt_settings(
        broker.url, root, username=account["username"], password=account["password"]
    )
    proof = EnrolmentProof(enrolment["enrolment_certificate"], launcher.sealing_key)
    execution = dataclasses.replace(launcher.execution, enrolment=proof)
    agent = cloud_agent(node_id, own, enrolment["control_plane_public_key"], launcher, execution)
    return agent, launcher, own


def keep_signing_key(old_data_dir: Path, new_data_dir: Path) -> None:
    """The one file kept: the operator had no backup of the store."""
    new_data_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy2(old_data_dir / "desired-signing.key", new_data_dir / "desired-signing.key")


def online(api: Api, node_ids: tuple[str, ...]) -> bool:
    registry = api.app[REGISTRY]
    return all((r := registry.get(n)) is not None and r.state == "online" for n in node_ids)


async def copy_birth_to(cloud: MqttSettings, topics: Topics, source: str, target: str) -> None:
    """An operator's account (here the control plane's, which may write every topic)
    copies one node's retained birth onto another node id's topic."""
    endpoint = parse_mqtt_url(cloud.url)
    async with aiomqtt.Client(
        endpoint.host,
        endpoint.port,
        username=cloud.username,
        password=cloud.password,
        identifier=f"operator-{uuid.uuid4().hex[:8]}",
    ) as client:
        await client.subscribe(topics.node(source, Channel.STATUS), qos=1)
        async with asyncio.timeout(10):
            async for message in client.messages:
                assert isinstance(message.payload, bytes)
                status = STATUS_DECODER.decode(message.payload)
                break
        forged = msgspec.structs.replace(status, node_id=target)
        await client.publish(topics.node(target, Channel.STATUS), encode(forged), qos=1)


async def test_a_fleet_comes_back_to_a_control_plane_that_lost_its_store(
    database: DatabaseUnderTest, tmp_path: Path
) -> None:
    broker = MosquittoProcess(tmp_path, dynamic_security=DynamicSecurity())
    await broker.start()
    root = f"gfreadmit-{uuid.uuid4().hex[:8]}"
    password = secrets.token_urlsafe(16)
    tasks: dict[str, asyncio.Task[None]] = {}
    try:
        await broker.bootstrap_control_plane(CLOUD_USERNAME, password, root)
        cloud_mqtt = mqtt_settings(broker.url, root, username=CLOUD_USERNAME, password=password)
        agents: dict[str, Agent] = {}
        launchers: dict[str, RecordingLauncher] = {}
        async with running_api(
            database, mqtt=cloud_mqtt, scheduling=SCHEDULING, cloud=CLOUD
        ) as old:
            token = await join_token(old, uses=len(NODES))
            for node_id in NODES:
                agents[node_id], launchers[node_id], _ = await enrolled_agent(
                    old, token, node_id, broker, root
                )
                tasks[node_id] = asyncio.create_task(agents[node_id].run(), name=node_id)
            await eventually(lambda: online(old, NODES), timeout_s=15)
            tenant = await old.tenant("acme")
            lost_job = await old.submitted(tenant, job("lost-with-the-store"))
            body = await reaches(old, tenant, lost_job, "running")
            (busy,) = body["nodes"]
        (lost_run,) = [run for _, _, run in launchers[busy].runs]
        instances = {node_id: agent.instance_id for node_id, agent in agents.items()}

        # The database is gone; the signing key file was kept (docs/operations.md).
        async with empty_database_like(database, tmp_path) as empty:
            keep_signing_key(Path(database.settings.data_dir), Path(empty.settings.data_dir))
            async with running_api(
                empty, mqtt=cloud_mqtt, scheduling=SCHEDULING, cloud=CLOUD
            ) as new:
                topics = Topics(root)
                knocking = new.app[ENROLMENT_STATE].unenrolled
                await eventually(
                    lambda: {n.status.node_id for n in knocking.listing()} == set(NODES),
                    timeout_s=15,
                    message=lambda: f"knocking: {[n.status.node_id for n in knocking.listing()]}",
                )
                assert new.app[REGISTRY].nodes() == []  # every node refused meanwhile
                await copy_birth_to(cloud_mqtt, topics, NODES[0], "intruder")
                await eventually(lambda: knocking.unproven >= 1, timeout_s=10)

                api_url = str(new.client.make_url("")).rstrip("/")
                code = await greenfed(
                    "nodes",
                    "readmit",
                    "--all",
                    "--api",
                    api_url,
                    "--token",
                    new.admin_token,
                )
                assert code == 0
                await eventually(lambda: online(new, NODES), timeout_s=15)
                assert new.app[REGISTRY].get("intruder") is None
                # Nothing on the devices changed: the same agents, same instances.
                assert {n: a.instance_id for n, a in agents.items()} == instances
                assert all(not task.done() for task in tasks.values())

                # What only the lost store knew of is stopped, not left running unseen.
                await eventually(lambda: finished(lost_run), timeout_s=15)
                # New work runs on the re-admitted fleet, a secret sealed to its node's key.
                tenant = await new.tenant("acme")
                spec = {**job("after-readmission"), "secret_env": {"API_KEY": SECRET}}
                fresh = await new.submitted(tenant, spec)
                (node,) = (await reaches(new, tenant, fresh, "running", timeout_s=20))["nodes"]
                (environment,) = [
                    env for spec_, env, _ in launchers[node].runs if spec_.job_id == fresh
                ]
                assert environment["API_KEY"] == SECRET
                audit = await new.client.get(
                    "/v1/audit?action=node.readmit", headers=bearer(new.admin_token)
                )
                assert sorted(e["target"] for e in (await audit.json())["items"]) == list(NODES)
    finally:
        for task in tasks.values():
            await stop_task(task, timeout_s=10.0)
        await broker.stop()
