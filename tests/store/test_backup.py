"""Backups and restores of the store (cloud/store/backup.py, restore.py), on SQLite and
PostgreSQL and from one into the other: every row comes back, a backup is one instant
while writers commit, a restore refuses what it must and changes nothing when it fails,
and an older backup is migrated forward."""

from __future__ import annotations

import contextlib
import gzip
import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

import msgspec
import pytest
from sqlalchemy import MetaData, inspect, select, text

from cloud.fleet.envelope import NodeClaim
from cloud.store import (
    Actor,
    NewAudit,
    NewDependency,
    NewEvent,
    NewModel,
    PassWrite,
    SchemaTooNewError,
    Store,
    StoreUnavailableError,
    create_store_engine,
    open_store,
)
from cloud.store.backup import take_backup
from cloud.store.backup_file import (
    MAX_ROW_BYTES,
    BackupColumn,
    BackupHeader,
    BackupReader,
    BackupTable,
    BackupWriter,
)
from cloud.store.engine import resolve_database
from cloud.store.enrolment import NewJoinToken
from cloud.store.errors import (
    BackupFormatError,
    NotAStoreError,
    RestoreTargetNotEmptyError,
    StoreInUseError,
)
from cloud.store.fair_share import FairShareRow
from cloud.store.jsontype import JsonDocument
from cloud.store.migrate import migrate
from cloud.store.migrations import MIGRATIONS
from cloud.store.node_admin import NodeAdminRecord
from cloud.store.restore import JSON_DOCUMENTS, restore_backup
from cloud.store.schema import CLUSTER_ID_SECRET, metadata
from cloud.store.tokens import issue_token
from shared.agent_packages import MAX_PACKAGE_BYTES
from tests.store.builders import make_tenant, placement, submit
from tests.store.databases import DatabaseUnderTest, postgres_database, sqlite_database

pytestmark = pytest.mark.timeout(60)

Backend = Literal["sqlite", "postgresql"]


@contextlib.asynccontextmanager
async def empty_database(kind: Backend, tmp_path: Path) -> AsyncIterator[DatabaseUnderTest]:
    """A database of its own to restore into, apart from the `database` fixture's."""
    if kind == "sqlite":
        yield sqlite_database(tmp_path / "restored")
        return
    async with postgres_database(tmp_path / "restored") as database:
        yield database


async def every_row(database: DatabaseUnderTest) -> dict[str, list[tuple[Any, ...]]]:
    """Each of greenfed's tables, every row in primary-key order, as the database has it."""
    engine = create_store_engine(database.settings)
    found: dict[str, list[tuple[Any, ...]]] = {}
    try:
        async with engine.connect() as connection:
            reflected = MetaData()
            await connection.run_sync(
                lambda sync: reflected.reflect(
                    sync, only=sorted(set(metadata.tables) & set(inspect(sync).get_table_names()))
                )
            )
            for table in reflected.sorted_tables:
                query = select(table).order_by(*table.primary_key.columns)
                found[str(table.name)] = [tuple(row) for row in await connection.execute(query)]
    finally:
        await engine.dispose()
    return found


