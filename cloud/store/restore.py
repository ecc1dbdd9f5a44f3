"""Restoring a backup (cloud/store/backup.py) into an empty database (docs/operations.md).

All in one transaction, so a restore that fails (a damaged file, a database error,
Ctrl-C) leaves the database as it was, a store that `force` was replacing included:

1. the locks: no control plane may be running on the database (SQLite: the leader's
   `flock` beside the file; PostgreSQL: the leader's advisory lock and the replicas'
   one, which every running replica holds shared, API-only ones included
   (cloud/store/change_notify.py), both tried), and one that starts meanwhile waits for
   the restore before it migrates (SQLite: the write lock, PostgreSQL: the migration
   lock, which a running backup holds shared: the restore waits for it). `force` never
   overrides these: it replaces a store's rows, not one a control plane serves;
2. what is there: a database a newer greenfed migrated is refused (`force` or not: its
   tables this greenfed does not know would stay behind), one holding any row is
   refused unless `force`, and what a forced restore replaces is described;
3. greenfed's tables dropped, made again at the backup's schema version by the
   migrations up to it, and the rows loaded table by table;
4. the remaining migrations, as `open_store` would apply them to the old database: a
   backup of an older greenfed comes out at this one's schema;
5. on PostgreSQL each serial sequence moved past its table's largest value (the rows
   came with their numbers), and the cluster id checked against the header's.

Rows are inserted through untyped columns: each value reaches the driver as the file
has it (a JSON document as text, which PostgreSQL's `json` takes as it is), once the
reader has checked it: of its column's kind, and a JSON document as the store reads it
back (`JSON_DOCUMENTS`).
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import msgspec
from sqlalchemy import MetaData, column, func, insert, inspect, select, table, text
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from cloud.fleet.envelope import CLAIM_DECODER, ENVELOPE_DECODER
from cloud.store.backup import KNOWN_TABLES, reflect_tables, value_kind
from cloud.store.backup_file import (
    BackupHeader,
    BackupReader,
    DocumentDecoders,
    ValueKind,
    describe_counts,
)
from cloud.store.engine import (
    WRITE_OPTION,
    DatabaseTarget,
    build_engine,
    enable_wal,
    resolve_database,
)
from cloud.store.errors import (
    BackupFormatError,
    RestoreTargetNotEmptyError,
    SchemaMismatchError,
    SchemaTooNewError,
    StoreInUseError,
    StoreUnavailableError,
)
from cloud.store.leadership import try_acquire_sqlite
from cloud.store.locks import advisory_key, current_namespace
from cloud.store.migrate import applied_version, apply_migration
from cloud.store.migrations import MIGRATIONS
from cloud.store.schema import CLUSTER_ID_SECRET, schema_version, secrets
from cloud.upgrades.views import STATE_DECODER
from shared.messages import AcceleratorKind
from shared.settings import StoreSettings
from shared.work_literals import PriorityClass

_BATCH_ROWS: Final = 500  # rows per INSERT: well under both drivers' parameter limits
# The kinds a backup's header may give a column of each kind of the schema: a float
# column's is "text" in backups made with SQLAlchemy 2.1, whose Float is no Numeric
# (cloud/store/backup.py `value_kind`); their values are numbers all the same.
_WRITTEN_AS: Final[dict[ValueKind, frozenset[ValueKind]]] = {
    "text": frozenset({"text"}),
    "integer": frozenset({"integer"}),
    "float": frozenset({"float", "text"}),
    "boolean": frozenset({"boolean"}),
}

# How the store reads each JSON column back: a restore decodes every document so, and a
# file changed by hand is refused rather than restored into a store that then fails to
# read it (SQLite checks only some of these columns to be JSON at all, PostgreSQL's
# `json` checks syntax, not shape). The decoders are those of the modules named.
# Documents the store keeps opaque (a spec, a payload, an explanation, an audit detail)
# must be JSON objects, as it checks when it writes them (rows.py `check_json_object`);
# so must a cluster's spec, which the store keeps even where today's rules refuse it
# (clusters.py `_readable_records`).
_OBJECT: Final = msgspec.json.Decoder(dict[str, msgspec.Raw])
_COUNTS: Final = msgspec.json.Decoder(dict[str, int])
_COUNTS_PER_KIND: Final = msgspec.json.Decoder(dict[AcceleratorKind, int])
_STRINGS: Final = msgspec.json.Decoder(tuple[str, ...])
_LABELS: Final = msgspec.json.Decoder(dict[str, str])
_AMOUNTS: Final = msgspec.json.Decoder(dict[str, float])
_TENSORS: Final = msgspec.json.Decoder(list[tuple[str, str, list[int | str | None]]])
JSON_DOCUMENTS: Final[DocumentDecoders] = {
    "tenants": {  # rows.py `tenant_from_row`
        "quotas": _COUNTS,
        "borrowing_limit": _COUNTS_PER_KIND,
        "allowed_priorities": msgspec.json.Decoder(tuple[PriorityClass, ...]),
        "lending_limit": _COUNTS_PER_KIND,
    },
    "audit_log": {"detail": _OBJECT},
    "work": {"spec": _OBJECT, "explanation": _OBJECT},
    "allocations": {"accelerator_ids": _STRINGS},  # rows.py `allocation_from_row`
    "events": {"payload": _OBJECT},
    "models": {"inputs": _TENSORS, "outputs": _TENSORS},  # models.py
    "join_tokens": {"labels": _LABELS, "envelope": ENVELOPE_DECODER},  # enrolment.py
    "enrolled_nodes": {"envelope": ENVELOPE_DECODER},
    "clusters": {"spec": _OBJECT},
    "agent_rollouts": {"state": STATE_DECODER},  # agent_upgrades.py
    "usage_marks": {"energy_j": _AMOUNTS},  # usage.py
    "usage_counterfactuals": {"zone_factors": _AMOUNTS},
    "fair_share_usage": {"accelerator_seconds": _AMOUNTS},  # fair_share.py
    "node_admin": {"taints": _STRINGS, "labels": _LABELS, "approved": CLAIM_DECODER},
    "node_drain_waiting": {"waiting": _STRINGS},  # drain_waiting.py
}
_IN_USE: Final = (
    "a control plane is scheduling on {target}: stop every greenfed cloud (and greenfed "
    "up) that uses it, then restore"
)
_SERVED: Final = (
    "a control plane (an API replica or the scheduling leader) runs on {target}: stop "
    "every greenfed cloud (and greenfed up) that uses it, API-only replicas included, "
    "then restore"
)


@dataclass(frozen=True, slots=True)
class StoreContents:
    """What a database holds before a restore."""

    schema_version: int | None  # None: no greenfed tables
    cluster_id: str | None
    rows: dict[str, int]  # per greenfed table, schema_version left out

    @property
    def empty(self) -> bool:
        return not any(self.rows.values())

    def describe(self) -> str:
        if self.schema_version is None and not self.rows:
            return "no greenfed tables"
        cluster = f", cluster {self.cluster_id}" if self.cluster_id else ""
        return f"schema version {self.schema_version}{cluster}: {describe_counts(self.rows)}"


@dataclass(frozen=True, slots=True)
class RestoreReport:
    target: str  # the database restored into, password hidden
    header: BackupHeader
    rows: dict[str, int]  # loaded, per table
    migrated_to: int  # the schema version the store is at now
    replaced: StoreContents | None  # what `force` replaced; None: the database was empty
    elapsed_s: float


async def restore_backup(
    settings: StoreSettings,
    path: Path,
    *,
    force: bool = False,
    clock: Callable[[], float] = time.time,
) -> RestoreReport:
    """Restore the backup at `path` into the database `settings` name.

    Raises `BackupFormatError` (not a backup, damaged, truncated, changed by hand),
    `SchemaTooNewError` (taken by a newer greenfed, or the database migrated by one),
    `SchemaMismatchError` (another build's migrations), `RestoreTargetNotEmptyError`
    (without `force`), `StoreInUseError` (a control plane runs there, `force` or not),
    `StoreUnavailableError`; after any of them the database is as it was.
    """
    started = time.perf_counter()
    reader = await asyncio.to_thread(BackupReader, path)
    try:
        header = reader.header
        _check_schema(header)
        target = resolve_database(settings)
        engine = build_engine(target, settings)
        try:
            async with _no_leader(target):
                if target.backend == "sqlite":
                    await enable_wal(engine, settings.busy_timeout_s)
                writer = engine.execution_options(**{WRITE_OPTION: True})
                async with writer.begin() as connection:
                    if target.backend == "postgresql":
                        await _postgres_locks(connection, engine, target)
                    before = await survey(connection)
                    _check_target_schema(before, target)
                    if not before.empty and not force:
                        raise RestoreTargetNotEmptyError(target.describe(), before.describe())
                    rows = await _replace(connection, reader, clock)
                    if target.backend == "postgresql":
                        await _advance_sequences(connection)
                    await _check_cluster(connection, header)
        except (IntegrityError, DataError) as error:
            # A row the schema refuses (a value of the wrong type, a broken reference).
            raise BackupFormatError(
                f"{path}: {target.describe()} refused its rows ({error.orig}): the file was "
                "changed, or not made by greenfed"
            ) from error
        except DBAPIError as error:
            if not _a_data_exception(error):
                raise StoreUnavailableError(
                    f"cannot restore into {target.describe()}: {error.orig}"
                ) from error
            raise BackupFormatError(
                f"{path}: {target.describe()} refused its rows ({error.orig}): the file was "
                "changed, or not made by greenfed"
            ) from error
        except sqlite3.Error as error:
            raise StoreUnavailableError(
                f"cannot restore into {target.describe()}: {error}"
            ) from error
        finally:
            await engine.dispose()
    finally:
        reader.close()
    return RestoreReport(
        target=target.describe(),
        header=header,
        rows=rows,
        migrated_to=len(MIGRATIONS),
        replaced=None if before.empty else before,
        elapsed_s=time.perf_counter() - started,
    )


def _a_data_exception(error: DBAPIError) -> bool:
    """A PostgreSQL data exception (SQLSTATE class 22): a value its column cannot hold,
    found by the server or by asyncpg before sending it (an integer past an `integer`
    column's 32 bits: "invalid input for query argument"). SQLAlchemy's asyncpg dialect
    raises these as plain DBAPIErrors, not DataErrors; they are the file's fault."""
    sqlstate = getattr(error.orig, "sqlstate", None)
    return isinstance(sqlstate, str) and sqlstate.startswith("22")


def _check_schema(header: BackupHeader) -> None:
    """Refuse a backup this greenfed cannot read, before touching the database."""
    if header.schema_version > len(MIGRATIONS):
        raise SchemaTooNewError(
            f"the backup was taken at schema version {header.schema_version} (greenfed "
            f"{header.greenfed_version}), and this greenfed knows versions up to "
            f"{len(MIGRATIONS)}: restore it with that greenfed or a newer one"
        )
    ours = tuple(migration.name for migration in MIGRATIONS[: header.schema_version])
    if header.migrations != ours:
        raise SchemaMismatchError(
            f"the backup's migrations {list(header.migrations)} are not this greenfed's "
            f"{list(ours)}: it was taken by another build"
        )


def _check_target_schema(before: StoreContents, target: DatabaseTarget) -> None:
    """Refuse a database a newer greenfed migrated, as `open_store` does, `force` or not:
    the restore would rewrite it at this greenfed's version and leave the tables it does
    not know behind, for the newer greenfed's migrations to find already there."""
    if before.schema_version is not None and before.schema_version > len(MIGRATIONS):
        raise SchemaTooNewError(
            f"{target.describe()} is at schema version {before.schema_version}, but this "
            f"greenfed knows versions up to {len(MIGRATIONS)}: it was upgraded by a newer "
            "greenfed. Restore with that version (or newer), or into an empty database"
        )


@contextlib.asynccontextmanager
async def _no_leader(target: DatabaseTarget) -> AsyncIterator[None]:
    """SQLite: hold the leader's lock for the restore (PostgreSQL's is taken in the
    transaction, `_postgres_locks`)."""
    if target.sqlite_path is None:
        yield
        return
    lease = await asyncio.to_thread(try_acquire_sqlite, target.sqlite_path)
    if lease is None:
        raise StoreInUseError(_IN_USE.format(target=target.describe()))
    try:
        yield
    finally:
        await lease.release()


async def _postgres_locks(
    connection: AsyncConnection, engine: AsyncEngine, target: DatabaseTarget
) -> None:
    if target.schema:
        quoted = engine.dialect.identifier_preparer.quote_identifier(target.schema)
        await connection.execute(text(f"CREATE SCHEMA IF NOT EXISTS {quoted}"))
    namespace = target.schema or await current_namespace(connection)
    # Transaction-level: released at commit or rollback, whatever happens to this process.
    await connection.execute(select(func.pg_advisory_xact_lock(advisory_key(namespace, "migrate"))))
    leader = advisory_key(namespace, "leader")
    if not (await connection.execute(select(func.pg_try_advisory_xact_lock(leader)))).scalar():
        raise StoreInUseError(_IN_USE.format(target=target.describe()))
    # Exclusive, against every running replica's shared hold; a replica that starts or
    # reconnects meanwhile waits for the restore's commit.
    replicas = advisory_key(namespace, "replica")
    if not (await connection.execute(select(func.pg_try_advisory_xact_lock(replicas)))).scalar():
        raise StoreInUseError(_SERVED.format(target=target.describe()))


async def survey(connection: AsyncConnection) -> StoreContents:
    """What the database holds: greenfed's tables, their rows, version and cluster."""
    present = await connection.run_sync(
        lambda sync: sorted(KNOWN_TABLES & set(inspect(sync).get_table_names()))
    )
    rows: dict[str, int] = {}
    for name in present:
        if name != schema_version.name:
            count = select(func.count()).select_from(table(name))
            rows[name] = int((await connection.execute(count)).scalar_one())
    version = None
    if schema_version.name in present:
        version = (await connection.execute(select(func.max(schema_version.c.version)))).scalar()
    cluster_id = None
    if secrets.name in present:
        query = select(secrets.c.value).where(secrets.c.name == CLUSTER_ID_SECRET)
        cluster_id = (await connection.execute(query)).scalar()
    return StoreContents(version if version is not None or not present else 0, cluster_id, rows)


async def _replace(
    connection: AsyncConnection, reader: BackupReader, clock: Callable[[], float]
) -> dict[str, int]:
    """Drop greenfed's tables, make them at the backup's version, load the rows, and
    migrate forward; the rows loaded per table."""
    header = reader.header
    existing = MetaData()
    await connection.run_sync(
        lambda sync: reflect_tables(
            sync, existing, sorted(KNOWN_TABLES & set(inspect(sync).get_table_names()))
        )
    )
    await connection.run_sync(existing.drop_all)
    await connection.run_sync(schema_version.create)
    for migration in MIGRATIONS[: header.schema_version]:
        await connection.run_sync(migration.upgrade)  # its schema_version row is in the file
    reader.read_as(await _check_tables(connection, header), JSON_DOCUMENTS)
    loaded: dict[str, int] = {}
    while (batch := await asyncio.to_thread(reader.next_batch, _BATCH_ROWS)) is not None:
        backup_table, rows = batch
        names = backup_table.column_names
        loaded[backup_table.name] = loaded.get(backup_table.name, 0) + len(rows)
        if rows:
            statement = insert(table(backup_table.name, *(column(name) for name in names)))
            values = [dict(zip(names, row, strict=True)) for row in rows]
            await connection.execute(statement, values)
    if await applied_version(connection) != header.schema_version:
        raise BackupFormatError(
            f"{reader.path}: its schema_version rows do not say version {header.schema_version}"
        )
    for migration in MIGRATIONS[header.schema_version :]:
        await apply_migration(connection, migration, clock)
    return loaded


async def _check_tables(
    connection: AsyncConnection, header: BackupHeader
) -> dict[str, dict[str, ValueKind]]:
    """The file's tables and columns must be exactly those of its schema version, each
    column of the kind the schema gives it; the schema's kinds, table by table, which
    the reader checks every value against (cloud/store/backup_file.py)."""

    def columns(sync: object) -> dict[str, dict[str, ValueKind]]:
        inspector = inspect(sync)
        present = sorted(KNOWN_TABLES & set(inspector.get_table_names()))
        # One catalog query for every table, not one per table (PostgreSQL).
        found = inspector.get_multi_columns(filter_names=present)
        return {
            table: {c["name"]: value_kind(c["type"]) for c in cols}
            for (_, table), cols in found.items()
        }

    made = await connection.run_sync(columns)
    written = {t.name: {c.name: c.kind for c in t.columns} for t in header.tables}
    if {name: set(cols) for name, cols in made.items()} != {
        name: set(cols) for name, cols in written.items()
    }:
        differing = sorted(
            name
            for name in made.keys() | written.keys()
            if set(made.get(name, ())) != set(written.get(name, ()))
        )
        raise BackupFormatError(
            f"the backup's tables disagree with schema version {header.schema_version} "
            f"in {', '.join(differing)}: the file was changed, or not made by greenfed"
        )
    retyped = [
        f"{name}.{column} ({kind}, where the schema has {made[name][column]})"
        for name, cols in sorted(written.items())
        for column, kind in cols.items()
        if kind not in _WRITTEN_AS[made[name][column]]
    ]
    if retyped:
        raise BackupFormatError(
            f"the backup's columns disagree with schema version {header.schema_version} "
            f"in {', '.join(retyped)}: the file was changed, or not made by greenfed"
        )
    return made


async def _advance_sequences(connection: AsyncConnection) -> None:
    """Serial columns (`events.seq`, `audit_log.seq`) continue after the restored rows."""
    query = text(
        "SELECT table_name, column_name FROM information_schema.columns "
        "WHERE table_schema = current_schema() "
        "AND (column_default LIKE 'nextval(%' OR is_identity = 'YES')"
    )
    serials = [(row.table_name, row.column_name) for row in await connection.execute(query)]
    preparer = connection.dialect.identifier_preparer
    for table_name, column_name in serials:
        if table_name not in KNOWN_TABLES:
            continue
        quoted_table = preparer.quote_identifier(table_name)
        quoted_column = preparer.quote_identifier(column_name)
        await connection.execute(
            text(
                f"SELECT setval(pg_get_serial_sequence(:table, :column), "
                f"COALESCE(MAX({quoted_column}), 0) + 1, false) FROM {quoted_table}"
            ),
            {"table": quoted_table, "column": column_name},
        )


async def _check_cluster(connection: AsyncConnection, header: BackupHeader) -> None:
    if header.cluster_id is None:
        return
    query = select(secrets.c.value).where(secrets.c.name == CLUSTER_ID_SECRET)
    restored = (await connection.execute(query)).scalar()
    if restored != header.cluster_id:
        raise BackupFormatError(
            f"the backup's header names cluster {header.cluster_id}, its rows {restored}: "
            "the file was changed"
        )
