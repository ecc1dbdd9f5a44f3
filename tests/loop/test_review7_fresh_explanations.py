"""What the scheduling loop writes as a work item's explanation when the work comes back
to the queue after it was placed.

The loop writes a pending explanation only when the pending wording changed since the
last one it wrote (a queue of thousands waiting pass after pass in the same words is
not rewritten every second). It remembered that wording across the placement: a job
waiting over quota, placed, back in the queue (requeued by a person, preempted) and over
quota again in the same words was never explained again, so its stored explanation
stayed the placement (or the preemption) and its detailed pending view (the quota, the
nodes rejected) was missing until the wording changed. And it took a pass's wordings as
written before the pass's write was committed: a write that raised (a version conflict,
planned again at once) left work it first explained without any explanation.

The real loop, pass by pass on a clock of the test's, and the real store, on SQLite and
PostgreSQL.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from cloud.fleet.liveness import Liveness
from cloud.fleet.registry import NodeRegistry
from cloud.loop.loop import SchedulingLoop
from cloud.loop.publisher import DesiredPublisher
from cloud.store import (
    LeadershipLease,
    NewTenant,
    PassWrite,
    Store,
    VersionConflictError,
    open_store,
)
from cloud.work.explanation import Explanation, decode_explanation
from shared.messages import ReportedState, ReportedTraining
from shared.settings import SchedulingSettings
from shared.work_literals import PriorityClass, WorkState
from tests.loop.builders import node
from tests.store.databases import DatabaseUnderTest
from tests.support.fleet import TEST_SIGNING_KEY, mqtt_settings

pytestmark = pytest.mark.timeout(60)


def spec(name: str, preemptible: bool = True, estimated_duration_s: float = 3600) -> bytes:
    fields: dict[str, Any] = {
        "name": name,
        "command": ["python", "train.py"],
        "accelerators_per_worker": 4,
        "estimated_duration_s": estimated_duration_s,
        "preemptible": preemptible,
    }
    return msgspec.json.encode(fields)


class Cluster:
    """A tenant with a quota of 4 GPUs, two nodes of 4 GPUs, and a scheduling loop run
    one pass at a time at `now`."""

    def __init__(self, store: Store, tenant_id: str) -> None:
        self.store = store
        self.tenant_id = tenant_id
        self.now = time.time()
        self.registry = NodeRegistry()
        # Never connected: passes hand documents over and never wait for the broker.
        publisher = DesiredPublisher(
            mqtt_settings("mqtt://127.0.0.1:1", "unused"),
            signing_key=TEST_SIGNING_KEY,
            cluster_id="test",
        )
        self.loop = SchedulingLoop(
            store,
            self.registry,
            publisher,
            SchedulingSettings(startup_settle_s=0.0),
            liveness=Liveness(self.registry),
            clock=lambda: self.now,
        )
        for node_id in ("n1", "n2"):
            status = node(node_id, gpus=4).status
            # No telemetry expected: the node stays online however far `now` moves.
            self.registry.apply_status(msgspec.structs.replace(status, telemetry_interval_s=1e6))

    async def run(self) -> None:
        lease = await self.store.try_acquire_leadership()
        assert lease is not None
        async with lease:
            await self.loop.run_pass(lease)

    async def submitted(
        self, name: str, *, priority: PriorityClass = "p1", preemptible: bool = True
    ) -> str:
        result = await self.store.submit_work(
            self.tenant_id, kind="training", spec=spec(name, preemptible), priority=priority
        )
        return result.work.work_id

    async def state(self, work_id: str) -> WorkState:
        record = await self.store.get_work(self.tenant_id, work_id)
        assert record is not None
        return record.state

    async def explanation(self, work_id: str) -> tuple[Explanation, bytes, float]:
        """The stored explanation, decoded and as stored, and when it was written."""
        found = await self.store.work_explanation(self.tenant_id, work_id)
        assert found is not None
        assert found.explanation is not None
        assert found.explained_at is not None
        return decode_explanation(found.explanation), found.explanation, found.explained_at

    async def succeeded(self, work_id: str) -> None:
        """Its node's agent reports the job's first attempt done."""
        (allocation,) = await self.store.work_allocations(self.tenant_id, work_id)
        self.registry.apply_reported(
            ReportedState(
                node_id=allocation.node_id,
                instance_id="i1",
                observed_generation=10**6,
                reported_at=self.now,
                training=(
                    ReportedTraining(
                        job_id=work_id, attempt=1, state="succeeded", started_at=self.now
                    ),
                ),
            )
        )

    async def placed_after_waiting_over_quota(self, *, preemptible: bool) -> tuple[str, str]:
        """A job that waited over quota behind a blocker, then placed when the blocker
        ended: its id and the words it waited in."""
        blocker = await self.submitted("blocker", preemptible=False)
        await self.run()
        job_id = await self.submitted("trainer", preemptible=preemptible)
        await self.run()
        waiting, _, _ = await self.explanation(job_id)
        assert waiting.pending is not None, waiting.message
        assert waiting.pending.code == "quota", waiting.message
        await self.succeeded(blocker)
        self.now += 1.0
        await self.run()
        assert await self.state(job_id) == "scheduled"
        placed, _, _ = await self.explanation(job_id)
        assert placed.outcome == "placed", placed.message
        return job_id, waiting.message


@pytest.fixture
async def cluster(database: DatabaseUnderTest) -> AsyncIterator[Cluster]:
    store = await open_store(database.settings)
    try:
        created = await store.create_tenant(NewTenant(name="acme", quotas={"gpu": 4}))
        yield Cluster(store, created.tenant.tenant_id)
    finally:
        await store.close()


async def test_a_job_requeued_into_the_words_it_waited_in_before_is_explained_again(
    cluster: Cluster,
) -> None:
    job_id, words = await cluster.placed_after_waiting_over_quota(preemptible=False)
    # A person requeues it while a higher-priority job waits for the same quota.
    await cluster.store.requeue_placed(cluster.tenant_id, job_id, reason="requeued by acme")
    await cluster.submitted("urgent", priority="p0", preemptible=False)
    cluster.now += 1.0
    await cluster.run()

    assert await cluster.state(job_id) == "pending"
    explanation, _, _ = await cluster.explanation(job_id)
    assert explanation.outcome == "pending", explanation.message
    assert explanation.message == words  # over quota again, in the same words
    assert explanation.pending is not None
    assert explanation.pending.code == "quota"
    assert explanation.placements == ()


async def test_a_preempted_job_waiting_in_the_words_it_waited_in_before_is_explained_again(
    cluster: Cluster,
) -> None:
    job_id, words = await cluster.placed_after_waiting_over_quota(preemptible=True)
    await cluster.submitted("urgent", priority="p0", preemptible=False)
    cluster.now += 1.0
    await cluster.run()
    assert await cluster.state(job_id) == "pending"
    preempted, _, _ = await cluster.explanation(job_id)
    assert preempted.outcome != "pending", preempted.message  # the preemption's word

    cluster.now += 1.0
    await cluster.run()
    explanation, _, _ = await cluster.explanation(job_id)
    assert explanation.outcome == "pending", explanation.message
    assert explanation.message == words
    assert explanation.pending is not None
    assert explanation.pending.code == "quota"


async def test_a_job_waiting_pass_after_pass_in_the_same_words_is_not_rewritten(
    cluster: Cluster,
) -> None:
    await cluster.submitted("blocker", preemptible=False)
    await cluster.run()
    job_id = await cluster.submitted("trainer")
    await cluster.run()
    first = await cluster.explanation(job_id)
    assert first[0].pending is not None
    assert first[0].pending.code == "quota"

    for _ in range(3):
        cluster.now += 60.0  # a rewrite would carry the pass's time
        await cluster.run()
        assert await cluster.explanation(job_id) == first


async def test_a_job_first_explained_by_a_pass_whose_commit_conflicted_is_explained_by_the_next(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pass's write is all or nothing: a job's owner edits it while the pass plans
    to place it, the commit raises `VersionConflictError` and the loop plans again at
    once. The other job's first explanation was in the write that did not happen."""
    edited = await cluster.submitted("edited")
    job_id = await cluster.submitted("trainer")
    commit_pass = cluster.store.commit_pass
    conflicts: list[PassWrite] = []

    async def edited_meanwhile(write: PassWrite, *, lease: LeadershipLease) -> object:
        if write.placements and not conflicts:
            conflicts.append(write)
            await cluster.store.update_queued(
                cluster.tenant_id,
                edited,
                spec=spec("edited", estimated_duration_s=7200),
                priority="p1",
                changed_fields=("estimated_duration_s",),
            )
        return await commit_pass(write, lease=lease)

    monkeypatch.setattr(cluster.store, "commit_pass", edited_meanwhile)
    with pytest.raises(VersionConflictError):
        await cluster.run()
    assert job_id in conflicts[0].explanations  # what the pass meant to write
    found = await cluster.store.work_explanation(cluster.tenant_id, job_id)
    assert found is not None
    assert found.explanation is None

    await cluster.run()  # the loop plans again at once, in the same words
    assert await cluster.state(edited) == "scheduled"
    explanation, _, _ = await cluster.explanation(job_id)
    assert explanation.outcome == "pending", explanation.message
    assert explanation.pending is not None
    assert explanation.pending.code == "quota"