async def fill(store: Store) -> dict[str, str]:
    """Some of everything the store keeps; what a test checks afterwards."""
    admin = await make_tenant(store, "admin", admin=True)
    acme = await make_tenant(store, "acme", quotas={"gpu": 8}, cohort="research")
    actor = Actor(admin.tenant.tenant_id, "admin")
    second = await store.create_token(
        acme.tenant.tenant_id, "ci", audit=NewAudit(actor=actor, action="token.create", target="")
    )
    await store.rotate_token(second.record.token_id, 60.0)
    first = (await submit(store, acme.tenant.tenant_id, key="first", workers=2)).work
    second_job = (await submit(store, acme.tenant.tenant_id, priority="p0")).work
    await store.submit_work(
        acme.tenant.tenant_id,
        kind="training",
        spec=b'{"command": ["python", "eval.py"], "secret_env": {"K": "gfenc1:AAAA"}}',
        priority="p2",
        dependencies=(NewDependency(first.work_id, "succeeded"),),
    )
    lease = await store.try_acquire_leadership()
    assert lease is not None
    async with lease:
        await store.commit_pass(
            PassWrite(
                placements=(
                    placement(first.work_id, "gpu-1", "gpu-2", accelerators=4),
                    placement(second_job.work_id, "gpu-3"),
                ),
                events=(NewEvent(kind="work.explained", payload=b'{"score": 0.5}'),),
                explanations={second_job.work_id: b'{"nodes": 3}'},
                drain_waiting={"gpu-3": (first.work_id,)},
            ),
            lease=lease,
        )
    await store.set_allocation_states([(first.work_id, 0, "running")])
    await store.create_model(
        acme.tenant.tenant_id,
        NewModel(name="mlp", sha256="ab" * 32, size_bytes=123, opset=17, inputs=(), outputs=()),
    )
    join = await store.create_join_token(NewJoinToken(ttl_s=3600, max_uses=3))
    await store.redeem_join_token(join.token, "gpu-1")
    await store.redeem_join_token(join.token, "gpu-2")
    await store.revoke_node("gpu-2")
    await store.put_node_admin(NodeAdminRecord("gpu-3", cordoned=True, taints=("a=b:NoSchedule",)))
    await store.record_event(NewEvent(kind="agent.note", payload=b'{"x": 1.5}', event_id="e-1"))
    await store.set_first_claims(
        {"gpu-1": NodeClaim(site="edge", zone="z1", region="r1", runs_training=True)}
    )
    await store.put_fair_share_usage([FairShareRow("acme", {"gpu": 12.5}, 1.0)])
    return {
        "cluster_id": await store.shared_secret(CLUSTER_ID_SECRET),
        "token": second.token,
        "tenant_id": acme.tenant.tenant_id,
    }


@pytest.mark.parametrize("into", ["sqlite", "postgresql"])
async def test_every_row_comes_back_into_either_backend(
    database: DatabaseUnderTest, into: Backend, tmp_path: Path
) -> None:
    async with await open_store(database.settings) as store:
        facts = await fill(store)
        last_event = await store.last_event_seq()
    backup = tmp_path / "store.backup"
    report = await take_backup(database.settings, backup, greenfed_version="test")
    assert backup.stat().st_mode & 0o777 == 0o600  # hashes and shared secrets inside
    assert report.header.cluster_id == facts["cluster_id"]
    assert report.header.schema_version == len(MIGRATIONS)
    before = await every_row(database)
    assert report.rows == {name: len(rows) for name, rows in before.items()}

    async with empty_database(into, tmp_path) as target:
        restored = await restore_backup(target.settings, backup)
        assert restored.replaced is None
        assert restored.rows == report.rows
        assert await every_row(target) == before
        async with await open_store(target.settings) as store:
            assert store.migrations.applied == ()  # at this greenfed's version already
            # The same cluster, the same credentials; numbering continues after the rows.
            assert await store.shared_secret(CLUSTER_ID_SECRET) == facts["cluster_id"]
            authenticated = await store.authenticate(facts["token"])
            assert authenticated is not None
            assert authenticated.tenant_id == facts["tenant_id"]
            await submit(store, facts["tenant_id"])
            assert await store.last_event_seq() == last_event + 1
            snapshot = await store.load_snapshot()
            assert snapshot.node_generations == {"gpu-1": 1, "gpu-2": 1, "gpu-3": 1}
            assert await store.is_enrolled("gpu-1")
            assert not await store.is_enrolled("gpu-2")


