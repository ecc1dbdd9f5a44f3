"""A node that left the fleet (revoked: forgotten by the registry) stops being held by
the accountant, in memory and in the store's marks, once its last usage is written;
a node the registry has not heard of yet after a restart keeps its mark."""

from __future__ import annotations

import msgspec
import pytest

from cloud.fleet.registry import NodeRegistry
from cloud.store import StoreSnapshot, UsageQuery
from cloud.usage.accountant import Accountant
from cloud.usage.views import usage_summary
from shared.settings import UsageSettings
from tests.store.databases import DatabaseUnderTest
from tests.usage.test_accountant import (
    T0,
    Clock,
    birth,
    expected_kwh,
    feed,
    grid,
    reading,
    snapshot,
    start,
)
from tests.usage.test_usage_review5_final_events import lead

pytestmark = pytest.mark.timeout(60)

GONE = StoreSnapshot(tenants=(), work=(), allocations=(), node_generations={})


def idle_sample(node_id: str, at: float) -> object:
    return msgspec.structs.replace(reading(at), node_id=node_id)


def held_in_memory(accountant: Accountant) -> set[str]:
    """The node ids the leader's metering state holds (marks, held samples, dirty marks)."""
    state = accountant._state  # what a long-lived leader keeps
    assert state is not None
    return set(state.marks) | set(state.held) | state.dirty


async def test_a_revoked_idle_node_is_let_go_in_memory_and_in_the_store(
    database: DatabaseUnderTest,
) -> None:
    clock = Clock()
    registry = NodeRegistry(wall_clock=clock)
    registry.apply_status(msgspec.structs.replace(birth(clock.now), node_id="n2"))
    accountant, store, lease = await start(database, clock, registry)
    try:
        for at in (T0, T0 + 10):
            clock.now = at
            accountant.observe(idle_sample("n2", at))  # type: ignore[arg-type]
        await accountant.flush(lease)  # type: ignore[arg-type]
        assert "n2" in await store.usage_marks()  # type: ignore[attr-defined]

        registry.forget("n2")  # revoked
        clock.now = T0 + 20
        await accountant.flush(lease)  # type: ignore[arg-type]
        assert "n2" not in await store.usage_marks()  # type: ignore[attr-defined]
        assert "n2" not in held_in_memory(accountant)
    finally:
        await store.close()  # type: ignore[attr-defined]


async def test_a_node_revoked_before_its_last_sample_was_written_is_let_go_after(
    database: DatabaseUnderTest,
) -> None:
    clock = Clock()
    registry = NodeRegistry(wall_clock=clock)
    registry.apply_status(msgspec.structs.replace(birth(clock.now), node_id="n2"))
    accountant, store, lease = await start(database, clock, registry)
    try:
        for at in (T0, T0 + 10, T0 + 20):
            clock.now = at
            accountant.observe(idle_sample("n2", at))  # type: ignore[arg-type]
        registry.forget("n2")  # revoked, its latest sample held for the flush
        await accountant.flush(lease)  # type: ignore[arg-type]
        assert (await store.usage_marks())["n2"].sampled_at == T0 + 20  # type: ignore[attr-defined]
        for _ in range(2):  # nothing changes in the registry meanwhile
            clock.now += 10
            await accountant.flush(lease)  # type: ignore[arg-type]
        assert "n2" not in await store.usage_marks()  # type: ignore[attr-defined]
        assert "n2" not in held_in_memory(accountant)
    finally:
        await store.close()  # type: ignore[attr-defined]


async def test_a_node_revoked_while_its_work_runs_is_counted_to_the_end_first(
    database: DatabaseUnderTest,
) -> None:
    clock = Clock()
    registry = NodeRegistry(wall_clock=clock)
    registry.apply_status(birth(clock.now))
    accountant, store, lease = await start(database, clock, registry)
    try:
        feed(accountant, [T0 + 10 * i for i in range(11)], clock)  # job-1 on n1, 0..100 s
        registry.forget("n1")  # revoked; the loop has not yet taken job-1 off it
        await accountant.flush(lease)  # type: ignore[arg-type]
        assert "n1" in await store.usage_marks()  # type: ignore[attr-defined]

        clock.now = T0 + 105
        accountant.note_pass(GONE, grid(clock.now))  # job-1 ended
        await accountant.flush(lease)  # type: ignore[arg-type]
        # Its allocation waits (`max_gap_s`) for a sample that may still count it to its
        # end: the mark stays while it does.
        assert "n1" in await store.usage_marks()  # type: ignore[attr-defined]
        clock.now = T0 + 105 + UsageSettings().max_gap_s + 1
        accountant.note_pass(GONE, grid(clock.now))
        await accountant.flush(lease)  # type: ignore[arg-type]
        assert "n1" not in await store.usage_marks()  # type: ignore[attr-defined]
        assert "n1" not in held_in_memory(accountant)

        summary = usage_summary(await store.usage(UsageQuery(work_ids=["job-1"])))  # type: ignore[attr-defined]
        assert summary.energy_kwh == pytest.approx(expected_kwh(T0, T0 + 100), rel=1e-6)
    finally:
        await store.close()  # type: ignore[attr-defined]


async def test_a_node_not_heard_of_yet_after_a_restart_keeps_its_mark(
    database: DatabaseUnderTest,
) -> None:
    clock = Clock()
    registry = NodeRegistry(wall_clock=clock)
    registry.apply_status(msgspec.structs.replace(birth(clock.now), node_id="n2"))
    accountant, store, lease = await start(database, clock, registry)
    accountant.observe(idle_sample("n2", T0))  # type: ignore[arg-type]
    await accountant.flush(lease)  # type: ignore[arg-type]
    await lease.release()  # type: ignore[attr-defined]
    await store.close()  # type: ignore[attr-defined]

    clock.now = T0 + 60
    accountant, store, lease = await lead(database, clock)  # its registry: n1 only, so far
    try:
        accountant.note_pass(snapshot(), grid(clock.now))
        for _ in range(3):
            clock.now += 10
            await accountant.flush(lease)  # type: ignore[arg-type]
        assert "n2" in await store.usage_marks()
        assert "n2" in held_in_memory(accountant)
    finally:
        await store.close()
