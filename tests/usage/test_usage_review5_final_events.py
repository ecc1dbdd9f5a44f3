"""Every work item that ran gets its final figures (`work.usage`) once it ends: work that
was preempted, requeued or suspended before it ended too, and work whose leader
restarted (or failed over) before its figures were due."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from cloud.fleet.registry import NodeRegistry
from cloud.store import Store, StoreSnapshot, UsageQuery, WorkRecord, open_store
from cloud.usage.accountant import Accountant
from cloud.usage.views import usage_summary
from shared.settings import UsageSettings
from shared.work_literals import WorkState
from tests.store.databases import DatabaseUnderTest
from tests.usage.test_accountant import T0, Clock, birth, feed, grid, snapshot, start

pytestmark = pytest.mark.timeout(60)

GONE = StoreSnapshot(tenants=(), work=(), allocations=(), node_generations={})


def work(state: WorkState) -> WorkRecord:
    return WorkRecord(
        work_id="job-1", tenant_id="t1", kind="training", spec=b"{}", priority="p1",
        state=state, state_reason=None, attempts=1, submitted_at=T0, updated_at=T0,
        idempotency_key=None, version=1,
    )  # fmt: skip


def running() -> StoreSnapshot:
    return StoreSnapshot(
        tenants=(), work=(work("running"),), allocations=snapshot().allocations,
        node_generations={},
    )  # fmt: skip


def waiting() -> StoreSnapshot:
    """Preempted, requeued or suspended: pending again, no allocation."""
    return StoreSnapshot(tenants=(), work=(work("pending"),), allocations=(), node_generations={})


async def lead(database: DatabaseUnderTest, clock: Clock) -> tuple[Accountant, Store, object]:
    """A control plane starting to lead: nothing in memory, its first pass not yet run."""
    store = await open_store(database.settings, clock=clock)
    lease = None
    async with asyncio.timeout(10):
        while lease is None:
            lease = await store.try_acquire_leadership()
    registry = NodeRegistry(wall_clock=clock)
    registry.apply_status(birth(clock.now))
    accountant = Accountant(store, registry, UsageSettings(), clock=clock)
    await accountant.begin(lease)
    return accountant, store, lease


async def final_figures(store: Store) -> list[dict[str, object]]:
    events = await store.list_events(tenant_id=None, work_id="job-1")
    return [
        {"tenant_id": e.tenant_id, **msgspec.json.decode(e.payload)}
        for e in events
        if e.kind == "work.usage"
    ]


async def passes_and_flushes(
    accountant: Accountant, store: StoreSnapshot, lease: object, clock: Clock, until_s: float
) -> None:
    """Passes, samples and flushes every 10 s to `until_s` (past `final_delay_s`)."""
    while clock.now < until_s:
        clock.now += 10.0
        accountant.note_pass(store, grid(clock.now))
        feed(accountant, [clock.now], clock)
        await accountant.flush(lease)  # type: ignore[arg-type]


async def test_work_requeued_before_it_was_cancelled_gets_its_final_figures(
    database: DatabaseUnderTest,
) -> None:
    clock = Clock()
    accountant, store, lease = await start(database, clock)
    try:
        accountant.note_pass(running(), grid(clock.now))
        feed(accountant, [T0 + 10 * i for i in range(11)], clock)  # 0..100 s
        clock.now = T0 + 105
        accountant.note_pass(waiting(), grid(clock.now))  # preempted: pending again
        feed(accountant, [T0 + 110, T0 + 120], clock)
        await accountant.flush(lease)  # type: ignore[arg-type]
        clock.now = T0 + 125
        accountant.note_pass(GONE, grid(clock.now))  # cancelled while it waited
        await passes_and_flushes(accountant, GONE, lease, clock, T0 + 260)

        (told,) = await final_figures(store)  # type: ignore[arg-type]
        stored = usage_summary(await store.usage(UsageQuery(work_ids=["job-1"])))  # type: ignore[attr-defined]
        assert stored.energy_kwh > 0
        assert told["tenant_id"] == "t1"
        assert told["usage"]["energy_kwh"] == pytest.approx(stored.energy_kwh)  # type: ignore[index]
    finally:
        await store.close()  # type: ignore[attr-defined]


async def test_work_that_never_ran_gets_no_final_figures(database: DatabaseUnderTest) -> None:
    clock = Clock()
    accountant, store, lease = await lead(database, clock)
    try:
        accountant.note_pass(waiting(), grid(clock.now))  # submitted, never placed
        clock.now = T0 + 5
        accountant.note_pass(GONE, grid(clock.now))  # cancelled
        await passes_and_flushes(accountant, GONE, lease, clock, T0 + 100)
        assert await final_figures(store) == []
    finally:
        await store.close()


async def test_a_restart_before_the_final_figures_were_due_still_tells_them_once(
    database: DatabaseUnderTest,
) -> None:
    clock = Clock()
    accountant, store, lease = await start(database, clock)
    accountant.note_pass(running(), grid(clock.now))
    feed(accountant, [T0 + 10 * i for i in range(11)], clock)  # 0..100 s
    clock.now = T0 + 105
    accountant.note_pass(GONE, grid(clock.now))  # it finished
    feed(accountant, [T0 + 110], clock)
    await accountant.flush(lease)  # type: ignore[arg-type]  # counted; figures due at 135 s
    assert await final_figures(store) == []  # type: ignore[arg-type]
    await lease.release()  # type: ignore[attr-defined]
    await store.close()  # type: ignore[attr-defined]

    clock.now = T0 + 120  # the control plane is back 10 s later
    accountant, store, lease = await lead(database, clock)
    try:
        await passes_and_flushes(accountant, GONE, lease, clock, T0 + 400)
        (told,) = await final_figures(store)
        stored = usage_summary(await store.usage(UsageQuery(work_ids=["job-1"])))
        assert stored.energy_kwh > 0
        assert told["tenant_id"] == "t1"
        assert told["usage"]["energy_kwh"] == pytest.approx(stored.energy_kwh)  # type: ignore[index]
    finally:
        await lease.release()  # type: ignore[attr-defined]
        await store.close()

    # Told once: the next leader finds them told.
    accountant, store, lease = await lead(database, clock)
    try:
        await passes_and_flushes(accountant, GONE, lease, clock, T0 + 500)
        assert len(await final_figures(store)) == 1
    finally:
        await store.close()


async def test_work_running_across_a_restart_is_told_when_it_ends_not_before(
    database: DatabaseUnderTest,
) -> None:
    clock = Clock()
    accountant, store, lease = await start(database, clock)
    accountant.note_pass(running(), grid(clock.now))
    feed(accountant, [T0 + 10 * i for i in range(11)], clock)  # 0..100 s
    await accountant.flush(lease)  # type: ignore[arg-type]
    await lease.release()  # type: ignore[attr-defined]
    await store.close()  # type: ignore[attr-defined]

    clock.now = T0 + 120
    accountant, store, lease = await lead(database, clock)
    try:
        await passes_and_flushes(accountant, running(), lease, clock, T0 + 300)
        assert await final_figures(store) == []  # still running
        accountant.note_pass(waiting(), grid(clock.now))  # preempted after the restart
        await passes_and_flushes(accountant, waiting(), lease, clock, T0 + 400)
        assert await final_figures(store) == []  # it may run again
        await passes_and_flushes(accountant, GONE, lease, clock, T0 + 500)  # cancelled
        (told,) = await final_figures(store)
        assert told["tenant_id"] == "t1"
    finally:
        await store.close()
