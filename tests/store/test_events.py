"""The event log: resume after a sequence number, tenant scoping, agent event dedup,
and no event missed by a reader tailing concurrent writers."""

from __future__ import annotations

import asyncio

import msgspec

from cloud.store import (
    WORK_STATE_EVENT,
    NewEvent,
    Store,
    TenantRecord,
    WorkStateChanged,
    open_store,
)
from cloud.store.changes import event_row
from cloud.store.sql import append_events
from tests.store.builders import make_tenant, submit
from tests.store.databases import DatabaseUnderTest


async def test_a_stream_resumes_after_the_last_event_id(store: Store, tenant: TenantRecord) -> None:
    assert await store.last_event_seq() == 0
    work_ids = [(await submit(store, tenant.tenant_id)).work.work_id for _ in range(5)]
    events = await store.list_events(tenant_id=tenant.tenant_id)
    assert [event.work_id for event in events] == work_ids
    assert all(event.kind == WORK_STATE_EVENT for event in events)
    seqs = [event.seq for event in events]
    assert seqs == sorted(seqs)
    assert len(set(seqs)) == 5
    resumed = await store.list_events(tenant_id=tenant.tenant_id, after_seq=seqs[1])
    assert [event.work_id for event in resumed] == work_ids[2:]
    assert await store.list_events(tenant_id=tenant.tenant_id, after_seq=seqs[-1]) == ()
    limited = await store.list_events(tenant_id=tenant.tenant_id, after_seq=seqs[0], limit=2)
    assert [event.seq for event in limited] == seqs[1:3]
    assert await store.last_event_seq() == seqs[-1]
    payload = msgspec.json.decode(events[0].payload, type=WorkStateChanged)
    assert (payload.state, payload.previous_state, payload.work_id) == (
        "pending",
        None,
        work_ids[0],
    )


async def test_tenants_see_only_their_own_events(store: Store, tenant: TenantRecord) -> None:
    other = (await make_tenant(store, "globex")).tenant
    mine = (await submit(store, tenant.tenant_id)).work
    theirs = (await submit(store, other.tenant_id)).work
    await store.cancel_work(other.tenant_id, theirs.work_id)
    assert [e.work_id for e in await store.list_events(tenant_id=tenant.tenant_id)] == [
        mine.work_id
    ]
    assert [e.work_id for e in await store.list_events(tenant_id=other.tenant_id)] == [
        theirs.work_id,
        theirs.work_id,
    ]
    assert len(await store.list_events(tenant_id=None)) == 3


async def test_agent_events_are_recorded_once(store: Store, tenant: TenantRecord) -> None:
    event = NewEvent(
        kind="agent.oom",
        payload=b'{"node_id": "gpu-3", "rss_bytes": 17179869184}',
        tenant_id=tenant.tenant_id,
        event_id="gpu-3:000017",
    )
    first = await store.record_event(event)
    assert first is not None
    assert (first.kind, first.payload, first.event_id) == (
        "agent.oom",
        event.payload,
        "gpu-3:000017",
    )
    assert await store.record_event(event) is None
    assert await store.list_events(tenant_id=tenant.tenant_id) == (first,)
    without_id = NewEvent(kind="note", payload=b"{}", tenant_id=tenant.tenant_id)
    assert await store.record_event(without_id) is not None
    assert await store.record_event(without_id) is not None


async def test_a_tailing_reader_misses_nothing_from_concurrent_writers(
    database: DatabaseUnderTest,
) -> None:
    """Sequence numbers follow commit order, so "after the last one I saw" never skips a
    transaction that took its number earlier but committed later."""
    writers = [await open_store(database.settings) for _ in range(2)]
    reader = await open_store(database.settings)
    try:
        tenant = (await make_tenant(writers[0], "acme")).tenant

        async def write(store: Store, count: int) -> None:
            for _ in range(count):
                await submit(store, tenant.tenant_id)

        seen: list[int] = []
        tasks = [asyncio.create_task(write(writers[i % 2], 15)) for i in range(6)]
        try:
            while not all(task.done() for task in tasks):
                batch = await reader.list_events(
                    tenant_id=tenant.tenant_id, after_seq=seen[-1] if seen else 0
                )
                seen.extend(event.seq for event in batch)
                await asyncio.sleep(0)
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
        seen.extend(
            event.seq
            for event in await reader.list_events(
                tenant_id=tenant.tenant_id, after_seq=seen[-1] if seen else 0
            )
        )
        everything = await reader.list_events(tenant_id=tenant.tenant_id, limit=1000)
        assert len(everything) == 90
        assert seen == [event.seq for event in everything]
    finally:
        for store in (*writers, reader):
            await store.close()


async def test_a_later_event_waits_for_an_earlier_uncommitted_one(
    database: DatabaseUnderTest,
) -> None:
    """The race the commit-order rule exists for: a transaction holds sequence number N
    uncommitted while another appends N+1. A reader must never see N+1 before N."""
    writer, other, reader = [await open_store(database.settings) for _ in range(3)]
    try:
        tenant = (await make_tenant(writer, "acme")).tenant
        first = NewEvent(kind="first", payload=b"{}", tenant_id=tenant.tenant_id)
        second = NewEvent(kind="second", payload=b"{}", tenant_id=tenant.tenant_id)
        async with writer._write() as slow:
            await append_events(slow, writer._context, [event_row(first, 0.0)])
            later = asyncio.create_task(other.record_event(second))
            await asyncio.sleep(0.3)
            assert await reader.list_events(tenant_id=tenant.tenant_id) == ()
        recorded = await asyncio.wait_for(later, 10)
        assert recorded is not None
        events = await reader.list_events(tenant_id=tenant.tenant_id)
        assert [event.kind for event in events] == ["first", "second"]
        assert events[1] == recorded
    finally:
        for store in (writer, other, reader):
            await store.close()
