"""A control-plane replica that does not lead, on the real Mosquitto and store: its
assignment index reloads from the store every few seconds (cloud/fleet/assignments.py
`refresh_forever`), so the `reported` entries of work the leader placed a moment ago
reach it before the placement does. They are judged after its next reload, and only
what is still not assigned then is counted as `not_assigned`."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import AsyncIterator

import aiomqtt
import pytest

from cloud.fleet.assignments import Assignment, AssignmentIndex, AssignmentKey, refresh_forever
from cloud.fleet.ingest import Ingestor
from cloud.fleet.registry import NodeRegistry
from cloud.store import PassWrite, Store, open_store
from shared.messages import NodeStatus, ReportedState, ReportedTraining, encode
from shared.settings import MqttSettings, parse_mqtt_url
from shared.tasks import stop_task
from shared.topics import Channel, Topics
from sim_devices.probes import SimulatedNode
from sim_devices.profiles import get_profile
from tests.store.builders import make_tenant, placement, submit
from tests.store.databases import DatabaseUnderTest
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(60)

NODE = "follower-node"
NOT_ASSIGNED = ("reported", "not_assigned")


class HandClock:
    """The follower's monotonic clock, moved by the test: when its index is due for a
    reload (`refresh_forever`) and how long unknown entries have been held."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def birth() -> NodeStatus:
    node = SimulatedNode(NODE, get_profile("t4-inference-server"), random.Random(NODE))
    now = time.time()
    return NodeStatus(
        node_id=NODE,
        state="online",
        instance_id="agent-1",
        agent_version="test",
        site="cloud",
        zone="DE",
        region="europe-west3",
        host=node.host_info(),
        accelerators=node.accelerators,
        telemetry_interval_s=1.0,
        started_at=now - 60.0,
        sent_at=now,
    )


def report(*training: ReportedTraining) -> ReportedState:
    return ReportedState(
        node_id=NODE,
        instance_id="agent-1",
        observed_generation=1,
        reported_at=time.time(),
        training=training,
    )


@contextlib.asynccontextmanager
async def follower(
    store: Store, url: str, root: str, clock: HandClock
) -> AsyncIterator[tuple[Ingestor, AssignmentIndex]]:
    """An ingestion that does not lead: its index only reloads from the store, when
    `clock` says a reload is due (the real sleep between looks is short)."""
    index = AssignmentIndex(monotonic=clock)
    ingestor = Ingestor(
        NodeRegistry(), Topics(root), max_payload_bytes=64 * 1024, assignments=index
    )
    settings = MqttSettings(url=url, topic_root=root)
    session = ingestor.session(settings, client_id=f"follower-{uuid.uuid4().hex}")
    reloading = asyncio.create_task(
        refresh_forever(index, store, interval_s=0.05, monotonic=clock), name="reload"
    )
    ingesting = asyncio.create_task(ingestor.run(session), name="ingest")
    try:
        await asyncio.wait_for(ingestor.subscribed.wait(), 10)
        await eventually(lambda: index.loaded, message="the index never loaded")
        yield ingestor, index
    finally:
        await stop_task(ingesting)
        await stop_task(reloading)


async def reloaded(index: AssignmentIndex, clock: HandClock, by_s: float) -> None:
    """Move the clock on by `by_s` and wait for the reload that makes due."""
    clock.now_s += by_s
    await eventually(
        lambda: index.updated_monotonic == clock.now_s, message="the index did not reload"
    )


async def test_a_follower_counts_only_what_is_still_unassigned_after_its_reload(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    url, root = mosquitto_root
    leader_store, follower_store = await open_store(database.settings), None
    try:
        follower_store = await open_store(database.settings)
        tenant = (await make_tenant(leader_store, "acme")).tenant
        job = (await submit(leader_store, tenant.tenant_id)).work
        clock = HandClock()
        async with follower(follower_store, url, root, clock) as (ingestor, index):
            endpoint = parse_mqtt_url(url)
            topics = Topics(root)
            async with aiomqtt.Client(endpoint.host, endpoint.port) as agent:
                await agent.publish(
                    topics.node(NODE, Channel.STATUS), encode(birth()), qos=1, retain=True
                )
                await eventually(lambda: ingestor.registry.get(NODE) is not None)

                # The leader places the job and the node starts it at once: its report
                # reaches the follower before the follower's index has reloaded.
                lease = await leader_store.try_acquire_leadership()
                assert lease is not None
                async with lease:
                    placed_now = PassWrite(placements=(placement(job.work_id, NODE),))
                    await leader_store.commit_pass(placed_now, lease=lease)
                sent = report(
                    ReportedTraining(job_id=job.work_id, attempt=1, state="running"),
                    ReportedTraining(job_id="never-placed", attempt=1, state="succeeded"),
                )
                await agent.publish(
                    topics.node(NODE, Channel.REPORTED), encode(sent), qos=1, retain=True
                )
                await eventually(lambda: reported_of(ingestor) == sent)
                assert ingestor.stats.invalid[NOT_ASSIGNED] == 0

                await reloaded(index, clock, by_s=1.0)
                placed: AssignmentKey = ("training", NODE, job.work_id, 1)
                assert index.assignment(placed) is Assignment.ASSIGNED
                assert ingestor.stats.invalid[NOT_ASSIGNED] == 0  # the lie is held 5 s

                await reloaded(index, clock, by_s=5.0)
                await reloaded(index, clock, by_s=5.0)
            assert ingestor.stats.invalid[NOT_ASSIGNED] == 1  # "never-placed", once
            assert ingestor.stats.invalid_total == 1
    finally:
        await leader_store.close()
        if follower_store is not None:
            await follower_store.close()


def reported_of(ingestor: Ingestor) -> ReportedState | None:
    record = ingestor.registry.get(NODE)
    return record.reported if record is not None else None
