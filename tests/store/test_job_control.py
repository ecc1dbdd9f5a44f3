"""Job control in the store (cloud/store/job_control.py): holds keep pending work out of
the queue with a reason and an event; a person's requeue ends the placement without
using up `store.max_attempts`; a queued job's spec changes only while it never ran.
On SQLite and PostgreSQL (the `database` fixture)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import msgspec
import pytest

from cloud.store import (
    WORK_STATE_EVENT,
    EvictionWrite,
    IllegalTransitionError,
    LeadershipLease,
    PassWrite,
    Store,
    TenantRecord,
    VersionConflictError,
    WorkNotFoundError,
    WorkStateChanged,
)
from cloud.store.job_control import HOLD_EVENT, UPDATED_EVENT, HoldChanged, QueuedWorkChanged
from tests.store.builders import make_tenant, placement, spec, submit


@pytest.fixture
async def lease(store: Store) -> AsyncIterator[LeadershipLease]:
    acquired = await store.try_acquire_leadership()
    assert acquired is not None
    async with acquired:
        yield acquired


async def test_a_hold_keeps_pending_work_with_its_reason_until_released(
    store: Store, tenant: TenantRecord
) -> None:
    job = (await submit(store, tenant.tenant_id)).work
    held = await store.set_hold(
        tenant.tenant_id, job.work_id, "held", reason="held by acme", actor="acme",
        expected_version=job.version,
    )  # fmt: skip
    assert (held.state, held.hold, held.state_reason, held.version) == (
        "pending", "held", "held by acme", job.version + 1,
    )  # fmt: skip
    assert await store.get_work(tenant.tenant_id, job.work_id) == held
    snapshot = await store.load_snapshot()
    assert [record.hold for record in snapshot.work] == ["held"]

    released = await store.set_hold(
        tenant.tenant_id, job.work_id, None, reason="released by acme", actor="acme"
    )
    assert (released.hold, released.state_reason) == (None, "released by acme")
    events = [
        msgspec.json.decode(event.payload, type=HoldChanged)
        for event in await store.list_events(tenant_id=tenant.tenant_id)
        if event.kind == HOLD_EVENT
    ]
    assert [(e.hold, e.reason, e.actor) for e in events] == [
        ("held", "held by acme", "acme"),
        (None, "released by acme", "acme"),
    ]


async def test_a_pass_planned_before_a_hold_does_not_overwrite_its_reason(
    store: Store, tenant: TenantRecord, lease: LeadershipLease
) -> None:
    job = (await submit(store, tenant.tenant_id)).work
    await store.set_hold(tenant.tenant_id, job.work_id, "held", reason="held by acme", actor=None)
    await store.commit_pass(
        PassWrite(pending_reasons={job.work_id: "Waiting for capacity"}), lease=lease
    )
    record = await store.get_work(tenant.tenant_id, job.work_id)
    assert record is not None
    assert record.state_reason == "held by acme"


async def test_only_pending_work_is_held_and_only_the_tenants_own(
    store: Store, tenant: TenantRecord, lease: LeadershipLease
) -> None:
    job = (await submit(store, tenant.tenant_id)).work
    other = (await make_tenant(store, "globex")).tenant
    with pytest.raises(WorkNotFoundError):
        await store.set_hold(other.tenant_id, job.work_id, "held", reason="x", actor=None)
    with pytest.raises(VersionConflictError):
        await store.set_hold(
            tenant.tenant_id, job.work_id, "held", reason="x", actor=None, expected_version=9
        )
    await store.commit_pass(PassWrite(placements=(placement(job.work_id, "gpu-1"),)), lease=lease)
    with pytest.raises(IllegalTransitionError):
        await store.set_hold(tenant.tenant_id, job.work_id, "held", reason="x", actor=None)


async def test_a_requeue_ends_the_placement_and_never_uses_up_attempts(
    store: Store, tenant: TenantRecord, lease: LeadershipLease
) -> None:
    job = (await submit(store, tenant.tenant_id)).work
    # More requeues than `store.max_attempts` (3) allows evictions: none of them counts.
    for _ in range(store.max_attempts + 1):
        await store.commit_pass(
            PassWrite(placements=(placement(job.work_id, "gpu-1"),)), lease=lease
        )
        await store.transition(job.work_id, "running")
        result = await store.requeue_placed(
            tenant.tenant_id, job.work_id, reason="requeued by acme", actor="acme"
        )
        (requeued,) = result.work
        assert (requeued.state, requeued.hold, requeued.state_reason) == (
            "pending", None, "requeued by acme",
        )  # fmt: skip
        assert dict(result.node_generations).keys() == {"gpu-1"}
        assert (await store.desired_state("gpu-1")).allocations == ()
    record = await store.get_work(tenant.tenant_id, job.work_id)
    assert record is not None
    assert (record.attempts, record.requeues) == (store.max_attempts + 1, store.max_attempts + 1)
    # A preemption after all that still requeues: it is the first one that counts.
    await store.commit_pass(PassWrite(placements=(placement(job.work_id, "gpu-1"),)), lease=lease)
    evicted = await store.commit_pass(
        PassWrite(evictions=(EvictionWrite(work_id=job.work_id, reason="preempted"),)),
        lease=lease,
    )
    assert evicted.work[0].state == "pending"
    states = [
        msgspec.json.decode(event.payload, type=WorkStateChanged)
        for event in await store.list_events(tenant_id=tenant.tenant_id)
        if event.kind == WORK_STATE_EVENT
    ]
    assert [(s.previous_state, s.state, s.actor) for s in states if s.actor] == [
        ("running", "pending", "acme")
    ] * (store.max_attempts + 1)


async def test_a_suspend_of_placed_work_requeues_it_held(
    store: Store, tenant: TenantRecord, lease: LeadershipLease
) -> None:
    job = (await submit(store, tenant.tenant_id, checkpoint_interval_s=60)).work
    await store.commit_pass(PassWrite(placements=(placement(job.work_id, "gpu-1"),)), lease=lease)
    result = await store.requeue_placed(
        tenant.tenant_id, job.work_id, hold="suspended", reason="suspended by acme", actor="acme"
    )
    (suspended,) = result.work
    assert (suspended.state, suspended.hold, suspended.state_reason) == (
        "pending", "suspended", "suspended by acme",
    )  # fmt: skip
    kinds = [event.kind for event in await store.list_events(tenant_id=tenant.tenant_id)]
    assert kinds[-2:] == [WORK_STATE_EVENT, HOLD_EVENT]
    with pytest.raises(IllegalTransitionError):  # pending: nothing to requeue
        await store.requeue_placed(tenant.tenant_id, job.work_id, reason="x", actor=None)


async def test_a_queued_job_changes_until_it_is_placed(
    store: Store, tenant: TenantRecord, lease: LeadershipLease
) -> None:
    job = (await submit(store, tenant.tenant_id)).work
    changed = await store.update_queued(
        tenant.tenant_id, job.work_id, spec=spec(workers=4), priority="p0",
        changed_fields=("workers", "priority"), actor="acme", expected_version=job.version,
    )  # fmt: skip
    assert (changed.priority, changed.version) == ("p0", job.version + 1)
    assert msgspec.json.decode(changed.spec)["workers"] == 4
    assert await store.get_work(tenant.tenant_id, job.work_id) == changed
    (event,) = [
        event
        for event in await store.list_events(tenant_id=tenant.tenant_id)
        if event.kind == UPDATED_EVENT
    ]
    payload = msgspec.json.decode(event.payload, type=QueuedWorkChanged)
    assert (payload.changed, payload.actor) == (("workers", "priority"), "acme")

    await store.commit_pass(PassWrite(placements=(placement(job.work_id, "gpu-1"),)), lease=lease)
    await store.requeue_placed(tenant.tenant_id, job.work_id, reason="requeued", actor=None)
    with pytest.raises(IllegalTransitionError):  # pending again, but it ran
        await store.update_queued(
            tenant.tenant_id, job.work_id, spec=spec(), priority="p1", changed_fields=(),
            actor=None,
        )  # fmt: skip


async def test_a_placement_planned_before_a_hold_is_refused(
    store: Store, tenant: TenantRecord, lease: LeadershipLease
) -> None:
    job = (await submit(store, tenant.tenant_id)).work
    planned = placement(job.work_id, "gpu-1")
    await store.set_hold(tenant.tenant_id, job.work_id, "held", reason="held by acme", actor=None)
    with pytest.raises(VersionConflictError):  # the loop plans again, without it
        await store.commit_pass(
            PassWrite(placements=(replace(planned, expected_version=job.version),)), lease=lease
        )
    record = await store.get_work(tenant.tenant_id, job.work_id)
    assert record is not None
    assert (record.state, record.hold) == ("pending", "held")
    assert (await store.desired_state("gpu-1")).allocations == ()
