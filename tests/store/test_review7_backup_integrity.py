"""A backup file is whole or refused (gzip's checksum and length are checked, nothing may
follow the trailer, JSON nested too deep is a damaged line), and on PostgreSQL a backup
and a migration never overlap: a table a migration rewrites is never read as empty."""

from __future__ import annotations

import asyncio
import gzip
import struct
import time
import zlib
from pathlib import Path
from typing import Any

import msgspec
import pytest
from sqlalchemy import text

from cloud.store import open_store
from cloud.store.backup import take_backup
from cloud.store.backup_file import (
    BackupColumn,
    BackupHeader,
    BackupReader,
    BackupTable,
    BackupWriter,
    looks_like_backup,
)
from cloud.store.engine import build_engine, resolve_database
from cloud.store.errors import BackupFormatError
from cloud.store.locks import advisory_key
from cloud.store.migrate import apply_migration, migrate
from cloud.store.migrations import MIGRATIONS
from cloud.store.restore import restore_backup
from tests.store.builders import make_tenant
from tests.store.databases import DatabaseUnderTest, postgres_database
from tests.support.waiting import eventually_async

pytestmark = pytest.mark.timeout(60)

# `{"deep":` then 3,000 arrays: past msgspec's nesting guard (RecursionError).
_TOO_DEEP = b"[" * 3000 + b"]" * 3000


def _small_backup(path: Path, *, extra_header: bytes = b"") -> Path:
    """A backup of one table with two rows (a JSON document column among its values)."""
    header = BackupHeader(
        format="greenfed-store-backup",
        format_version=1,
        created_at=1.0,
        greenfed_version="test",
        source_backend="sqlite",
        source="sqlite:///x",
        schema_version=1,
        migrations=("initial",),
        cluster_id=None,
        tables=(BackupTable("a", (BackupColumn("name", "text"), BackupColumn("doc", "text"))),),
    )
    writer = BackupWriter(path, header)
    writer.start_table("a")
    writer.write_rows([("first", '{"k": 1}'), ("second", '{"k": 2}')])
    writer.finish()
    if extra_header:
        lines = gzip.decompress(path.read_bytes()).splitlines(keepends=True)
        lines[0] = lines[0][:-2] + b"," + extra_header + b"}\n"
        path.write_bytes(gzip.compress(b"".join(lines)))
    return path


def _read_whole(path: Path, documents: dict[str, Any] | None = None) -> int:
    """Every row of the backup, read as a restore reads it; how many."""
    reader = BackupReader(path)
    try:
        reader.read_as({}, documents or {})
        rows = 0
        while (batch := reader.next_batch(100)) is not None:
            rows += len(batch[1])
        return rows
    finally:
        reader.close()


def _with_wrong_checksum(good: bytes, change: tuple[bytes, bytes]) -> bytes:
    """The backup with one value changed, compressed again, and the original's CRC32 and
    length in its footer: what a flipped bit in the compressed data reads as."""
    old, new = change
    assert len(old) == len(new)
    plain = gzip.decompress(good)
    assert plain.count(old) == 1
    changed = gzip.compress(plain.replace(old, new), mtime=0)
    assert struct.unpack("<I", good[-8:-4])[0] == zlib.crc32(plain)
    return changed[:-8] + good[-8:]


def test_the_small_backup_reads_whole(tmp_path: Path) -> None:
    assert _read_whole(_small_backup(tmp_path / "good.backup")) == 2


def test_a_wrong_checksum_or_a_footer_cut_short_is_refused(tmp_path: Path) -> None:
    good = _small_backup(tmp_path / "good.backup").read_bytes()
    damaged = {
        "wrong-crc": _with_wrong_checksum(good, (b'"second"', b'"secone"')),
        **{f"cut-{n}": good[:-n] for n in range(1, 9)},
    }
    for name, data in damaged.items():
        path = tmp_path / f"{name}.backup"
        path.write_bytes(data)
        with pytest.raises(BackupFormatError, match="damaged"):
            _read_whole(path)


