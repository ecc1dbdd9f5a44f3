"""A leader paused in a pass (SIGSTOP, a frozen VM, a long collection) while its lock
went to another replica.

Its next triggered pass came twice the pause after the paused one ended, whatever
`scheduling.interval_s` said: a 30 s pause left jobs pending on idle nodes for a minute.
And until that pass found the lease lost, its publisher replaced the new leader's
`desired` documents with its own older ones, which the new leader replaced again: a
node's generation flipped between the two, hundreds of publishes.

Now a triggered pass never waits past when the pass due anyway would run, and the
publisher asks the loop's lease before documents go out and at once when a newer
document of this cluster appears on a node: a leader that lost its lock stops then,
leaving the new leader's document in place."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from cloud.fleet.liveness import Liveness
from cloud.fleet.registry import NodeRegistry
from cloud.loop.loop import LeaseConfirmation, SchedulingLoop
from cloud.loop.publisher import DesiredPublisher
from cloud.store import LeadershipLease, LeadershipLostError, Store, open_store
from shared.desired_signature import verify_desired
from shared.messages import DesiredState
from shared.settings import MqttSettings, SchedulingSettings
from shared.tasks import stop_task
from shared.topics import Channel, Topics
from tests.integration.test_signed_desired import publish, retained_desired
from tests.store.databases import DatabaseUnderTest, postgres_database
from tests.store.leader_lock import end_leader_session
from tests.support.fleet import TEST_SIGNING_KEY, mqtt_settings, signed
from tests.support.waiting import eventually, eventually_async

pytestmark = pytest.mark.timeout(60)

INTERVAL_S = 2.0
CLUSTER_ID = "c1"


def document(node_id: str, generation: int) -> DesiredState:
    return DesiredState(
        node_id=node_id, generation=generation, issued_at=1.0, cluster_id=CLUSTER_ID
    )


def scheduling_loop(
    store: Store, mqtt: MqttSettings, settings: SchedulingSettings
) -> tuple[SchedulingLoop, DesiredPublisher]:
    registry = NodeRegistry()
    publisher = DesiredPublisher(mqtt, signing_key=TEST_SIGNING_KEY, cluster_id=CLUSTER_ID)
    loop = SchedulingLoop(store, registry, publisher, settings, liveness=Liveness(registry))
    return loop, publisher


async def retained_generation(url: str, root: str, node_id: str) -> int | None:
    payload = (await retained_desired(url, root)).get(node_id)
    if payload is None:
        return None
    return verify_desired(payload, TEST_SIGNING_KEY.public_key()).generation


# ---- a paused pass and the next one ----------------------------------------------------


async def test_a_pass_stretched_by_a_pause_puts_a_triggered_pass_off_no_later_than_interval_s(
    database: DatabaseUnderTest,
) -> None:
    settings = SchedulingSettings(debounce_s=0.01, interval_s=INTERVAL_S, startup_settle_s=0.0)
    store = await open_store(database.settings)
    # Never connected: passes hand documents over and never wait for the broker.
    loop, _ = scheduling_loop(store, mqtt_settings("mqtt://127.0.0.1:1", "unused"), settings)
    task = asyncio.create_task(loop.run())
    try:
        await eventually(lambda: loop.stats.passes >= 1, timeout_s=15, message="no first pass")
        # The pass that just ended took a minute by the wall clock: the process was
        # stopped in the middle of it.
        loop.stats.last_pass_ms = 60_000.0
        passes = loop.stats.passes
        woken_at = time.monotonic()
        loop.wake()  # a job submitted, nodes idle
        await eventually(
            lambda: loop.stats.passes > passes,
            timeout_s=INTERVAL_S + 3.0,
            message="no pass within interval_s of the trigger: it was put off by the pause",
        )
        assert time.monotonic() - woken_at < INTERVAL_S + 1.5
    finally:
        await stop_task(task)
        await store.close()


# ---- the publisher of a leader that may have lost its lock -----------------------------


async def test_a_newer_document_of_this_cluster_is_left_in_place_and_the_lease_asked_at_once(
    mosquitto_root: tuple[str, str],
) -> None:
    url, root = mosquitto_root
    publisher = DesiredPublisher(
        mqtt_settings(url, root), signing_key=TEST_SIGNING_KEY, cluster_id=CLUSTER_ID
    )
    asked: list[float] = []

    async def still_leading() -> bool:
        asked.append(time.monotonic())
        return True  # a document newer than ours, yet this process leads: left alone too

    publisher.confirm_leading = still_leading
    task = asyncio.create_task(publisher.run())
    try:
        await eventually(publisher.swept.is_set, timeout_s=10)
        publisher.submit(document("n1", 2))
        await eventually(lambda: publisher.published_total == 1, timeout_s=10)
        answers = len(asked)  # the lease was asked before the document went out

        # Another leader's document, newer: asked at once, within the second that the
        # last answer would otherwise serve.
        topic = Topics(root).node("n1", Channel.DESIRED)
        await publish(url, topic, signed(document("n1", 4)))
        await eventually(
            lambda: len(asked) > answers or publisher.repaired_total > 0,
            timeout_s=10,
            message="the newer document was never seen",
        )
        assert publisher.repaired_total == 0, "the newer document was overwritten with ours"
        assert len(asked) == answers + 1
        assert await retained_generation(url, root, "n1") == 4
        assert publisher.is_current("n1", 2)  # still leading: nothing forgotten
    finally:
        await stop_task(task)


async def test_a_publisher_whose_lease_is_lost_sends_no_repair_and_forgets_its_documents(
    mosquitto_root: tuple[str, str],
) -> None:
    url, root = mosquitto_root
    publisher = DesiredPublisher(
        mqtt_settings(url, root), signing_key=TEST_SIGNING_KEY, cluster_id=CLUSTER_ID
    )
    task = asyncio.create_task(publisher.run())
    try:
        await eventually(publisher.swept.is_set, timeout_s=10)
        publisher.submit(document("n1", 2))
        await eventually(lambda: publisher.published_total == 1, timeout_s=10)

        asked: list[float] = []

        async def lost() -> bool:
            asked.append(time.monotonic())
            return False

        publisher.confirm_leading = lost  # the lock went to another replica meanwhile
        # An older document of ours (what the new leader's repair of a replay crosses):
        # a leader replaces it with its newest at once. This process asks first.
        topic = Topics(root).node("n1", Channel.DESIRED)
        await publish(url, topic, signed(document("n1", 1)))
        await eventually(lambda: bool(asked), timeout_s=10, message="the repair went out unasked")
        assert not publisher.is_current("n1", 2)  # forgotten: not handed over again
        assert publisher.published_total == 1
        assert await retained_generation(url, root, "n1") == 1
    finally:
        await stop_task(task)


async def test_a_leader_whose_lock_was_taken_over_stops_when_the_new_leader_s_document_appears(
    tmp_path: Path, mosquitto_root: tuple[str, str]
) -> None:
    """PostgreSQL only: a SQLite leader's lock is a file lock its process holds until it
    ends, which no other replica can take over."""
    url, root = mosquitto_root
    # No pass in the test's time would notice the lost lock: the publisher has to.
    settings = SchedulingSettings(debounce_s=0.01, interval_s=60.0, startup_settle_s=0.0)
    async with postgres_database(tmp_path) as database:
        store = await open_store(database.settings)
        new_leader = await open_store(database.settings)
        loop, publisher = scheduling_loop(store, mqtt_settings(url, root), settings)
        publishing = asyncio.create_task(publisher.run())
        leading = asyncio.create_task(loop.run())
        new_lease: LeadershipLease | None = None
        try:
            await eventually(publisher.swept.is_set, timeout_s=10)
            await eventually(lambda: loop.stats.passes >= 1, timeout_s=15)
            publisher.submit(document("n1", 2))  # as its pass would
            await eventually(lambda: publisher.published_total == 1, timeout_s=10)

            # Its lock session ends (a partition, the server's keepalive, an admin) while
            # it is paused, and another replica takes the lock and publishes.
            assert await end_leader_session(store, database.settings.database_schema) == [True]

            async def took_over() -> bool:
                nonlocal new_lease
                new_lease = await new_leader.try_acquire_leadership()
                return new_lease is not None

            await eventually_async(took_over, timeout_s=10, message="the lock stayed held")
            topic = Topics(root).node("n1", Channel.DESIRED)
            await publish(url, topic, signed(document("n1", 4)))

            await eventually(
                lambda: not loop.leading.is_set(),
                timeout_s=10,
                message="it went on leading on a lost lock until its next pass",
            )
            assert not publisher.is_current("n1", 2)  # forgotten
            assert await retained_generation(url, root, "n1") == 4
        finally:
            await stop_task(leading)
            await stop_task(publishing)
            if new_lease is not None:
                await new_lease.release()
            await store.close()
            await new_leader.close()


# ---- the lease is asked in the loop's task, not the asker's ----------------------------


class GatedLease(LeadershipLease):
    """A lease whose checks wait for the test; `lost` makes the next one fail."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.checks_started = 0
        self.checks_cancelled = 0
        self.lost = False

    @property
    def held(self) -> bool:
        return not self.lost

    async def check(self) -> None:
        self.checks_started += 1
        try:
            await self.gate.wait()
        except asyncio.CancelledError:
            self.checks_cancelled += 1
            raise
        if self.lost:
            raise LeadershipLostError("taken over")

    async def release(self) -> None:
        self.lost = True


async def test_an_asker_cancelled_mid_check_leaves_the_lease_check_running() -> None:
    """The publisher's tasks are cancelled whenever the broker connection drops; a
    PostgreSQL lease check cancelled mid-statement ends the lock's session."""
    lease = GatedLease()
    confirmation = LeaseConfirmation(lease)
    checking = asyncio.create_task(confirmation.run())
    try:
        asker = asyncio.create_task(confirmation.still_leading())
        await eventually(lambda: lease.checks_started == 1, timeout_s=5)
        await stop_task(asker)
        second = asyncio.create_task(confirmation.still_leading())
        lease.gate.set()
        async with asyncio.timeout(5):
            assert await second
        assert lease.checks_cancelled == 0

        lease.lost = True
        async with asyncio.timeout(5):
            assert not await confirmation.still_leading()
            with pytest.raises(LeadershipLostError):
                await checking
        assert not await confirmation.still_leading()  # ended: no one left to answer
    finally:
        if not checking.done():
            await stop_task(checking)
