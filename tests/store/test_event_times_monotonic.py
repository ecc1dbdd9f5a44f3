"""Event times never go backwards in sequence order, whatever the writers' clocks say,
so "the events since TIME" (`GET /v1/events?since=`) starts at the right place."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from cloud.store import NewEvent, Store, open_store
from cloud.store.changes import event_row
from cloud.store.sql import append_events
from tests.store.builders import make_tenant, submit
from tests.store.databases import DatabaseUnderTest

# Two replicas of one control plane: B's clock is five seconds behind A's.
REPLICA_A_NOW = 1_000.0
REPLICA_B_NOW = 995.0


def fixed_clock(now: float) -> Callable[[], float]:
    return lambda: now


@pytest.fixture
async def replicas(database: DatabaseUnderTest) -> AsyncIterator[tuple[Store, Store]]:
    """Two stores on one database, each with its own (fixed) clock."""
    a = await open_store(database.settings, clock=fixed_clock(REPLICA_A_NOW))
    b = await open_store(database.settings, clock=fixed_clock(REPLICA_B_NOW))
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


async def events_since(store: Store, since: float) -> list[int]:
    """What `GET /v1/events?since=` sends: everything after the newest event before then."""
    after = await store.last_event_seq(before=since)
    return [event.seq for event in await store.list_events(tenant_id=None, after_seq=after)]


def note(n: int) -> NewEvent:
    return NewEvent(kind="note", payload=f'{{"n": {n}}}'.encode(), tenant_id=None)


async def test_a_replica_whose_clock_lags_hides_no_event_from_since(
    replicas: tuple[Store, Store],
) -> None:
    a, b = replicas
    first = await a.record_event(note(1))
    lagging = await b.record_event(note(2))
    third = await a.record_event(note(3))
    assert first is not None
    assert lagging is not None
    assert third is not None
    # The lagging replica's event is stamped no earlier than the one before it ...
    assert lagging.at == REPLICA_A_NOW
    # ... and what record_event answered is what the log holds.
    stored = await a.list_events(tenant_id=None)
    assert stored == (first, lagging, third)
    assert await events_since(a, REPLICA_A_NOW - 1.0) == [first.seq, lagging.seq, third.seq]
    assert await events_since(b, REPLICA_A_NOW + 1.0) == []


async def test_a_batch_from_a_lagging_replica_keeps_times_in_sequence_order(
    replicas: tuple[Store, Store],
) -> None:
    """State changes and submissions append many events at once (group commit)."""
    a, b = replicas
    tenant = (await make_tenant(a, "acme")).tenant
    await submit(a, tenant.tenant_id)
    await asyncio.gather(*(submit(b, tenant.tenant_id) for _ in range(5)))
    await a.record_event(note(7))
    logged = await a.list_events(tenant_id=None, limit=1000)
    assert len(logged) == 7
    times = [event.at for event in logged]
    assert times == sorted(times)
    assert await events_since(a, REPLICA_A_NOW - 1.0) == [event.seq for event in logged]


class WatchedClock:
    """A fixed clock that says when it was last read."""

    def __init__(self, now: float) -> None:
        self.now = now
        self.read = asyncio.Event()

    def __call__(self) -> float:
        self.read.set()
        return self.now


async def test_an_event_that_waited_for_the_log_is_stamped_after_the_one_before(
    database: DatabaseUnderTest,
) -> None:
    """Two transactions read their clocks, then take the event log's lock in the other
    order: the one that took its time first and its sequence number second is not
    recorded as earlier than the event before it."""
    writer = await open_store(database.settings, clock=fixed_clock(REPLICA_A_NOW))
    lagging_clock = WatchedClock(REPLICA_B_NOW)
    other = await open_store(database.settings, clock=lagging_clock)
    try:
        async with writer._write() as slow:
            await append_events(slow, writer._context, [event_row(note(1), REPLICA_A_NOW)])
            lagging_clock.read.clear()
            waiting = asyncio.create_task(other.record_event(note(2)))
            # Its time is taken while the first event is still uncommitted.
            await asyncio.wait_for(lagging_clock.read.wait(), 10)
        recorded = await asyncio.wait_for(waiting, 10)
        assert recorded is not None
        assert recorded.at == REPLICA_A_NOW
        assert await events_since(other, REPLICA_A_NOW) == [recorded.seq - 1, recorded.seq]
    finally:
        await writer.close()
        await other.close()
