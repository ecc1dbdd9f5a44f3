"""Schema migrations: from empty, re-run, concurrent start, refusal of newer databases;
the engine factory's configuration errors; losing the connection."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, insert, inspect, select, text

from cloud.store import (
    SchemaMismatchError,
    SchemaTooNewError,
    StoreConfigError,
    StoreUnavailableError,
    create_store_engine,
    open_store,
    resolve_database,
)
from cloud.store.engine import ACCEPTED_SCHEMES
from cloud.store.migrations import MIGRATIONS
from cloud.store.schema import metadata, schema_version
from shared.settings import DATABASE_URL_SCHEMES, ConfigError, StoreSettings, load_settings
from tests.store.builders import make_tenant, submit
from tests.store.databases import POSTGRES_URL, DatabaseUnderTest, postgres_database
from tests.support.waiting import eventually

HEAD = len(MIGRATIONS)


def _columns(connection: Connection) -> dict[str, set[str]]:
    inspector = inspect(connection)
    return {
        table: {column["name"] for column in inspector.get_columns(table)}
        for table in inspector.get_table_names()
    }


async def test_migrates_an_empty_database_to_the_schema_the_code_uses(
    database: DatabaseUnderTest,
) -> None:
    store = await open_store(database.settings)
    try:
        assert store.migrations.from_version == 0
        assert store.migrations.to_version == HEAD
        assert store.migrations.applied == tuple(f"{m.version:04d}_{m.name}" for m in MIGRATIONS)
        async with create_store_engine(database.settings).connect() as connection:
            columns = await connection.run_sync(_columns)
        expected = {table.name: {c.name for c in table.columns} for table in metadata.sorted_tables}
        assert columns == expected
    finally:
        await store.close()


async def test_running_the_migrations_again_changes_nothing(database: DatabaseUnderTest) -> None:
    first = await open_store(database.settings)
    await first.close()
    second = await open_store(database.settings)
    await second.close()
    assert (second.migrations.from_version, second.migrations.applied) == (HEAD, ())
    engine = create_store_engine(database.settings)
    async with engine.connect() as connection:
        versions = (await connection.execute(select(schema_version.c.version))).scalars().all()
    await engine.dispose()
    assert versions == list(range(1, HEAD + 1))


async def test_processes_starting_at_once_migrate_exactly_once(
    database: DatabaseUnderTest,
) -> None:
    stores = await asyncio.gather(*(open_store(database.settings) for _ in range(4)))
    try:
        applied = [store.migrations.applied for store in stores]
        # Each migration exactly once in all (on SQLite, one store may apply the first
        # and another the next: each migration is its own transaction).
        assert sorted(label for labels in applied for label in labels) == [
            f"{m.version:04d}_{m.name}" for m in MIGRATIONS
        ]
    finally:
        for store in stores:
            await store.close()


async def _insert_version(database: DatabaseUnderTest, version: int, name: str) -> None:
    engine = create_store_engine(database.settings)
    async with engine.begin() as connection:
        await connection.execute(
            insert(schema_version).values(version=version, name=name, applied_at=0.0)
        )
    await engine.dispose()


async def test_refuses_a_database_from_a_newer_greenfed(database: DatabaseUnderTest) -> None:
    await (await open_store(database.settings)).close()
    await _insert_version(database, HEAD + 1, "from_the_future")
    with pytest.raises(SchemaTooNewError, match=rf"schema version {HEAD + 1}.*newer greenfed"):
        await open_store(database.settings)


async def test_refuses_a_database_with_a_different_history(database: DatabaseUnderTest) -> None:
    if database.kind == "postgresql":
        engine = create_store_engine(database.settings)
        async with engine.begin() as connection:
            schema = database.settings.database_schema
            await connection.execute(text(f'CREATE SCHEMA "{schema}"'))
        await engine.dispose()
    engine = create_store_engine(database.settings)
    async with engine.begin() as connection:
        await connection.run_sync(schema_version.create)
        await connection.execute(
            insert(schema_version).values(version=1, name="someone_elses", applied_at=0.0)
        )
    await engine.dispose()
    with pytest.raises(SchemaMismatchError, match="someone_elses"):
        await open_store(database.settings)


async def test_sqlite_runs_in_wal_mode_with_foreign_keys_and_normal_sync(tmp_path: Path) -> None:
    settings = StoreSettings(data_dir=str(tmp_path / "nested" / "data"))
    store = await open_store(settings)
    await store.close()
    assert (tmp_path / "nested" / "data" / "greenfed.db").is_file()
    engine = create_store_engine(settings)
    pragmas: dict[str, Any] = {}
    async with engine.connect() as connection:
        for name in ("journal_mode", "foreign_keys", "synchronous", "busy_timeout"):
            pragmas[name] = (await connection.execute(text(f"PRAGMA {name}"))).scalar()
    await engine.dispose()
    assert pragmas == {
        "journal_mode": "wal",
        "foreign_keys": 1,
        "synchronous": 1,
        "busy_timeout": 5000,
    }


def test_a_database_url_names_the_setting_when_it_is_unusable(tmp_path: Path) -> None:
    bad = {
        "sqlite:///:memory:": "in-memory",
        "postgresql:///test": "needs a host",
    }
    for url, reason in bad.items():
        settings = StoreSettings(database_url=url, data_dir=str(tmp_path))
        with pytest.raises(StoreConfigError, match=rf"^store\.database_url: .*{reason}"):
            resolve_database(settings)


def test_settings_reject_a_database_url_of_an_unknown_scheme() -> None:
    environ = {"GREENFED_STORE__DATABASE_URL": "mongodb://db"}
    with pytest.raises(ConfigError, match=r"GREENFED_STORE__DATABASE_URL: store\.database_url"):
        load_settings(None, environ)
    with pytest.raises(ConfigError, match=r"store\.database_schema: only PostgreSQL"):
        load_settings(None, {"GREENFED_STORE__DATABASE_SCHEMA": "greenfed"})


def test_settings_and_engine_accept_the_same_url_schemes() -> None:
    assert set(DATABASE_URL_SCHEMES) == set(ACCEPTED_SCHEMES)


def test_the_default_data_dir_follows_xdg(tmp_path: Path) -> None:
    settings = StoreSettings()
    assert settings.resolved_data_dir({"XDG_DATA_HOME": str(tmp_path)}) == tmp_path / "greenfed"
    assert settings.resolved_data_dir({}) == Path.home() / ".local" / "share" / "greenfed"


async def test_an_unreachable_postgresql_is_a_clear_error(tmp_path: Path) -> None:
    url = POSTGRES_URL.replace(":5432", ":1")
    settings = StoreSettings(database_url=url, connect_timeout_s=2.0, data_dir=str(tmp_path))
    with pytest.raises(StoreUnavailableError, match=r"^store\.database_url: cannot use") as error:
        await open_store(settings)
    assert "127.0.0.1:1" in str(error.value)


async def test_an_unwritable_data_dir_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(StoreConfigError, match=r"^store\.data_dir: cannot create"):
        await open_store(StoreSettings(data_dir=str(blocker / "data")))


async def test_the_store_reconnects_after_the_server_drops_its_connections(
    tmp_path: Path,
) -> None:
    async with postgres_database(tmp_path) as database:
        store, admin = [await open_store(database.settings) for _ in range(2)]
        try:
            tenant = (await make_tenant(store, "acme")).tenant
            # The tenant's commit is announced on a pooled connection in the background:
            # once sent, the connection read below is the one the next call takes (else
            # the announcement could meet the dead connection first, and the call a new one).
            notifier = store.change_notifier
            assert notifier is not None
            await eventually(lambda: not notifier.busy, message="the change not announced")
            async with store._read() as connection:
                pid = (await connection.execute(text("SELECT pg_backend_pid()"))).scalar()
            async with admin._write() as connection:
                await connection.execute(text(f"SELECT pg_terminate_backend({int(pid or 0)})"))
            # The pooled connection is dead: the call fails clearly, nothing half-done.
            with pytest.raises(StoreUnavailableError, match="lost the connection"):
                await submit(store, tenant.tenant_id, key="k")
            retried = await submit(store, tenant.tenant_id, key="k")
            assert retried.created
        finally:
            await store.close()
            await admin.close()
