"""A `greenfed store backup` that succeeds says nothing on stderr (an hourly cron job
mails whatever it writes there), and neither does a restore, `--force` over a store or
not: SQLAlchemy's warning that it cannot reflect the expression index on work names
(v23) is not for the person who runs them. The restored store has that index all the
same (its migrations make it). `greenfed` as a separate process, as cron runs it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import text

from cloud.store import NewTenant, open_store
from cloud.store.migrations.v0023_work_name_index import INDEX_NAME
from shared.settings import StoreSettings
from tests.store.databases import DatabaseUnderTest, postgres_database, sqlite_database
from tests.support.processes import greenfed_env, run_greenfed

pytestmark = pytest.mark.timeout(120)


def config(settings: StoreSettings, path: Path) -> Path:
    lines = [f"data_dir = {settings.data_dir!r}"]
    if settings.database_url:
        lines.append(f"database_url = {settings.database_url!r}")
        lines.append(f"database_schema = {settings.database_schema!r}")
    path.write_text("[store]\n" + "\n".join(lines) + "\n", encoding="utf-8")
    return path


@contextlib.asynccontextmanager
async def another_database(
    database: DatabaseUnderTest, tmp_path: Path
) -> AsyncIterator[DatabaseUnderTest]:
    """An empty database of the same backend to restore into."""
    if database.kind == "sqlite":
        yield sqlite_database(tmp_path / "target")
        return
    async with postgres_database(tmp_path / "target") as target:
        yield target


async def has_name_index(settings: StoreSettings) -> bool:
    async with await open_store(settings) as store, store._engine.connect() as connection:
        if store._engine.dialect.name == "postgresql":
            query = "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()"
        else:
            query = "SELECT name FROM sqlite_master WHERE type = 'index'"
        return INDEX_NAME in {row[0] for row in await connection.execute(text(query))}


async def test_a_backup_and_its_restores_write_nothing_to_stderr(
    database: DatabaseUnderTest, tmp_path: Path
) -> None:
    async with await open_store(database.settings) as store:
        await store.create_tenant(NewTenant(name="acme"))
    backup = tmp_path / "hourly.backup"
    source = config(database.settings, tmp_path / "source.toml")
    env = greenfed_env()

    code, out, err = await run_greenfed(
        ["store", "backup", "--config", str(source), str(backup)], env
    )
    assert (code, err) == (0, ""), out
    assert f"written to {backup}" in out

    async with another_database(database, tmp_path) as target_database:
        target = str(config(target_database.settings, tmp_path / "target.toml"))
        code, out, err = await run_greenfed(
            ["store", "restore", "--config", target, str(backup)], env
        )
        assert (code, err) == (0, ""), out
        # Over a store (which has the index): what is there is read to be replaced.
        code, out, err = await run_greenfed(
            ["store", "restore", "--config", target, "--force", str(backup)], env
        )
        assert (code, err) == (0, ""), out
        assert out.startswith("replaced what ")
        assert await has_name_index(target_database.settings)
