"""`PassWrite.drain_waiting` replaces what the store holds of draining nodes' waits
(whole, or not at all when None), and `Store.drain_waiting()` reads it back: how the
replicas that do not lead learn what the leader's pass found."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from cloud.store import LeadershipLease, PassWrite, Store


@pytest.fixture
async def lease(store: Store) -> AsyncIterator[LeadershipLease]:
    acquired = await store.try_acquire_leadership()
    assert acquired is not None
    async with acquired:
        yield acquired


async def test_a_pass_write_replaces_the_stored_drain_waiting_whole(
    store: Store, lease: LeadershipLease
) -> None:
    assert await store.drain_waiting() == {}
    both = {"orin-0": ("waiting: a", "waiting: b"), "orin-1": ("waiting: c",)}
    await store.commit_pass(PassWrite(drain_waiting=both), lease=lease)
    assert await store.drain_waiting() == both
    await store.commit_pass(PassWrite(), lease=lease)  # None: left as it is
    assert await store.drain_waiting() == both
    await store.commit_pass(PassWrite(drain_waiting={"orin-1": ("waiting: d",)}), lease=lease)
    assert await store.drain_waiting() == {"orin-1": ("waiting: d",)}
    await store.commit_pass(PassWrite(drain_waiting={}), lease=lease)
    assert await store.drain_waiting() == {}