async def test_a_backup_is_one_instant_while_writers_commit(
    database: DatabaseUnderTest, tmp_path: Path
) -> None:
    """Commits made while the backup reads (between its tables) are not in it, in part
    or whole: a torn backup would hold work without its tenant or its first event."""
    async with await open_store(database.settings) as store:
        acme = (await make_tenant(store, "acme")).tenant
        before = {(await submit(store, acme.tenant_id)).work.work_id for _ in range(20)}
        during: set[str] = set()

        async def write_between_tables(table: str, rows: int) -> None:
            if table in ("tenants", "events", "work"):
                late = (await make_tenant(store, f"late-{table}")).tenant
                for tenant_id in (acme.tenant_id, late.tenant_id):
                    during.add((await submit(store, tenant_id)).work.work_id)

        await take_backup(
            database.settings,
            tmp_path / "store.backup",
            greenfed_version="test",
            on_table=write_between_tables,
        )
        committed = {w.work_id for w in (await store.list_work(None, limit=500)).items}
    assert len(during) == 6
    assert during <= committed

    async with empty_database("sqlite", tmp_path) as target:
        await restore_backup(target.settings, tmp_path / "store.backup")
        async with await open_store(target.settings) as restored:
            work = {w.work_id for w in (await restored.list_work(None, limit=500)).items}
            events = await restored.list_events(tenant_id=None, limit=500)
            tenants = {t.name for t in await restored.list_tenants()}
    assert work == before
    assert {event.work_id for event in events} == before
    assert tenants == {"acme"}


async def test_a_store_is_replaced_only_when_forced_and_the_output_says_what_went(
    database: DatabaseUnderTest, tmp_path: Path
) -> None:
    source = sqlite_database(tmp_path / "source")
    async with await open_store(source.settings) as store:
        await make_tenant(store, "from-backup")
    backup = tmp_path / "store.backup"
    await take_backup(source.settings, backup, greenfed_version="test")

    async with await open_store(database.settings) as store:
        await make_tenant(store, "already-here")
        cluster_id = await store.shared_secret(CLUSTER_ID_SECRET)
    with pytest.raises(RestoreTargetNotEmptyError) as refused:
        await restore_backup(database.settings, backup)
    assert f"cluster {cluster_id}" in str(refused.value)
    assert "1 tenants" in refused.value.description
    assert "--force" in str(refused.value)
    assert [t.name for t in await _tenants(database)] == ["already-here"]

    report = await restore_backup(database.settings, backup, force=True)
    assert report.replaced is not None
    assert report.replaced.cluster_id == cluster_id
    assert report.replaced.rows["tenants"] == 1
    assert [t.name for t in await _tenants(database)] == ["from-backup"]


async def _tenants(database: DatabaseUnderTest) -> list[Any]:
    async with await open_store(database.settings) as store:
        return list(await store.list_tenants())


async def test_a_backup_of_an_older_schema_is_migrated_forward(
    database: DatabaseUnderTest, tmp_path: Path
) -> None:
    """A store at version 9 (tokens still in `tenants`): restored, v10 moves its token
    into `tenant_tokens`, and the token authenticates."""
    engine = create_store_engine(database.settings)
    issued = issue_token()
    try:
        await migrate(engine, resolve_database(database.settings), migrations=MIGRATIONS[:9])
        async with engine.begin() as connection:
            await connection.execute(
                text(
                    "INSERT INTO tenants (id, name, token_id, token_hash, quotas, "
                    "borrowing_limit, cohort, allowed_priorities, admin, created_at) VALUES "
                    "('t1', 'old', :token_id, :hash, '{}', '{}', NULL, "
                    '\'["p0", "p1", "p2"]\', false, 1.0)'
                ),
                {"token_id": issued.token_id, "hash": issued.secret_hash},
            )
    finally:
        await engine.dispose()
    backup = tmp_path / "v9.backup"
    report = await take_backup(database.settings, backup, greenfed_version="old")
    assert report.header.schema_version == 9
    assert "tenant_tokens" not in report.rows

    other: Backend = "postgresql" if database.kind == "sqlite" else "sqlite"
    async with empty_database(other, tmp_path) as target:
        restored = await restore_backup(target.settings, backup)
        assert (restored.header.schema_version, restored.migrated_to) == (9, len(MIGRATIONS))
        async with await open_store(target.settings) as store:
            assert store.migrations.from_version == len(MIGRATIONS)
            authenticated = await store.authenticate(issued.token)
            assert authenticated is not None
            assert authenticated.name == "old"