def test_anything_after_the_trailer_is_refused(tmp_path: Path) -> None:
    good = _small_backup(tmp_path / "good.backup").read_bytes()
    plain = gzip.decompress(good)
    appended = {
        "garbage": good + b"garbage",
        "the-backup-twice": good + good,
        "a-gzip-member": good + gzip.compress(b'{"x": 1}\n'),
        "a-line": gzip.compress(plain + b'["third", "{}"]\n'),
        "blank-lines": gzip.compress(plain + b"\n\n"),
    }
    for name, data in appended.items():
        path = tmp_path / f"{name}.backup"
        path.write_bytes(data)
        with pytest.raises(BackupFormatError):
            _read_whole(path)


def test_json_nested_too_deep_is_a_damaged_file_not_a_crash(tmp_path: Path) -> None:
    deep_header = _small_backup(
        tmp_path / "deep-header.backup", extra_header=b'"deep":' + _TOO_DEEP
    )
    assert not looks_like_backup(deep_header)
    with pytest.raises(BackupFormatError, match="not a greenfed store backup"):
        _read_whole(deep_header)

    good = _small_backup(tmp_path / "good.backup")
    lines = gzip.decompress(good.read_bytes()).splitlines(keepends=True)
    row = msgspec.json.decode(lines[2])
    row[1] = '{"deep": ' + _TOO_DEEP.decode() + "}"
    lines[2] = msgspec.json.encode(row) + b"\n"
    deep_document = tmp_path / "deep-document.backup"
    deep_document.write_bytes(gzip.compress(b"".join(lines)))
    documents = {"a": {"doc": msgspec.json.Decoder(dict[str, Any])}}
    with pytest.raises(BackupFormatError, match=r"a\.doc in row 1"):
        _read_whole(deep_document, documents)


async def test_a_backup_whose_checksum_fails_is_refused_and_changes_nothing(
    database: DatabaseUnderTest, tmp_path: Path
) -> None:
    async with await open_store(database.settings) as store:
        await make_tenant(store, "kept")
    good = tmp_path / "good.backup"
    await take_backup(database.settings, good, greenfed_version="test")
    damaged = tmp_path / "damaged.backup"
    damaged.write_bytes(_with_wrong_checksum(good.read_bytes(), (b'"kept"', b'"kepu"')))
    with pytest.raises(BackupFormatError, match="damaged"):
        await restore_backup(database.settings, damaged, force=True)
    async with await open_store(database.settings) as store:
        assert [t.name for t in await store.list_tenants()] == ["kept"]


# --- PostgreSQL: a backup and a migration never overlap ---------------------------------

_USAGE_MARK = text(
    "INSERT INTO usage_marks (node_id, instance_id, seq, sampled_at, energy_j) "
    "VALUES ('gpu-1', 'i-1', 7, 1.0, '{\"gpu\": 1.5}')"
)
# v21 rewrites usage_marks (ALTER COLUMN TYPE): the table a backup reads must not be empty.
_BEFORE_REWRITE = 20


# A bigint advisory key is in pg_locks as its high and low 32 bits (objsubid 1).
_ADVISORY_WAITS = text(
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
    "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
    "AND classid::bigint = :high AND objid::bigint = :low AND objsubid = 1"
)


async def _waiting_for_migration_lock(database: DatabaseUnderTest) -> bool:
    """Whether a session waits for the store's migration lock (it is per schema: other
    tests' waits are not counted)."""
    target = resolve_database(database.settings)
    assert target.schema
    unsigned = advisory_key(target.schema, "migrate") & (2**64 - 1)
    engine = build_engine(target, database.settings)
    try:
        async with engine.connect() as connection:
            waiting = await connection.execute(
                _ADVISORY_WAITS,
                {"high": unsigned >> 32, "low": unsigned & 0xFFFFFFFF},
            )
            return int(waiting.scalar_one()) > 0
    finally:
        await engine.dispose()


async def _until_waiting_or_done(database: DatabaseUnderTest, task: asyncio.Task[Any]) -> None:
    async def waiting_or_done() -> bool:
        return task.done() or await _waiting_for_migration_lock(database)

    await eventually_async(
        waiting_or_done, message="it neither finished nor waited for the migration lock"
    )


