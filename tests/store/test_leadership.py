"""Scheduling leadership: one leader per database; release or death hands it over."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from sqlalchemy import text

from cloud.store import LeadershipLostError, PassWrite, Store, open_store
from cloud.store.leadership import PostgresLease
from shared.settings import StoreSettings
from tests.store.builders import make_tenant, placement, submit
from tests.store.databases import DatabaseUnderTest, postgres_database, sqlite_database
from tests.store.leader_lock import end_leader_session, leader_lock_holder
from tests.support.waiting import eventually_async


async def test_only_one_of_two_stores_leads_and_release_hands_over(
    database: DatabaseUnderTest,
) -> None:
    first, second = [await open_store(database.settings) for _ in range(2)]
    try:
        lease = await first.try_acquire_leadership()
        assert lease is not None
        assert await second.try_acquire_leadership() is None
        assert await first.try_acquire_leadership() is None  # not reentrant either
        await lease.check()
        await lease.release()
        assert not lease.held
        with pytest.raises(LeadershipLostError):
            await lease.check()
        taken_over = await second.try_acquire_leadership()
        assert taken_over is not None
        assert await first.try_acquire_leadership() is None
        await taken_over.release()
        await taken_over.release()  # idempotent
    finally:
        await first.close()
        await second.close()


async def test_a_replica_waits_for_leadership_and_gets_it_on_release(
    database: DatabaseUnderTest,
) -> None:
    leader, replica = [await open_store(database.settings) for _ in range(2)]
    try:
        lease = await leader.try_acquire_leadership()
        assert lease is not None
        became_leader = asyncio.Event()

        async def wait_for_leadership() -> None:
            async with replica.leadership(poll_interval_s=0.02) as acquired:
                assert acquired.held
                became_leader.set()

        waiting = asyncio.create_task(wait_for_leadership())
        await asyncio.sleep(0.2)
        assert not became_leader.is_set()
        await lease.release()
        await asyncio.wait_for(waiting, 10)
        assert became_leader.is_set()
        # Leaving the block released it again.
        again = await leader.try_acquire_leadership()
        assert again is not None
        await again.release()
    finally:
        await leader.close()
        await replica.close()


async def test_a_postgresql_leader_whose_session_dies_can_no_longer_commit(
    tmp_path: Path,
) -> None:
    async with postgres_database(tmp_path) as database:
        await _leader_session_dies(database)


async def _leader_session_dies(database: DatabaseUnderTest) -> None:
    leader, replica = [await open_store(database.settings) for _ in range(2)]
    try:
        tenant = (await make_tenant(leader, "acme")).tenant
        work = (await submit(leader, tenant.tenant_id)).work
        lease = await leader.try_acquire_leadership()
        assert lease is not None
        assert await end_leader_session(replica, database.settings.database_schema) == [True]
        with pytest.raises(LeadershipLostError):
            await leader.commit_pass(
                PassWrite(placements=(placement(work.work_id, "n1"),)), lease=lease
            )
        assert not lease.held
        assert (await leader.find_work(work.work_id)) == work
        successor = await replica.try_acquire_leadership()
        assert successor is not None
        await replica.commit_pass(
            PassWrite(placements=(placement(work.work_id, "n1"),)), lease=successor
        )
        await successor.release()
    finally:
        await leader.close()
        await replica.close()


async def test_a_postgresql_leader_cancelled_mid_statement_loses_leadership(
    tmp_path: Path,
) -> None:
    """A leader's statement cancelled in flight (shutdown, a timeout) ends its session,
    and the lock with it: the lease must not go on committing from a new session while
    another replica leads (split brain)."""
    async with postgres_database(tmp_path) as database:
        leader, replica = [await open_store(database.settings) for _ in range(2)]
        try:
            tenant = (await make_tenant(leader, "acme")).tenant
            work = (await submit(leader, tenant.tenant_id)).work
            lease = await leader.try_acquire_leadership()
            assert isinstance(lease, PostgresLease)
            leader_pid = await _lock_holder(replica, database)

            async def slow_statement() -> None:
                async with lease.transaction() as connection:
                    await connection.execute(text("SELECT pg_sleep(30)"))

            async with asyncio.timeout(20), asyncio.TaskGroup() as tasks:
                statement = tasks.create_task(slow_statement())
                await eventually_async(
                    lambda: _runs_pg_sleep(replica, leader_pid),
                    message="the leader's statement never started",
                )
                statement.cancel()
            assert statement.cancelled()  # the cancellation stays one
            assert not lease.held
            with pytest.raises(LeadershipLostError):
                await lease.check()
            with pytest.raises(LeadershipLostError):
                await leader.commit_pass(
                    PassWrite(placements=(placement(work.work_id, "n1"),)), lease=lease
                )
            successor = await replica.try_acquire_leadership()
            assert successor is not None
            placed = await replica.commit_pass(
                PassWrite(placements=(placement(work.work_id, "n2"),)), lease=successor
            )
            assert [w.state for w in placed.work] == ["scheduled"]
            assert set(placed.node_generations) == {"n2"}
            await successor.release()
        finally:
            await leader.close()
            await replica.close()


async def _lock_holder(store: Store, database: DatabaseUnderTest) -> int:
    """The backend pid of the session that holds the leader's advisory lock."""
    return await leader_lock_holder(store, database.settings.database_schema)


async def _runs_pg_sleep(store: Store, pid: int) -> bool:
    async with store._read() as connection:
        query = text(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE pid = :pid AND state = 'active' AND query LIKE '%pg_sleep%'"
        )
        return bool((await connection.execute(query, {"pid": pid})).scalar_one())


async def test_the_sqlite_lock_file_lives_beside_the_database(tmp_path: Path) -> None:
    async with await open_store(sqlite_database(tmp_path).settings) as store:
        lease = await store.try_acquire_leadership()
        assert lease is not None
        lock_file = tmp_path / "data" / "greenfed.db.leader.lock"
        assert lock_file.read_text().strip() == str(os.getpid())
        await lease.release()


async def test_closing_a_store_hands_its_leadership_on(database: DatabaseUnderTest) -> None:
    leader, replica = [await open_store(database.settings) for _ in range(2)]
    try:
        assert await leader.try_acquire_leadership() is not None
        assert await replica.try_acquire_leadership() is None
        await leader.close()
        lease = await replica.try_acquire_leadership()
        assert lease is not None
        await lease.release()
    finally:
        await replica.close()


async def test_a_lease_leads_only_its_own_database(tmp_path: Path) -> None:
    async with (
        await open_store(StoreSettings(data_dir=str(tmp_path / "one"))) as one,
        await open_store(StoreSettings(data_dir=str(tmp_path / "two"))) as two,
    ):
        lease = await one.try_acquire_leadership()
        assert lease is not None
        with pytest.raises(LeadershipLostError, match="another database"):
            await two.commit_pass(PassWrite(), lease=lease)
