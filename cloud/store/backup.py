"""Taking a backup of the store while the control plane runs (docs/operations.md).

Every table is read in one transaction, so a backup is the store at one instant: a
transaction that committed before it is in the file whole, one that committed after it
not at all, whatever the control plane writes meanwhile. On SQLite that is one read
transaction in WAL mode (its snapshot holds from its first read to its end while the
writer goes on: in WAL neither waits for the other); on PostgreSQL a REPEATABLE READ,
READ ONLY transaction, the snapshot `pg_dump` takes too.

A PostgreSQL snapshot does not cover a migration, though: a table an `ALTER ... TYPE`
rewrites after the snapshot was taken reads as empty in it (the rewritten rows are
newer than the snapshot). So a backup holds the migrations' advisory lock shared from
before its snapshot to its end: a migration (another replica, a newer greenfed starting)
waits for the backup, and a backup for a running migration; a restore takes the lock
exclusively, so it and a backup wait for each other alike. Backups never wait for each
other. SQLite needs no such lock: a
migration is a write like any other there, invisible to a read transaction begun before.

The tables are read as the database has them (reflected), so a database at any schema
version this greenfed knows can be backed up; the rows go into the portable file of
cloud/store/backup_file.py, which a restore reads into either backend.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from sqlalchemy import MetaData, Table, func, inspect, select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, SAWarning
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.types import Boolean, Float, Integer, Numeric, TypeEngine

from cloud.store.backup_file import (
    FORMAT,
    FORMAT_VERSION,
    BackupColumn,
    BackupHeader,
    BackupTable,
    BackupWriter,
    ValueKind,
    looks_like_backup,
    partial_path,
)
from cloud.store.engine import DatabaseTarget, build_engine, resolve_database
from cloud.store.errors import NotAStoreError, StoreError, StoreUnavailableError
from cloud.store.locks import advisory_key, current_namespace
from cloud.store.migrate import applied_version
from cloud.store.migrations import MIGRATIONS
from cloud.store.schema import CLUSTER_ID_SECRET, metadata, schema_version, secrets
from shared.settings import StoreSettings

# greenfed's tables: those the code knows. Another application's tables in the same
# PostgreSQL schema are not ours to copy; a table a migration has not made yet is skipped.
KNOWN_TABLES: Final = frozenset(metadata.tables)
_BATCH_ROWS: Final = 1000

# SQLite's files beside the database (the WAL and its index, the rollback journal):
# replacing one under a live database loses or corrupts its commits.
SQLITE_SIDE_FILE_SUFFIXES: Final = ("-wal", "-shm", "-journal")

# Called after each table with its name and rows (progress; tests write in between).
TableDone = Callable[[str, int], Awaitable[None]]


class BackupPathError(StoreError):
    """A path a backup must not be written to: the store's own database or one of its
    files, a directory, or a file that is not a greenfed backup. Nothing was written."""


@dataclass(frozen=True, slots=True)
class BackupReport:
    path: Path
    size_bytes: int
    header: BackupHeader
    rows: dict[str, int]  # per table, in the file's order
    elapsed_s: float


async def take_backup(
    settings: StoreSettings,
    path: Path,
    *,
    greenfed_version: str,
    on_table: TableDone | None = None,
    clock: Callable[[], float] = time.time,
) -> BackupReport:
    """Write a consistent backup of the store `settings` name to `path`. The store may be
    in use meanwhile. An existing file at `path` is replaced, only once the new one is
    complete, when it is a greenfed backup (or empty); anything else is refused.

    Raises `StoreUnavailableError` (no database there, or it cannot be read),
    `BackupPathError` (see `check_backup_path`), `NotAStoreError`,
    `SchemaTooNewError`/`SchemaMismatchError` (a database this greenfed does not know),
    OSError (the file cannot be written).
    """
    started = time.perf_counter()
    target = resolve_database(settings)
    if target.sqlite_path is not None and not target.sqlite_path.exists():
        raise StoreUnavailableError(
            f"no store database at {target.sqlite_path}: nothing to back up "
            "(store.data_dir, store.database_url)"
        )
    check_backup_path(path, target)
    engine = build_engine(target, settings)
    if target.backend == "postgresql":
        # The snapshot pg_dump takes: every table as of the transaction's first statement.
        engine = engine.execution_options(
            isolation_level="REPEATABLE READ", postgresql_readonly=True
        )
    writer: BackupWriter | None = None
    rows: dict[str, int] = {}
    try:
        async with engine.connect() as connection:
            if target.backend == "postgresql":
                await _keep_migrations_out(connection, target)
            async with connection.begin():
                header, tables = await _snapshot(connection, target, greenfed_version, clock())
                writer = await asyncio.to_thread(BackupWriter, path, header)
                for table in tables:
                    name = str(table.name)
                    rows[name] = await _copy_table(connection, table, writer)
                    if on_table is not None:
                        await on_table(name, rows[name])
        size_bytes = await asyncio.to_thread(writer.finish)
    except (DBAPIError, sqlite3.Error) as error:
        detail = str(error.orig) if isinstance(error, DBAPIError) else str(error)
        raise StoreUnavailableError(
            f"cannot read the database {target.describe()}: {detail}"
        ) from error
    finally:
        if writer is not None and not writer.finished:
            writer.discard()  # failed or cancelled before finish(): no partial file stays
        await engine.dispose()
    return BackupReport(path, size_bytes, header, rows, time.perf_counter() - started)


async def _keep_migrations_out(connection: AsyncConnection, target: DatabaseTarget) -> None:
    """Take the migrations' lock shared, for the session, and commit: the snapshot is taken
    by the next transaction's first statement, once no migration runs. Taken in that
    transaction instead, the lock would be waited for after its snapshot was taken. The
    session holds the lock until its connection closes: the engine is disposed when the
    backup ends, however it ends."""
    namespace = target.schema or await current_namespace(connection)
    await connection.execute(
        select(func.pg_advisory_lock_shared(advisory_key(namespace, "migrate")))
    )
    await connection.commit()


def check_backup_path(path: Path, target: DatabaseTarget) -> None:
    """Refuse a backup path whose replacement would destroy something: the store's own
    SQLite database or one of its side files (through symbolic and hard links, so that
    a mistyped or linked name cannot put a backup in the database's place), a directory,
    or an existing file that is not a greenfed backup (someone else's file; an empty one,
    as `mktemp` leaves, may be replaced)."""
    if target.sqlite_path is not None:
        database = target.sqlite_path.resolve()
        own_files = [
            database,
            *(database.with_name(database.name + suffix) for suffix in SQLITE_SIDE_FILE_SUFFIXES),
        ]
        for written in (path, partial_path(path)):
            for own in own_files:
                if written.resolve() == own or _same_file(written, own):
                    what = "database" if own == database else f"database's {own.name}"
                    raise BackupPathError(
                        f"{path} is the store's own {what} ({own}): a backup written there "
                        "would replace it; write the backup elsewhere"
                    )
    if path.is_dir():
        raise BackupPathError(f"{path} is a directory: give the backup a file name in it")
    if path.exists() and path.stat().st_size > 0 and not looks_like_backup(path):
        raise BackupPathError(
            f"{path} exists and is not a greenfed store backup: refusing to replace it "
            "(remove it first, or choose another name)"
        )


def _same_file(first: Path, second: Path) -> bool:
    try:
        return os.path.samefile(first, second)
    except OSError:  # either is missing: then they are not one file
        return False


async def _snapshot(
    connection: AsyncConnection, target: DatabaseTarget, greenfed_version: str, now: float
) -> tuple[BackupHeader, list[Table]]:
    """The header and greenfed's tables, read inside the backup's transaction."""
    present = await connection.run_sync(lambda sync: set(inspect(sync).get_table_names()))
    if schema_version.name not in present:
        raise NotAStoreError(f"{target.describe()} holds no greenfed store (no schema_version)")
    version = await applied_version(connection)  # refuses a newer or foreign schema
    reflected = MetaData()
    names = sorted(KNOWN_TABLES & present)
    await connection.run_sync(lambda sync: reflect_tables(sync, reflected, names))
    tables = list(reflected.sorted_tables)  # a referenced table before its referrers
    cluster_id = None
    if secrets.name in present:
        query = select(secrets.c.value).where(secrets.c.name == CLUSTER_ID_SECRET)
        cluster_id = (await connection.execute(query)).scalar()
    header = BackupHeader(
        format=FORMAT,
        format_version=FORMAT_VERSION,
        created_at=now,
        greenfed_version=greenfed_version,
        source_backend=target.backend,
        source=target.describe(),
        schema_version=version,
        migrations=tuple(migration.name for migration in MIGRATIONS[:version]),
        cluster_id=cluster_id,
        # str(): reflected names are SQLAlchemy's `quoted_name`, a str subclass.
        tables=tuple(
            BackupTable(
                str(table.name),
                tuple(BackupColumn(str(c.name), value_kind(c.type)) for c in table.columns),
            )
            for table in tables
        ),
    )
    return header, tables


def reflect_tables(connection: Connection, into: MetaData, names: list[str]) -> None:
    """The tables `names` as the database has them, into `into`. SQLAlchemy cannot
    reflect an expression index (v23's ix_work_name) and warns on stderr that it skipped
    it, which a cron job mails every hour: nothing is missed, as a backup copies rows
    only and a restore makes the schema, indexes included, by the migrations."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore",
            message="Skipped unsupported reflection of expression-based index",
            category=SAWarning,
        )
        into.reflect(connection, only=names)


def value_kind(column_type: TypeEngine[Any]) -> ValueKind:
    """How a column's values are written: booleans as booleans (SQLite keeps 0 and 1),
    floats as floats, JSON documents as their text. A restore checks the file's kinds
    against those of the schema it makes (cloud/store/restore.py)."""
    if isinstance(column_type, Boolean):
        return "boolean"
    if isinstance(column_type, Integer):
        return "integer"
    # DOUBLE PRECISION, REAL, FLOAT: a Numeric up to SQLAlchemy 2.0, not from 2.1 on
    # (where backups said "text" for them, and wrote a NaN as null).
    if isinstance(column_type, (Float, Numeric)):
        return "float"
    return "text"


async def _copy_table(connection: AsyncConnection, table: Table, writer: BackupWriter) -> int:
    """Stream one table into the file in primary-key order; its row count."""
    await asyncio.to_thread(writer.start_table, str(table.name))
    query = select(table).order_by(*table.primary_key.columns)
    result = await connection.stream(query)
    count = 0
    async for partition in result.partitions(_BATCH_ROWS):
        batch = [tuple(row) for row in partition]
        await asyncio.to_thread(writer.write_rows, batch)
        count += len(batch)
    return count