async def _store_before_rewrite(database: DatabaseUnderTest) -> None:
    """A store at schema version 20 with one usage mark."""
    target = resolve_database(database.settings)
    engine = build_engine(target, database.settings)
    try:
        await migrate(engine, target, migrations=MIGRATIONS[:_BEFORE_REWRITE])
        async with engine.begin() as connection:
            await connection.execute(_USAGE_MARK)
    finally:
        await engine.dispose()


async def _usage_marks(database: DatabaseUnderTest) -> int:
    engine = build_engine(resolve_database(database.settings), database.settings)
    try:
        async with engine.connect() as connection:
            count = await connection.execute(text("SELECT count(*) FROM usage_marks"))
            return int(count.scalar_one())
    finally:
        await engine.dispose()


async def test_a_migration_waits_for_a_running_backup(tmp_path: Path) -> None:
    """A replica of a newer greenfed starts (and migrates) while the hourly backup runs."""
    async with postgres_database(tmp_path) as database:
        await _store_before_rewrite(database)
        target = resolve_database(database.settings)
        engine = build_engine(target, database.settings)
        migration: asyncio.Task[Any] | None = None

        async def migrate_meanwhile(_table: str, _rows: int) -> None:
            nonlocal migration
            if migration is None:
                migration = asyncio.create_task(migrate(engine, target))
                await _until_waiting_or_done(database, migration)

        try:
            report = await take_backup(
                database.settings,
                tmp_path / "store.backup",
                greenfed_version="test",
                on_table=migrate_meanwhile,
            )
            assert migration is not None
            async with asyncio.timeout(20):
                migrated = await migration
        finally:
            if migration is not None and not migration.done():
                migration.cancel()
            await engine.dispose()
        assert (report.header.schema_version, report.rows["usage_marks"]) == (_BEFORE_REWRITE, 1)
        assert migrated.to_version == len(MIGRATIONS)
        assert await _usage_marks(database) == 1


async def test_a_backup_waits_for_a_running_migration(tmp_path: Path) -> None:
    async with postgres_database(tmp_path) as database:
        await _store_before_rewrite(database)
        target = resolve_database(database.settings)
        assert target.schema
        engine = build_engine(target, database.settings)
        backup: asyncio.Task[Any] | None = None
        try:
            async with engine.connect() as migrator:
                # What `migrate` holds while it applies migrations (here in one transaction).
                await migrator.begin()
                lock = text("SELECT pg_advisory_xact_lock(:key)")
                await migrator.execute(lock, {"key": advisory_key(target.schema, "migrate")})
                backup = asyncio.create_task(
                    take_backup(database.settings, tmp_path / "store.backup", greenfed_version="t")
                )
                await _until_waiting_or_done(database, backup)
                assert not backup.done(), "the backup did not wait for the migration"
                for later in MIGRATIONS[_BEFORE_REWRITE:]:
                    await apply_migration(migrator, later, time.time)
                await migrator.commit()
            async with asyncio.timeout(20):
                report = await backup
        finally:
            if backup is not None and not backup.done():
                backup.cancel()
            await engine.dispose()
        assert (report.header.schema_version, report.rows["usage_marks"]) == (len(MIGRATIONS), 1)


async def test_a_restore_waits_for_a_running_backup_and_both_finish(tmp_path: Path) -> None:
    async with postgres_database(tmp_path) as database:
        async with await open_store(database.settings) as store:
            await make_tenant(store, "early")
        early = tmp_path / "early.backup"
        await take_backup(database.settings, early, greenfed_version="test")
        async with await open_store(database.settings) as store:
            await make_tenant(store, "later")
        restore: asyncio.Task[Any] | None = None

        async def restore_meanwhile(_table: str, _rows: int) -> None:
            nonlocal restore
            if restore is None:
                restore = asyncio.create_task(restore_backup(database.settings, early, force=True))
                await _until_waiting_or_done(database, restore)
                assert not restore.done(), "the restore ran during the backup"

        try:
            report = await take_backup(
                database.settings,
                tmp_path / "both.backup",
                greenfed_version="test",
                on_table=restore_meanwhile,
            )
            assert restore is not None
            async with asyncio.timeout(20):
                await restore
        finally:
            if restore is not None and not restore.done():
                restore.cancel()
        assert report.rows["tenants"] == 2
        async with await open_store(database.settings) as store:
            assert [t.name for t in await store.list_tenants()] == ["early"]