async def test_a_newer_damaged_or_foreign_file_changes_nothing(
    database: DatabaseUnderTest, tmp_path: Path
) -> None:
    async with await open_store(database.settings) as store:
        await make_tenant(store, "kept")
    good = tmp_path / "good.backup"
    await take_backup(database.settings, good, greenfed_version="test")
    lines = gzip.decompress(good.read_bytes()).splitlines(keepends=True)
    header = msgspec.json.decode(lines[0])
    rest = b"".join(lines[1:])

    def variant(name: str, data: bytes) -> Path:
        path = tmp_path / name
        path.write_bytes(data)
        return path

    newer = variant(
        "newer.backup",
        gzip.compress(msgspec.json.encode({**header, "schema_version": 999}) + b"\n" + rest),
    )
    with pytest.raises(SchemaTooNewError, match="schema version 999"):
        await restore_backup(database.settings, newer, force=True)
    damaged = {
        "truncated.backup": good.read_bytes()[: good.stat().st_size // 2],
        "no-trailer.backup": gzip.compress(b"".join(lines[:-1])),
        "foreign.backup": b"PGDMP this is pg_dump's custom format",
        "miscounted.backup": gzip.compress(b"".join(lines[:-1]) + b'{"rows": {"tenants": 7}}\n'),
    }
    for name, data in damaged.items():
        with pytest.raises(BackupFormatError):
            await restore_backup(database.settings, variant(name, data), force=True)
    # Refused after the tables it replaces were dropped: rolled back, they are still there.
    renamed = lines[0].replace(b'"name":"tenants"', b'"name":"tenantz"')
    with pytest.raises(BackupFormatError, match="tenantz"):
        await restore_backup(
            database.settings,
            variant("renamed.backup", gzip.compress(renamed + rest)),
            force=True,
        )
    # ... and half-way through the rows: a tenant twice (the trailer counting it twice).
    start = lines.index(b'{"table":"tenants"}\n')
    trailer = msgspec.json.decode(lines[-1])
    trailer["rows"]["tenants"] += 1
    doubled = [*lines[: start + 2], lines[start + 1], *lines[start + 2 : -1]]
    doubled.append(msgspec.json.encode(trailer) + b"\n")
    with pytest.raises(BackupFormatError, match="refused its rows"):
        await restore_backup(
            database.settings,
            variant("doubled.backup", gzip.compress(b"".join(doubled))),
            force=True,
        )
    assert [t.name for t in await _tenants(database)] == ["kept"]


async def test_a_store_a_newer_greenfed_made_is_refused_even_when_forced(
    database: DatabaseUnderTest, tmp_path: Path
) -> None:
    """As `open_store` refuses it: the restore would rewrite it at this greenfed's version
    and leave the newer greenfed's tables behind, for its next migration to trip on."""
    source = sqlite_database(tmp_path / "source")
    async with await open_store(source.settings) as store:
        await make_tenant(store, "from-backup")
    backup = tmp_path / "store.backup"
    await take_backup(source.settings, backup, greenfed_version="test")
    newer = len(MIGRATIONS) + 1
    async with await open_store(database.settings):
        pass
    engine = create_store_engine(database.settings)
    try:
        async with engine.begin() as connection:
            await connection.execute(text("CREATE TABLE future_things (id TEXT PRIMARY KEY)"))
            await connection.execute(text("INSERT INTO future_things VALUES ('precious')"))
            await connection.execute(
                text(
                    "INSERT INTO schema_version (version, name, applied_at) "
                    "VALUES (:version, 'future_things', 1.0)"
                ),
                {"version": newer},
            )
    finally:
        await engine.dispose()

    for force in (False, True):
        with pytest.raises(SchemaTooNewError, match=f"schema version {newer}"):
            await restore_backup(database.settings, backup, force=force)
    engine = create_store_engine(database.settings)
    try:
        async with engine.connect() as connection:
            version = await connection.execute(text("SELECT max(version) FROM schema_version"))
            assert version.scalar() == newer
            kept = await connection.execute(text("SELECT id FROM future_things"))
            assert kept.scalars().all() == ["precious"]
    finally:
        await engine.dispose()


async def test_a_header_created_at_no_date_holds_is_refused_and_changes_nothing(
    database: DatabaseUnderTest, tmp_path: Path
) -> None:
    """`greenfed store restore` shows when the backup was taken: it must be a date."""
    async with await open_store(database.settings) as store:
        await make_tenant(store, "kept")
    good = tmp_path / "good.backup"
    await take_backup(database.settings, good, greenfed_version="test")
    lines = gzip.decompress(good.read_bytes()).splitlines(keepends=True)
    header = msgspec.json.decode(lines[0])
    for created_at in (1e300, -1e300, 1e18, 253402300800.0):
        odd = tmp_path / f"{created_at}.backup"
        odd.write_bytes(
            gzip.compress(
                msgspec.json.encode({**header, "created_at": created_at})
                + b"\n"
                + b"".join(lines[1:])
            )
        )
        with pytest.raises(BackupFormatError, match="created_at"):
            await restore_backup(database.settings, odd, force=True)
    assert [t.name for t in await _tenants(database)] == ["kept"]


async def test_a_header_longer_than_any_backup_has_is_refused_unread(
    database: DatabaseUnderTest, tmp_path: Path
) -> None:
    """A header names tables and columns: a few kB, never a MiB."""
    async with await open_store(database.settings) as store:
        await make_tenant(store, "kept")
    good = tmp_path / "good.backup"
    await take_backup(database.settings, good, greenfed_version="test")
    lines = gzip.decompress(good.read_bytes()).splitlines(keepends=True)

    header = msgspec.json.decode(lines[0])
    long_header = tmp_path / "long-header.backup"
    long_header.write_bytes(
        gzip.compress(
            msgspec.json.encode({**header, "greenfed_version": "9" * (2 << 20)})
            + b"\n"
            + b"".join(lines[1:])
        )
    )
    with pytest.raises(BackupFormatError, match=r"line longer than 1,048,576 bytes"):
        await restore_backup(database.settings, long_header, force=True)
    assert [t.name for t in await _tenants(database)] == ["kept"]


async def test_a_row_longer_than_any_store_keeps_is_refused_unread(
    database: DatabaseUnderTest, tmp_path: Path
) -> None:
    """A few hundred kB of gzip can hold a line of gigabytes: reading it whole would
    exhaust memory while the restore holds the write lock."""
    async with await open_store(database.settings) as store:
        await make_tenant(store, "kept")
    good = tmp_path / "good.backup"
    await take_backup(database.settings, good, greenfed_version="test")
    lines = gzip.decompress(good.read_bytes()).splitlines(keepends=True)
    # A row of spaces past the bound, as gzip members of one compressed 16 MiB block.
    start = lines.index(b'{"table":"tenants"}\n')
    block_bytes = 16 << 20
    blocks = MAX_ROW_BYTES // block_bytes + 1
    block = gzip.compress(b" " * block_bytes, compresslevel=9)
    bomb = tmp_path / "bomb.backup"
    with bomb.open("wb") as file:
        file.write(gzip.compress(b"".join(lines[: start + 1]) + b"["))
        for _ in range(blocks):
            file.write(block)
        file.write(gzip.compress(b"]\n" + b"".join(lines[start + 1 :])))
    assert bomb.stat().st_size < 2 << 20
    with pytest.raises(BackupFormatError, match=rf"line longer than {MAX_ROW_BYTES:,} bytes"):
        await restore_backup(database.settings, bomb, force=True)
    assert [t.name for t in await _tenants(database)] == ["kept"]


def test_the_longest_row_a_store_keeps_fits_in_a_backups_line() -> None:
    """An agent package of the largest size the API takes, as its row's base64."""
    package_row_bytes = 4 * math.ceil(MAX_PACKAGE_BYTES / 3) + 1024
    assert package_row_bytes < MAX_ROW_BYTES


class ChangedBackup:
    """A good backup's lines, to make copies with one value (or one column's kind) changed."""

    def __init__(self, good: Path) -> None:
        self.lines = gzip.decompress(good.read_bytes()).splitlines(keepends=True)
        self.header = msgspec.json.decode(self.lines[0])
        self.directory = good.parent

    def _columns(self, table: str) -> list[dict[str, str]]:
        return next(t["columns"] for t in self.header["tables"] if t["name"] == table)

    def with_value(self, table: str, column: str, value: object) -> Path:
        """The table's first row with `column` holding `value`."""
        index = [c["name"] for c in self._columns(table)].index(column)
        lines = list(self.lines)
        first = lines.index(msgspec.json.encode({"table": table}) + b"\n") + 1
        row = msgspec.json.decode(lines[first])
        row[index] = value
        lines[first] = msgspec.json.encode(row) + b"\n"
        return self._written(f"{table}.{column}={value!r}", lines)

    def with_kind(self, table: str, column: str, kind: str, value: object) -> Path:
        """As `with_value`, the header saying the column is of `kind`."""
        changed = self.with_value(table, column, value)
        lines = gzip.decompress(changed.read_bytes()).splitlines(keepends=True)
        header = msgspec.json.decode(lines[0])
        columns = next(t["columns"] for t in header["tables"] if t["name"] == table)
        next(c for c in columns if c["name"] == column)["kind"] = kind
        lines[0] = msgspec.json.encode(header) + b"\n"
        return self._written(f"{table}.{column}:{kind}={value!r}", lines)

    def _written(self, name: str, lines: list[bytes]) -> Path:
        path = self.directory / f"{abs(hash(name))}.backup"
        path.write_bytes(gzip.compress(b"".join(lines)))
        return path


async def test_a_value_not_of_its_columns_kind_is_refused_and_changes_nothing(
    database: DatabaseUnderTest, tmp_path: Path
) -> None:
    """SQLite would store such a value as it is, and the restored store would then fail
    every snapshot (every scheduling pass) and every listing of the work."""
    async with await open_store(database.settings) as store:
        tenant = (await make_tenant(store, "kept")).tenant
        await submit(store, tenant.tenant_id)
    good = tmp_path / "good.backup"
    await take_backup(database.settings, good, greenfed_version="test")
    backup = ChangedBackup(good)
    changed = {
        "text in an integer": backup.with_value("work", "attempts", "many"),
        "a boolean in an integer": backup.with_value("work", "attempts", True),
        "an integer past 64 bits": backup.with_value("work", "attempts", 2**64),
        "null where the schema has NOT NULL": backup.with_value("work", "attempts", None),
        "an integer in a boolean": backup.with_value("tenants", "admin", 1),
        "an integer in a text": backup.with_value("work", "kind", 5),
        "a boolean in a float": backup.with_value("work", "submitted_at", True),
        "text in a float": backup.with_value("work", "submitted_at", "soon"),
        "a header giving text for an integer": backup.with_kind("work", "attempts", "text", "x"),
    }
    for case, path in changed.items():
        with pytest.raises(BackupFormatError, match=r"attempts|admin|kind|submitted_at"):
            await restore_backup(database.settings, path, force=True)
        async with await open_store(database.settings) as store:
            snapshot = await store.load_snapshot()
            assert [w.attempts for w in snapshot.work] == [0], case
            assert [t.name for t in snapshot.tenants] == ["kept"], case


async def test_a_json_document_the_store_cannot_read_is_refused_and_changes_nothing(
    database: DatabaseUnderTest, tmp_path: Path
) -> None:
    """SQLite checks only some JSON columns to be JSON at all, PostgreSQL's `json` checks
    syntax and not shape: a document changed by hand would be restored, and the store
    would then fail every read of it (GET /v1/tenants a 500)."""
    async with await open_store(database.settings) as store:
        await fill(store)
    before = await every_row(database)
    good = tmp_path / "good.backup"
    await take_backup(database.settings, good, greenfed_version="test")
    backup = ChangedBackup(good)
    changed = [
        ("tenants", "quotas", "{gpu: eight"),  # no JSON: SQLite would keep it
        ("tenants", "quotas", "[1]"),  # JSON of another shape: PostgreSQL would keep it
        ("tenants", "quotas", '{"gpu": "eight"}'),
        ("events", "payload", "[]"),  # the store keeps payloads opaque, but objects
    ]
    for table, column, document in changed:
        with pytest.raises(BackupFormatError, match=rf"{table}.{column} in row 1 \(") as refused:
            await restore_backup(
                database.settings, backup.with_value(table, column, document), force=True
            )
        assert "the file was changed" in str(refused.value), document
        assert await every_row(database) == before, document
    async with await open_store(database.settings) as store:
        assert {t.name for t in await store.list_tenants()} == {"admin", "acme"}


async def test_each_json_column_takes_only_what_the_store_reads_back(tmp_path: Path) -> None:
    """The reader with the restore's decoders, on one changed document at a time."""
    source = sqlite_database(tmp_path / "source")
    async with await open_store(source.settings) as store:
        await fill(store)
    good = tmp_path / "good.backup"
    await take_backup(source.settings, good, greenfed_version="test")
    backup = ChangedBackup(good)
    assert _read_whole(good) > 0
    changed = {
        "tenants.borrowing_limit": ['{"quantum": 1}', '{"gpu": 1.5}'],
        "tenants.allowed_priorities": ['["p9"]', '"p0"'],
        "tenants.lending_limit": ["null", "{}}"],
        "allocations.accelerator_ids": ["[0, 1]"],
        "events.payload": ['{"x": 1', "1"],
        "work.spec": ['"a spec"', '{"command": ["python",]}'],
        "work.explanation": ["[]"],
        "audit_log.detail": ["true"],
        "join_tokens.labels": ['{"a": 1}'],
        "enrolled_nodes.envelope": ["[]"],
        "node_admin.taints": ['{"a": "b"}'],
        "node_admin.labels": ['["a"]'],
        "node_admin.approved": ['{"site": "moon", "zone": "z", "region": "r"}'],
        "fair_share_usage.accelerator_seconds": ['{"gpu": "many"}'],
        "node_drain_waiting.waiting": ["[1]"],
    }
    for where, documents in changed.items():
        table, column = where.split(".")
        for document in documents:
            with pytest.raises(BackupFormatError, match=rf"{where} in row 1 \("):
                _read_whole(backup.with_value(table, column, document))


def _read_whole(path: Path) -> int:
    """Every row of the backup, read as a restore reads it; how many."""
    reader = BackupReader(path)
    try:
        reader.read_as({}, JSON_DOCUMENTS)
        rows = 0
        while (batch := reader.next_batch(100)) is not None:
            rows += len(batch[1])
        return rows
    finally:
        reader.close()


def test_every_json_column_is_decoded_as_the_store_reads_it() -> None:
    """A JSON column added later needs its decoder in the restore's map."""
    json_columns = {
        f"{table.name}.{column.name}"
        for table in metadata.sorted_tables
        for column in table.columns
        if isinstance(column.type, JsonDocument)
    }
    assert {
        f"{table}.{column}" for table, columns in JSON_DOCUMENTS.items() for column in columns
    } == json_columns


async def test_a_backup_whose_header_gives_text_for_float_columns_still_restores(
    database: DatabaseUnderTest, tmp_path: Path
) -> None:
    """Backups made with SQLAlchemy 2.1 before this was found said "text" for every
    float column (its Float is no Numeric); their values are numbers all the same."""
    async with await open_store(database.settings) as store:
        await fill(store)
    before = await every_row(database)
    good = tmp_path / "good.backup"
    await take_backup(database.settings, good, greenfed_version="test")
    lines = gzip.decompress(good.read_bytes()).splitlines(keepends=True)
    header = msgspec.json.decode(lines[0])
    floats = [c for t in header["tables"] for c in t["columns"] if c["kind"] == "float"]
    assert {"name": "submitted_at", "kind": "float"} in floats
    for column in floats:
        column["kind"] = "text"
    older = tmp_path / "older.backup"
    older.write_bytes(gzip.compress(msgspec.json.encode(header) + b"\n" + b"".join(lines[1:])))
    await restore_backup(database.settings, older, force=True)
    assert await every_row(database) == before


async def test_an_integer_past_its_columns_32_bits_is_the_files_fault(
    database: DatabaseUnderTest, tmp_path: Path
) -> None:
    """PostgreSQL's `integer` columns hold 32 bits; SQLite's hold 64, and the value reads
    back as it was."""
    async with await open_store(database.settings) as store:
        tenant = (await make_tenant(store, "kept")).tenant
        work = (await submit(store, tenant.tenant_id)).work
    good = tmp_path / "good.backup"
    await take_backup(database.settings, good, greenfed_version="test")
    large = ChangedBackup(good).with_value("work", "attempts", 2**40)
    if database.kind == "postgresql":
        with pytest.raises(BackupFormatError, match="refused its rows"):
            await restore_backup(database.settings, large, force=True)
        expected = 0
    else:
        await restore_backup(database.settings, large, force=True)
        expected = 2**40
    async with await open_store(database.settings) as store:
        found = await store.find_work(work.work_id)
        assert found is not None
        assert found.attempts == expected


async def test_a_restore_waits_for_no_control_plane_and_a_backup_needs_a_store(
    database: DatabaseUnderTest, tmp_path: Path
) -> None:
    with pytest.raises((StoreUnavailableError, NotAStoreError)):
        await take_backup(database.settings, tmp_path / "none.backup", greenfed_version="test")
    assert not (tmp_path / "none.backup").exists()
    async with await open_store(database.settings) as store:
        await make_tenant(store, "kept")
        backup = tmp_path / "store.backup"
        await take_backup(database.settings, backup, greenfed_version="test")
        lease = await store.try_acquire_leadership()
        assert lease is not None
        async with lease:
            with pytest.raises(StoreInUseError, match="stop every greenfed cloud"):
                await restore_backup(database.settings, backup, force=True)
        await restore_backup(database.settings, backup, force=True)


def test_the_file_keeps_every_kind_of_value_exactly(tmp_path: Path) -> None:
    columns = (
        BackupColumn("text", "text"),
        BackupColumn("integer", "integer"),
        BackupColumn("float", "float"),
        BackupColumn("boolean", "boolean"),
    )
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
        tables=(BackupTable("a", columns), BackupTable("b", columns)),
    )
    rows: list[tuple[Any, ...]] = [
        ('{"k": [1, 2.50]}', 2**62, 0.1, True),
        ("é\n\u2028", -1, 2.0, False),
        (None, None, math.inf, None),
        ("NaN", 0, -math.inf, True),
    ]
    writer = BackupWriter(tmp_path / "x.backup", header)
    writer.start_table("a")
    writer.write_rows(rows)
    writer.start_table("b")  # empty
    writer.finish()
    reader = BackupReader(tmp_path / "x.backup")
    first = reader.next_batch(3)
    second = reader.next_batch(3)
    empty = reader.next_batch(3)
    assert reader.next_batch(3) is None
    reader.close()
    assert first is not None
    assert second is not None
    assert empty is not None
    assert [t.name for t in (first[0], second[0], empty[0])] == ["a", "a", "b"]
    assert [tuple(row) for row in first[1] + second[1]] == rows
    assert empty[1] == []
    assert isinstance(first[1][1][2], float)  # 2.0 is not read back as the integer 2


