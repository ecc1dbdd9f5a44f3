"""Signed `desired` on the real broker: whoever can publish there (a stolen node
credential, a compromised broker, any local process on an anonymous one) starts
nothing; a forged generation locks nobody out; and after a store reset (new database,
same key, same broker holding the old cluster's retained documents) new work runs and
the old documents are cleared."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiomqtt
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from cloud.app_keys import REGISTRY
from cloud.loop.publisher import CLUSTER_ID_SECRET, DesiredPublisher
from cloud.loop.signing import load_or_create_signing_key
from shared.desired_signature import load_public_key, verify_desired
from shared.messages import DESIRED_DECODER, DesiredState, DesiredTraining, NodeEvent, encode
from shared.settings import CloudSettings, Settings, parse_mqtt_url
from shared.tasks import stop_task
from shared.topics import Channel, Topics
from tests.api.support import running_api
from tests.store.databases import DatabaseUnderTest, postgres_database, sqlite_database
from tests.support.brokers import BrokerUnderTest
from tests.support.control_plane import (
    FAST_LOOP,
    RecordingLauncher,
    control_plane_public_key,
    reaches,
)
from tests.support.fleet import (
    TEST_SIGNING_KEY,
    mqtt_settings,
    running,
    running_ingestion,
    signed,
    simulated_agent,
)
from tests.support.launchers import plain_launchers
from tests.support.waiting import eventually, eventually_async

pytestmark = pytest.mark.timeout(90)


def writes_file(path: Path) -> tuple[str, ...]:
    return (sys.executable, "-c", f"open({str(path)!r}, 'w').write('ran')")


async def publish(url: str, topic: str, payload: bytes) -> None:
    endpoint = parse_mqtt_url(url)
    async with aiomqtt.Client(endpoint.host, endpoint.port) as client:
        await client.publish(topic, payload, qos=1, retain=True)


async def retained_desired(url: str, root: str) -> dict[str, bytes]:
    """Every retained `desired` payload on the broker, by node. The broker sends a new
    subscription's retained messages first, in order, so a marker published after
    subscribing arrives after the last of them."""
    endpoint = parse_mqtt_url(url)
    marker = f"{root}/test-marker/{uuid.uuid4().hex}"
    found: dict[str, bytes] = {}
    topics = Topics(root)
    async with aiomqtt.Client(endpoint.host, endpoint.port) as client:
        await client.subscribe(topics.all_nodes(Channel.DESIRED), qos=1)
        await client.subscribe(marker, qos=1)
        await client.publish(marker, b"end", qos=1)
        async with asyncio.timeout(10):
            async for message in client.messages:
                if message.topic.value == marker:
                    return found
                assert isinstance(message.payload, bytes)
                if message.retain and message.payload:
                    found[topics.parse(message.topic.value).node_id] = message.payload
    raise AssertionError("unreachable")


async def test_unsigned_and_forged_documents_start_no_process_and_lock_nobody_out(
    broker: BrokerUnderTest, topic_root: str, tmp_path: Path
) -> None:
    settings = mqtt_settings(broker.url, topic_root)
    agent = simulated_agent(
        "v100-9",
        settings,
        "v100-8x",
        site="cloud",
        training_launcher=plain_launchers(tmp_path),
    )
    topic = Topics(topic_root).node("v100-9", Channel.DESIRED)
    attack = tmp_path / "attacker-ran"
    legit = tmp_path / "control-plane-ran"

    def desired(generation: int, marker: Path) -> DesiredState:
        worker = DesiredTraining(job_id=f"job-{generation}", command=writes_file(marker))
        return DesiredState(
            node_id="v100-9",
            generation=generation,
            issued_at=float(generation),
            cluster_id="c1",
            training=(worker,),
        )

    async with running_ingestion(settings) as cloud, running(agent):
        await eventually(lambda: cloud.registry.get("v100-9") is not None)
        # Unsigned (as every document was before 1.3), then signed by another key with a
        # generation meant to make the agent ignore the control plane for good.
        await publish(broker.url, topic, encode(desired(5, attack)))
        await publish(
            broker.url, topic, signed(desired(999999, attack), Ed25519PrivateKey.generate())
        )
        await eventually(lambda: agent.counters.desired_rejected == 2)
        # Then the control plane's own document, generation 1: applied.
        await publish(broker.url, topic, signed(desired(1, legit)))
        await eventually(lambda: legit.exists(), timeout_s=20)
        assert agent.observed_generation == 1
        assert not attack.exists()
        assert agent.training is not None
        assert {entry.job_id for entry in agent.training.reported()} == {"job-1"}

        rejections = rejected_events(cloud.events)
        await eventually(lambda: len(rejections()) == 2)
        assert [detail.split(":")[0] for detail in rejections()] == ["unsigned", "bad-signature"]
        assert agent.counters.desired_received == 1


def rejected_events(events: list[NodeEvent]) -> Callable[[], list[str]]:
    """The details of the `desired-rejected` events received so far, when called."""
    return lambda: [event.detail for event in events if event.kind == "desired-rejected"]


async def test_an_agent_without_the_public_key_applies_nothing_and_says_so(
    broker: BrokerUnderTest, topic_root: str, tmp_path: Path
) -> None:
    settings = mqtt_settings(broker.url, topic_root)
    agent = simulated_agent(
        "orin-unenrolled",
        settings,
        site="cloud",
        training_launcher=plain_launchers(tmp_path),
        control_plane_public_key="",
    )
    marker = tmp_path / "ran"
    document = DesiredState(
        node_id="orin-unenrolled",
        generation=1,
        issued_at=1.0,
        training=(DesiredTraining(job_id="j", command=writes_file(marker)),),
    )
    async with running_ingestion(settings) as cloud, running(agent):
        await eventually(lambda: cloud.registry.get("orin-unenrolled") is not None)
        topic = Topics(topic_root).node("orin-unenrolled", Channel.DESIRED)
        await publish(broker.url, topic, signed(document, TEST_SIGNING_KEY))
        await eventually(lambda: agent.counters.desired_rejected == 1)
        rejections = rejected_events(cloud.events)
        await eventually(lambda: len(rejections()) == 1)
        assert "enrol" in rejections()[0]
        assert agent.observed_generation == 0
        assert not marker.exists()


@contextlib.asynccontextmanager
async def another_database(
    database: DatabaseUnderTest, tmp_path: Path
) -> AsyncIterator[DatabaseUnderTest]:
    """A new, empty database of the same backend: a store reset."""
    if database.kind == "sqlite":
        yield sqlite_database(tmp_path / "reset")
        return
    async with postgres_database(tmp_path / "reset") as fresh:
        yield fresh


async def test_after_a_store_reset_new_work_runs_and_the_old_cluster_s_documents_are_cleared(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str], tmp_path: Path
) -> None:
    url, root = mosquitto_root
    settings = mqtt_settings(url, root)
    cloud = CloudSettings(
        invalid_log_interval_s=0, signing_key_file=str(tmp_path / "keys" / "desired.key")
    )
    key = control_plane_public_key(database, cloud)
    launcher = RecordingLauncher("a100-0", "a100-4x")
    agent = simulated_agent(
        "a100-0",
        settings,
        "a100-4x",
        site="cloud",
        zone="DE",
        region="europe-west3",
        telemetry_interval_s=0.2,
        training_launcher=launcher,
        control_plane_public_key=key,
    )
    topics = Topics(root)
    job = {"name": "old", "command": ["python", "train.py"], "estimated_duration_s": 600.0}
    async with running(agent):
        await asyncio.wait_for(agent.announced.wait(), 15)
        async with running_api(database, mqtt=settings, scheduling=FAST_LOOP, cloud=cloud) as api:
            old_cluster = await api.store.shared_secret(CLUSTER_ID_SECRET)
            token = await api.tenant("acme")
            # Work of the first cluster, with a generation the new one will not reach soon.
            for index in range(3):
                old_job = await api.submitted(token, job | {"name": f"old-{index}"})
                await reaches(api, token, old_job, "running")
            old_generation = agent.observed_generation
            assert old_generation >= 3
        # Documents nobody will republish: a vanished node of the old cluster, an unsigned
        # one (what any local process could leave on an anonymous broker), a forged one.
        old_document = DESIRED_DECODER.decode((await retained_desired(url, root))["a100-0"])
        assert old_document.cluster_id == old_cluster
        our_key = load_or_create_signing_key(Settings(store=database.settings, cloud=cloud))
        ghosts: dict[str, Callable[[DesiredState], bytes]] = {
            "gone-1": lambda d: signed(d, our_key),
            "gone-2": encode,
            "gone-3": lambda d: signed(d, Ed25519PrivateKey.generate()),
        }
        for node_id, payload in ghosts.items():
            ghost = DesiredState(
                node_id=node_id, generation=40, issued_at=1.0, cluster_id=old_cluster
            )
            await publish(url, topics.node(node_id, Channel.DESIRED), payload(ghost))
        assert set(await retained_desired(url, root)) == {"a100-0", *ghosts}

        async with (
            another_database(database, tmp_path) as fresh,
            running_api(fresh, mqtt=settings, scheduling=FAST_LOOP, cloud=cloud) as api,
        ):
            new_cluster = await api.store.shared_secret(CLUSTER_ID_SECRET)
            assert new_cluster != old_cluster

            async def swept() -> bool:
                """The ghosts cleared; the node still on the old cluster's work given a first
                document of the new one at once (cloud/loop/generations.py)."""
                retained = await retained_desired(url, root)
                return set(retained) == {"a100-0"} and (
                    DESIRED_DECODER.decode(retained["a100-0"]).cluster_id == new_cluster
                )

            await eventually_async(swept, timeout_s=20)
            token = await api.tenant("acme")
            new_job = await api.submitted(token, job | {"name": "new"})
            body = await reaches(api, token, new_job, "running")
            assert body["nodes"] == ["a100-0"]
            # The agent adopted the new cluster and its (lower) generation sequence: only
            # the new work is wanted now.
            assert agent.observed_generation < old_generation
            assert agent.training is not None
            assert {entry.job_id for entry in agent.training.reported()} == {new_job}
            old_runs = [run for spec, _, run in launcher.runs if spec.job_id != new_job]
            assert len(old_runs) == 3
            await eventually(lambda: all(run.status.finished for run in old_runs))
            retained = await retained_desired(url, root)
            assert set(retained) == {"a100-0"}
            document = verify_desired(retained["a100-0"], load_public_key(key))
            assert document.cluster_id == new_cluster
            # Its report names the cluster it observes, so the control plane counts it.
            record = api.app[REGISTRY].get("a100-0")
            assert record is not None
            assert record.reported is not None
            assert record.reported.cluster_id == new_cluster


async def test_the_sweep_clears_what_is_not_ours_and_keeps_what_is(
    broker: BrokerUnderTest, topic_root: str
) -> None:
    """On its first connection the publisher clears retained documents of another
    cluster, unsigned or forged, except where it holds a newer document of its own."""
    key = Ed25519PrivateKey.generate()
    topics = Topics(topic_root)
    retained_before = {
        "replaced": signed(DesiredState(node_id="replaced", generation=9, issued_at=1.0), key),
        "old-cluster": signed(
            DesiredState(node_id="old-cluster", generation=9, issued_at=1.0, cluster_id="c1"), key
        ),
        "unsigned": encode(DesiredState(node_id="unsigned", generation=9, issued_at=1.0)),
        "forged": signed(
            DesiredState(node_id="forged", generation=9, issued_at=1.0, cluster_id="c2"),
            Ed25519PrivateKey.generate(),
        ),
        "ours": signed(
            DesiredState(node_id="ours", generation=9, issued_at=1.0, cluster_id="c2"), key
        ),
    }
    for node_id, payload in retained_before.items():
        await publish(broker.url, topics.node(node_id, Channel.DESIRED), payload)
    publisher = DesiredPublisher(
        mqtt_settings(broker.url, topic_root), signing_key=key, cluster_id="c2", sweep_quiet_s=0.3
    )
    publisher.submit(DesiredState(node_id="replaced", generation=1, issued_at=2.0, cluster_id="c2"))
    task = asyncio.create_task(publisher.run())
    try:
        await asyncio.wait_for(publisher.swept.wait(), 20)
        # A retained document the broker hands over after a quiet spell (a loaded machine)
        # is judged when it comes: what lasts is what is cleared, not when.
        await eventually(
            lambda: publisher.stale_cleared_total == 3,
            timeout_s=20,
            message=lambda: f"{publisher.stale_cleared_total} cleared",
        )

        async def only_ours_left() -> bool:
            return set(await retained_desired(broker.url, topic_root)) == {"replaced", "ours"}

        await eventually_async(only_ours_left, timeout_s=20)
        after = await retained_desired(broker.url, topic_root)
        assert set(after) == {"replaced", "ours"}
        assert after["ours"] == retained_before["ours"]
        replaced = verify_desired(after["replaced"], key.public_key())
        assert (replaced.cluster_id, replaced.generation) == ("c2", 1)
    finally:
        await stop_task(task)
