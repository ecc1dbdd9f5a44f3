"""Apply the schema migrations at start, safely when several processes start at once.

Each migration runs in its own transaction together with the `schema_version` row
that records it, so a crash leaves the database at a whole version. Concurrent
starters are serialised: on PostgreSQL by a session-level advisory lock held for the
whole run (per schema), on SQLite by each migration's `BEGIN IMMEDIATE` write lock;
either way every migration re-reads the version under the lock and skips what
another process already applied.

A database whose version is higher than this code knows was written by a newer
greenfed: we refuse to start rather than run old code against a schema it cannot
understand.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import func, insert, select, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from cloud.store.engine import WRITE_OPTION, DatabaseTarget
from cloud.store.errors import SchemaMismatchError, SchemaTooNewError
from cloud.store.locks import advisory_key, current_namespace
from cloud.store.migrations import MIGRATIONS, SchemaMigration, check_order
from cloud.store.schema import schema_version


@dataclass(frozen=True, slots=True)
class MigrationReport:
    from_version: int
    to_version: int
    applied: tuple[str, ...]  # "0001_initial", in order


async def migrate(
    engine: AsyncEngine,
    target: DatabaseTarget,
    *,
    migrations: tuple[SchemaMigration, ...] = MIGRATIONS,
    clock: Callable[[], float] = time.time,
) -> MigrationReport:
    check_order(migrations)
    if target.backend == "postgresql":
        return await _migrate_postgres(engine, target, migrations, clock)
    return await _migrate_sqlite(engine, migrations, clock)


async def applied_version(
    connection: AsyncConnection, migrations: tuple[SchemaMigration, ...] = MIGRATIONS
) -> int:
    """The database's version; raises if it is newer than the code or disagrees with it
    (also what a backup checks before it reads, cloud/store/backup.py)."""
    rows = (
        await connection.execute(
            select(schema_version.c.version, schema_version.c.name).order_by(
                schema_version.c.version
            )
        )
    ).all()
    known = {migration.version: migration.name for migration in migrations}
    newest = rows[-1].version if rows else 0
    if newest > len(migrations):
        raise SchemaTooNewError(
            f"the database is at schema version {newest}, but this greenfed knows versions "
            f"up to {len(migrations)}: it was upgraded by a newer greenfed. Run that version "
            "(or newer), or point store.database_url at another database"
        )
    for row in rows:
        if known.get(row.version) != row.name:
            raise SchemaMismatchError(
                f"the database's migration {row.version} is {row.name!r}, but this greenfed's "
                f"is {known.get(row.version)!r}: the database belongs to another build"
            )
    versions = [row.version for row in rows]
    if versions != list(range(1, newest + 1)):
        raise SchemaMismatchError(f"the database's migration history has gaps: {versions}")
    return int(newest)


async def apply_migration(
    connection: AsyncConnection, migration: SchemaMigration, clock: Callable[[], float]
) -> None:
    """One migration and its `schema_version` row, in the caller's transaction (a restore
    migrates an older backup forward this way, cloud/store/restore.py)."""
    await connection.run_sync(migration.upgrade)
    await connection.execute(
        insert(schema_version).values(
            version=migration.version, name=migration.name, applied_at=clock()
        )
    )


def _label(migration: SchemaMigration) -> str:
    return f"{migration.version:04d}_{migration.name}"


async def _migrate_sqlite(
    engine: AsyncEngine, migrations: tuple[SchemaMigration, ...], clock: Callable[[], float]
) -> MigrationReport:
    writer = engine.execution_options(**{WRITE_OPTION: True})
    async with writer.begin() as connection:
        await connection.run_sync(schema_version.create, checkfirst=True)
        start = await applied_version(connection, migrations)
    applied: list[str] = []
    for migration in migrations[start:]:
        # BEGIN IMMEDIATE: a concurrent starter waits here (busy timeout), then skips.
        async with writer.begin() as connection:
            if await applied_version(connection, migrations) >= migration.version:
                continue
            await apply_migration(connection, migration, clock)
            applied.append(_label(migration))
    return MigrationReport(start, len(migrations), tuple(applied))


async def _migrate_postgres(
    engine: AsyncEngine,
    target: DatabaseTarget,
    migrations: tuple[SchemaMigration, ...],
    clock: Callable[[], float],
) -> MigrationReport:
    async with engine.connect() as connection:
        namespace = target.schema or await current_namespace(connection)
        key = advisory_key(namespace, "migrate")
        await connection.execute(select(func.pg_advisory_lock(key)))
        await connection.commit()
        try:
            async with connection.begin():
                if target.schema:
                    quoted = engine.dialect.identifier_preparer.quote_identifier(target.schema)
                    await connection.execute(text(f"CREATE SCHEMA IF NOT EXISTS {quoted}"))
                await connection.run_sync(schema_version.create, checkfirst=True)
                start = await applied_version(connection, migrations)
            applied: list[str] = []
            for migration in migrations[start:]:
                async with connection.begin():
                    await apply_migration(connection, migration, clock)
                    applied.append(_label(migration))
            await connection.execute(select(func.pg_advisory_unlock(key)))
            await connection.commit()
        except BaseException:
            # A pooled connection would keep the session lock; closing it releases it.
            await connection.invalidate()
            raise
    return MigrationReport(start, len(migrations), tuple(applied))
