"""A restore on PostgreSQL sees every running replica of its store, API-only ones
(`scheduling.enabled = false`) included, and refuses to replace the store under them,
`--force` or not; replicas of another schema do not hold it back, and the lock that
marks a replica neither blocks other replicas nor backups (docs/operations.md)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from cloud.store import Store, open_store
from cloud.store.backup import take_backup
from cloud.store.errors import StoreInUseError
from cloud.store.restore import restore_backup
from tests.api.support import bearer, job_spec, running_api
from tests.store.builders import make_tenant
from tests.store.databases import POSTGRES_URL, DatabaseUnderTest, postgres_database
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def postgres(tmp_path: Path) -> AsyncIterator[DatabaseUnderTest]:
    async with postgres_database(tmp_path) as database:
        yield database


async def running_replica(database: DatabaseUnderTest) -> Store:
    """A store that listens for changes, as every `greenfed cloud` replica's does."""
    store = await open_store(database.settings)
    store.listen_for_changes()
    assert store.change_listener is not None
    await asyncio.wait_for(store.change_listener.listening.wait(), 10)
    return store


async def tenant_names(database: DatabaseUnderTest) -> set[str]:
    async with await open_store(database.settings) as store:
        return {tenant.name for tenant in await store.list_tenants()}


async def test_a_restore_refuses_a_store_an_api_only_replica_serves_until_it_stops(
    postgres: DatabaseUnderTest, tmp_path: Path
) -> None:
    backup = tmp_path / "early.backup"
    async with running_api(postgres) as api:  # scheduling disabled: it never leads
        listener = api.store.change_listener
        assert listener is not None
        await asyncio.wait_for(listener.listening.wait(), 10)
        await api.tenant("early")
        await take_backup(postgres.settings, backup, greenfed_version="test")
        later = await api.tenant("later")
        with pytest.raises(StoreInUseError, match="API replica") as refused:
            await restore_backup(postgres.settings, backup, force=True)
        assert "API-only replicas included" in str(refused.value)
        # Refused before touching anything: the replica goes on serving its store.
        response = await api.client.post("/v1/jobs", json=job_spec(), headers=bearer(later))
        assert response.status == 201, await response.text()
    assert {"early", "later"} <= await tenant_names(postgres)

    report = await restore_backup(postgres.settings, backup, force=True)
    assert report.replaced is not None
    assert "later" not in await tenant_names(postgres)


async def test_a_replica_whose_listening_connection_came_back_is_seen_again(
    postgres: DatabaseUnderTest, tmp_path: Path
) -> None:
    replica = await running_replica(postgres)
    try:
        await make_tenant(replica, "kept")
        backup = tmp_path / "store.backup"
        await take_backup(postgres.settings, backup, greenfed_version="test")
        listener = replica.change_listener
        assert listener is not None
        engine = create_async_engine(make_url(POSTGRES_URL).set(drivername="postgresql+asyncpg"))
        try:
            async with engine.begin() as connection:
                await connection.execute(
                    text("SELECT pg_terminate_backend(:pid)"), {"pid": listener.backend_pid}
                )
        finally:
            await engine.dispose()
        await eventually(
            lambda: listener.connects == 2 and listener.listening.is_set(),
            message="the listener did not reconnect",
        )
        with pytest.raises(StoreInUseError, match="API replica"):
            await restore_backup(postgres.settings, backup, force=True)
    finally:
        await replica.close()
    await restore_backup(postgres.settings, backup, force=True)


async def test_replicas_share_the_lock_and_backups_go_on_but_other_schemas_are_apart(
    tmp_path: Path,
) -> None:
    async with (
        postgres_database(tmp_path / "one") as served,
        postgres_database(tmp_path / "other") as apart,
    ):
        first = await running_replica(served)
        try:
            second = await running_replica(served)  # shared: it does not wait for the first
            try:
                await make_tenant(second, "written")
                backup = tmp_path / "served.backup"
                await take_backup(served.settings, backup, greenfed_version="test")
                # Another installation's restore, in another schema of the same database.
                await restore_backup(apart.settings, backup)
                assert await tenant_names(apart) == {"written"}
                with pytest.raises(StoreInUseError):
                    await restore_backup(served.settings, backup, force=True)
            finally:
                await second.close()
            with pytest.raises(StoreInUseError):  # one replica still runs
                await restore_backup(served.settings, backup, force=True)
        finally:
            await first.close()
        await restore_backup(served.settings, backup, force=True)
