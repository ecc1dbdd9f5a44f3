"""Usage marks of nodes revoked where no leader saw them leave (before marks were let go
on revocation, or while a leader had not heard the node since it began) are deleted: by
a leader starting, and by the leader's hourly look at the store; a node not heard of yet
after a restart, and not revoked, keeps its mark."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from cloud.fleet.registry import NodeRegistry
from cloud.store import LeadershipLease, Store, UsageMark, UsageWrite, open_store
from cloud.usage.accountant import REVOKED_SWEEP_INTERVAL_S, Accountant
from shared.settings import UsageSettings
from tests.store.databases import DatabaseUnderTest
from tests.usage.test_accountant import T0, Clock, birth, grid, snapshot

pytestmark = pytest.mark.timeout(60)


def mark(node_id: str) -> UsageMark:
    return UsageMark(node_id, "i1", 7, T0 - 600.0, {"gpu0": 1000.0})


@pytest.fixture
async def leftovers(
    database: DatabaseUnderTest,
) -> AsyncIterator[tuple[Store, LeadershipLease, Clock]]:
    """A store holding the marks of `gone` (revoked), `quiet` (enrolled, not heard of
    yet) and `unenrolled` (never enrolled: a fleet without enrolment)."""
    clock = Clock()
    store = await open_store(database.settings, clock=clock)
    try:
        lease = None
        async with asyncio.timeout(10):
            while lease is None:
                lease = await store.try_acquire_leadership()
        marks = [mark(node_id) for node_id in ("gone", "quiet", "unenrolled")]
        await store.write_usage(UsageWrite(marks=marks), lease=lease)
        await store.revoke_node("gone")
        yield store, lease, clock
    finally:
        await store.close()


async def leader(store: Store, lease: LeadershipLease, clock: Clock) -> Accountant:
    """A leader starting: its registry holds n1 only (no birth of the others heard)."""
    registry = NodeRegistry(wall_clock=clock)
    registry.apply_status(birth(clock.now))
    accountant = Accountant(store, registry, UsageSettings(), clock=clock)
    accountant.note_pass(snapshot(), grid(clock.now))
    await accountant.begin(lease)
    return accountant


async def test_a_leader_starting_deletes_the_marks_of_revoked_nodes(
    leftovers: tuple[Store, LeadershipLease, Clock],
) -> None:
    store, lease, clock = leftovers
    accountant = await leader(store, lease, clock)
    clock.now += 10.0
    await accountant.flush(lease)
    assert set(await store.usage_marks()) == {"quiet", "unenrolled"}


async def test_a_node_revoked_while_unheard_loses_its_mark_within_the_hour(
    leftovers: tuple[Store, LeadershipLease, Clock],
) -> None:
    store, lease, clock = leftovers
    accountant = await leader(store, lease, clock)
    await store.revoke_node("quiet")  # by another replica, say: never held here
    clock.now += 10.0
    await accountant.flush(lease)
    assert "quiet" in await store.usage_marks()  # looked for hourly, not at every flush

    clock.now += REVOKED_SWEEP_INTERVAL_S
    await accountant.flush(lease)
    assert set(await store.usage_marks()) == {"unenrolled"}