def test_a_nan_survives_the_file(tmp_path: Path) -> None:
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
        tables=(BackupTable("a", (BackupColumn("f", "float"),)),),
    )
    writer = BackupWriter(tmp_path / "x.backup", header)
    writer.start_table("a")
    writer.write_rows([(math.nan,)])
    writer.finish()
    reader = BackupReader(tmp_path / "x.backup")
    batch = reader.next_batch(10)
    reader.close()
    assert batch is not None
    value = batch[1][0][0]
    assert isinstance(value, float)
    assert math.isnan(value)


async def test_generations_are_raised_to_a_floor_and_never_lowered(store: Store) -> None:
    """What a restored control plane does for nodes that applied more than its store
    holds (cloud/loop/generations.py)."""
    acme = (await make_tenant(store, "acme")).tenant
    job = (await submit(store, acme.tenant_id)).work
    lease = await store.try_acquire_leadership()
    assert lease is not None
    async with lease:
        await store.commit_pass(
            PassWrite(placements=(placement(job.work_id, "gpu-1"),)), lease=lease
        )
        raised = await store.raise_generations({"gpu-1": 7, "gpu-2": 3}, lease=lease)
        assert raised == {"gpu-1": 7, "gpu-2": 3}
        assert await store.raise_generations({"gpu-1": 5, "gpu-2": 3}, lease=lease) == {}
        assert await store.node_generations() == {"gpu-1": 7, "gpu-2": 3}
        # A later placement counts on from the floor.
        await store.cancel_work(acme.tenant_id, job.work_id, reason="done")
        assert (await store.node_generations())["gpu-1"] == 8
