"""commit_pass: a scheduling pass applied as one transaction, all or nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
import pytest
from sqlalchemy.exc import DBAPIError, StatementError

from cloud.store import (
    WORK_STATE_EVENT,
    EvictionWrite,
    IllegalTransitionError,
    LeadershipLease,
    LeadershipLostError,
    NewAllocation,
    NewEvent,
    PassWrite,
    PlacementWrite,
    StateWrite,
    Store,
    TenantRecord,
    VersionConflictError,
    WorkNotFoundError,
    WorkStateChanged,
)
from tests.store.builders import placement, submit


@pytest.fixture
async def lease(store: Store) -> AsyncIterator[LeadershipLease]:
    acquired = await store.try_acquire_leadership()
    assert acquired is not None
    async with acquired:
        yield acquired


async def _everything(store: Store, tenant: TenantRecord) -> tuple[object, ...]:
    """All the store holds that a plan could change."""
    snapshot = await store.load_snapshot()
    events = await store.list_events(tenant_id=None, limit=1000)
    work = await store.list_work(tenant.tenant_id, limit=1000)
    return snapshot, events, work


async def test_a_plan_places_gangs_and_bumps_generations(
    store: Store, tenant: TenantRecord, lease: LeadershipLease
) -> None:
    gang = (await submit(store, tenant.tenant_id, workers=2)).work
    single = (await submit(store, tenant.tenant_id)).work
    result = await store.commit_pass(
        PassWrite(
            placements=(
                placement(gang.work_id, "gpu-1", "gpu-2", accelerators=4),
                placement(single.work_id, "gpu-2"),
            ),
            events=(
                NewEvent(
                    kind="work.explained",
                    payload=b'{"score": 0.8}',
                    tenant_id=tenant.tenant_id,
                    work_id=gang.work_id,
                ),
            ),
        ),
        lease=lease,
    )
    assert {work.work_id: work.state for work in result.work} == {
        gang.work_id: "scheduled",
        single.work_id: "scheduled",
    }
    assert all(work.attempts == 1 and work.version == 2 for work in result.work)
    assert dict(result.node_generations) == {"gpu-1": 1, "gpu-2": 1}
    desired = await store.desired_state("gpu-2")
    assert desired.generation == 1
    assert [(a.work_id, a.member_index) for a in desired.allocations] == sorted(
        [(gang.work_id, 1), (single.work_id, 0)]
    )
    member = next(a for a in desired.allocations if a.work_id == gang.work_id)
    assert (member.accelerators, member.accelerator_ids, member.tenant_id) == (
        4,
        ("0", "1", "2", "3"),
        tenant.tenant_id,
    )
    assert (await store.desired_state("idle-node")).generation == 0
    kinds = [event.kind for event in await store.list_events(tenant_id=tenant.tenant_id)]
    assert kinds == [WORK_STATE_EVENT] * 4 + ["work.explained"]


async def test_evictions_requeue_and_free_the_node(
    store: Store, tenant: TenantRecord, lease: LeadershipLease
) -> None:
    victim = (await submit(store, tenant.tenant_id, priority="p2")).work
    urgent = (await submit(store, tenant.tenant_id, priority="p0")).work
    await store.commit_pass(
        PassWrite(placements=(placement(victim.work_id, "gpu-1"),)), lease=lease
    )
    await store.transition(victim.work_id, "running")
    result = await store.commit_pass(
        PassWrite(
            evictions=(
                EvictionWrite(work_id=victim.work_id, reason=f"preempted by {urgent.work_id}"),
            ),
            placements=(placement(urgent.work_id, "gpu-1"),),
            pending_reasons={victim.work_id: "ignored: evicted in this plan"},
        ),
        lease=lease,
    )
    states = {work.work_id: (work.state, work.state_reason) for work in result.work}
    assert states[victim.work_id] == ("pending", f"preempted by {urgent.work_id}")
    assert states[urgent.work_id][0] == "scheduled"
    assert dict(result.node_generations) == {"gpu-1": 2}
    desired = await store.desired_state("gpu-1")
    assert [a.work_id for a in desired.allocations] == [urgent.work_id]
    payloads = [
        msgspec.json.decode(event.payload, type=WorkStateChanged)
        for event in await store.list_events(tenant_id=tenant.tenant_id)
    ]
    assert (payloads[-2].previous_state, payloads[-2].state) == ("running", "pending")


async def test_a_placement_replaces_all_allocations_of_running_work(
    store: Store, tenant: TenantRecord, lease: LeadershipLease
) -> None:
    deployment = (await submit(store, tenant.tenant_id, kind="inference", replicas=2)).work
    await store.commit_pass(
        PassWrite(placements=(placement(deployment.work_id, "edge-1"),)), lease=lease
    )
    await store.transition(deployment.work_id, "running")
    grown = await store.commit_pass(
        PassWrite(placements=(placement(deployment.work_id, "edge-2", "edge-3"),)), lease=lease
    )
    assert grown.work[0].state == "running"
    assert grown.work[0].attempts == 1
    assert dict(grown.node_generations) == {"edge-1": 2, "edge-2": 1, "edge-3": 1}
    nodes = [a.node_id for a in await store.work_allocations(tenant.tenant_id, deployment.work_id)]
    assert nodes == ["edge-2", "edge-3"]


async def test_pending_reasons_are_stored_without_a_new_version(
    store: Store, tenant: TenantRecord, lease: LeadershipLease
) -> None:
    work = (await submit(store, tenant.tenant_id)).work
    reason = "0/12 nodes: 8 no GPU, 4 over quota"
    result = await store.commit_pass(PassWrite(pending_reasons={work.work_id: reason}), lease=lease)
    assert result.work == ()
    assert dict(result.node_generations) == {}
    stored = await store.find_work(work.work_id)
    assert stored is not None
    assert (stored.state_reason, stored.version) == (reason, work.version)


async def test_a_failure_mid_plan_leaves_nothing_behind(
    store: Store, tenant: TenantRecord, lease: LeadershipLease
) -> None:
    placed = (await submit(store, tenant.tenant_id)).work
    running = (await submit(store, tenant.tenant_id)).work
    waiting = (await submit(store, tenant.tenant_id)).work
    done = (await submit(store, tenant.tenant_id)).work
    await store.commit_pass(
        PassWrite(placements=(placement(running.work_id, "gpu-9"),)), lease=lease
    )
    await store.transition(running.work_id, "running")
    await store.cancel_work(tenant.tenant_id, done.work_id)
    before = await _everything(store, tenant)

    good = PassWrite(
        placements=(placement(placed.work_id, "gpu-1"),),
        evictions=(EvictionWrite(work_id=running.work_id, reason="preempted"),),
        pending_reasons={waiting.work_id: "no capacity"},
        events=(NewEvent(kind="work.explained", payload=b"{}", tenant_id=tenant.tenant_id),),
    )
    failures: list[tuple[PassWrite, type[Exception]]] = [
        # The last item is illegal: everything before it must roll back.
        (
            PassWrite(
                placements=good.placements,
                evictions=good.evictions,
                pending_reasons=good.pending_reasons,
                events=good.events,
                state_changes=(StateWrite(work_id=done.work_id, to_state="running"),),
            ),
            IllegalTransitionError,
        ),
        (
            PassWrite(placements=(*good.placements, placement("no-such-work", "gpu-2"))),
            WorkNotFoundError,
        ),
        (
            PassWrite(
                placements=good.placements,
                evictions=(EvictionWrite(work_id=running.work_id, reason="x", expected_version=1),),
            ),
            VersionConflictError,
        ),
        # Fails after the work rows and allocations were written.
        (
            PassWrite(
                placements=good.placements,
                events=(NewEvent(kind="bad", payload=b"[]", tenant_id=tenant.tenant_id),),
            ),
            ValueError,
        ),
    ]
    for plan, error in failures:
        with pytest.raises(error):
            await store.commit_pass(plan, lease=lease)
        assert await _everything(store, tenant) == before, error.__name__

    await store.commit_pass(good, lease=lease)
    assert await _everything(store, tenant) != before


async def test_an_allocation_the_database_rejects_rolls_the_plan_back(
    store: Store, tenant: TenantRecord, lease: LeadershipLease
) -> None:
    first = (await submit(store, tenant.tenant_id)).work
    second = (await submit(store, tenant.tenant_id)).work
    before = await _everything(store, tenant)
    overflowing = NewAllocation(
        member_index=0,
        node_id="gpu-1",
        accelerator_kind="gpu",
        accelerators=1,
        host_memory_bytes=2**70,  # beyond BIGINT: the INSERT itself fails
    )
    plan = PassWrite(
        placements=(
            placement(first.work_id, "gpu-1"),
            PlacementWrite(work_id=second.work_id, allocations=(overflowing,)),
        )
    )
    with pytest.raises((DBAPIError, StatementError, OverflowError)):
        await store.commit_pass(plan, lease=lease)
    assert await _everything(store, tenant) == before


async def test_only_a_held_lease_commits(
    store: Store, tenant: TenantRecord, lease: LeadershipLease
) -> None:
    work = (await submit(store, tenant.tenant_id)).work
    await lease.release()
    with pytest.raises(LeadershipLostError):
        await store.commit_pass(
            PassWrite(placements=(placement(work.work_id, "gpu-1"),)), lease=lease
        )
    assert (await store.find_work(work.work_id)) == work


def test_plans_refuse_malformed_placements() -> None:
    with pytest.raises(ValueError, match="no allocations"):
        PlacementWrite(work_id="w", allocations=())
    with pytest.raises(ValueError, match="repeats a member index"):
        PlacementWrite(work_id="w", allocations=(*placement("w", "a").allocations,) * 2)
    with pytest.raises(ValueError, match="accelerator ids"):
        NewAllocation(
            member_index=0,
            node_id="n",
            accelerator_kind="gpu",
            accelerators=2,
            accelerator_ids=("0",),
        )


async def test_a_snapshot_built_on_the_previous_one_equals_a_fresh_read(
    store: Store, tenant: TenantRecord, lease: LeadershipLease
) -> None:
    """`load_snapshot(previous)` reuses unchanged records; nothing it returns may differ
    from a full read: new work, placed work, a new pending reason, ended work."""
    first = (await submit(store, tenant.tenant_id)).work
    second = (await submit(store, tenant.tenant_id)).work
    ending = (await submit(store, tenant.tenant_id)).work
    previous = await store.load_snapshot()
    added = (await submit(store, tenant.tenant_id)).work
    await store.commit_pass(
        PassWrite(
            placements=(placement(first.work_id, "node-a"),),
            pending_reasons={second.work_id: "0/3 nodes: 3 no GPU"},
        ),
        lease=lease,
    )
    await store.cancel_work(tenant.tenant_id, ending.work_id)

    incremental = await store.load_snapshot(previous)
    assert incremental == await store.load_snapshot()
    records = {record.work_id: record for record in incremental.work}
    assert set(records) == {first.work_id, second.work_id, added.work_id}
    assert records[first.work_id].state == "scheduled"
    assert records[second.work_id].state_reason == "0/3 nodes: 3 no GPU"
