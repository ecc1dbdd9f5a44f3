"""The previous release the upgrade tests start from, its fixtures, and its code.

greenfed has no release tags yet. The previous release is therefore a fixed commit:
d1a1217 (2026-12-02 00:44 UTC), the first commit of 2026-12-02, the last state of the
tree before the issue-17 tokens, the isolated-execution secrets, issue 25's node
envelopes and issue 26's clusters. Its store is at schema version 9 (`power_limits`);
today's code migrates it through versions 10-14, among them the one migration that
moves data (v10: each tenant's token into `tenant_tokens`), so the tests exercise
real migrations rather than a no-op. When a release is tagged, fixtures of that tag
are made with make_fixture.py and `PREVIOUS_RELEASE` moves to it.
"""

from __future__ import annotations

import gzip
import io
import shutil
import subprocess
import tarfile
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

import msgspec
import pytest
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from shared.settings import StoreSettings
from shared.token_files import admin_token_path, write_secret
from tests.store.databases import (
    POSTGRES_URL,
    DatabaseUnderTest,
    drop_schema,
    postgres_reachable,
)
from tests.support.brokers import require_or_skip

PREVIOUS_RELEASE: Final = "d1a12176e2c68fb2c1e9978b668b3a0dcee8042f"
PREVIOUS_SCHEMA_VERSION: Final = 9
REPOSITORY: Final = Path(__file__).resolve().parents[2]
FIXTURES: Final = Path(__file__).with_name("fixtures")
# The schema populate.py fills on PostgreSQL; the dump names it, a test renames it.
FIXTURE_SCHEMA: Final = "greenfed_upgrade_fixture"

Backend = Literal["sqlite", "postgresql"]


@dataclass(frozen=True)
class FixturePaths:
    directory: Path

    @property
    def sqlite_database(self) -> Path:
        return self.directory / "sqlite.db.gz"

    @property
    def postgres_dump(self) -> Path:
        return self.directory / "postgresql.sql"

    def manifest(self, backend: Backend) -> Path:
        return self.directory / f"{backend}.json"


def fixture_paths(commit: str = PREVIOUS_RELEASE) -> FixturePaths:
    return FixturePaths(FIXTURES / commit[:7])


class JoinTokenMade(msgspec.Struct, frozen=True):
    id: str
    token: str


class Manifest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What populate.py made, as the previous release read it back."""

    admin_token: str
    tokens: dict[str, str]  # tenant name -> bearer token
    tenant_ids: dict[str, str]
    model_id: str
    work: dict[str, str]  # role ("queued_a", "running", ...) -> work id
    states: dict[str, str]
    attempts: dict[str, int]
    state_reasons: dict[str, str | None]
    specs: dict[str, dict[str, Any]]
    events: list[tuple[int, str | None, str]]  # seq, work id, kind
    # tenant id, zone, currency, energy J, gCO2, cost, avoided gCO2
    usage_totals: list[tuple[str, str, str, float, float, float, float]]
    join_tokens: dict[str, JoinTokenMade]
    enrolled_node: str
    cluster_id: str
    created_at: float


def read_manifest(backend: Backend, commit: str = PREVIOUS_RELEASE) -> Manifest:
    return msgspec.json.decode(fixture_paths(commit).manifest(backend).read_bytes(), type=Manifest)


# ---- the previous release's store, loaded for a test ----------------------------------


def load_sqlite(tmp_path: Path, commit: str = PREVIOUS_RELEASE) -> DatabaseUnderTest:
    """The release's SQLite database file in a data directory of its own."""
    data_dir = tmp_path / "data"
    data_dir.mkdir(parents=True)
    with (
        gzip.open(fixture_paths(commit).sqlite_database, "rb") as source,
        (data_dir / "greenfed.db").open("wb") as target,
    ):
        shutil.copyfileobj(source, target)
    return DatabaseUnderTest("sqlite", StoreSettings(data_dir=str(data_dir)))


async def load_postgres_dump(schema: str, commit: str = PREVIOUS_RELEASE) -> None:
    """Run the release's dump with its schema renamed to `schema` (plain SQL, one
    simple-protocol script: asyncpg's `execute` without arguments)."""
    script = fixture_paths(commit).postgres_dump.read_text()
    assert script.count(FIXTURE_SCHEMA) > 10, "the dump does not name its schema"
    engine = create_async_engine(make_url(POSTGRES_URL).set(drivername="postgresql+asyncpg"))
    try:
        async with engine.connect() as connection:
            raw = (await connection.get_raw_connection()).driver_connection
            assert raw is not None
            await raw.execute(script.replace(FIXTURE_SCHEMA, schema))
    finally:
        await engine.dispose()


@asynccontextmanager
async def previous_store(
    backend: Backend, tmp_path: Path, commit: str = PREVIOUS_RELEASE
) -> AsyncIterator[DatabaseUnderTest]:
    """A database holding the store the previous release made, as it left it: a SQLite
    file, or a PostgreSQL schema of its own (dropped afterwards; an unreachable server
    is skipped, and fails the run under GREENFED_TEST_REQUIRE_SERVICES=1). The admin
    token file is put back beside it, as an operator keeps it with a backup."""
    admin_token = read_manifest(backend, commit).admin_token
    if backend == "sqlite":
        database = load_sqlite(tmp_path, commit)
        write_secret(admin_token_path(database.settings), admin_token)
        yield database
        return
    if not postgres_reachable():
        require_or_skip(f"no PostgreSQL at {make_url(POSTGRES_URL).render_as_string()}")
    schema = f"gftest_{uuid.uuid4().hex[:12]}"
    try:
        await load_postgres_dump(schema, commit)
        settings = StoreSettings(
            database_url=POSTGRES_URL, database_schema=schema, data_dir=str(tmp_path / "data")
        )
        write_secret(admin_token_path(settings), admin_token)
        yield DatabaseUnderTest("postgresql", settings)
    finally:
        await drop_schema(schema)


# ---- the previous release's code --------------------------------------------------------


def extract_release(destination: Path, commit: str = PREVIOUS_RELEASE) -> Path:
    """The release's `cloud` and `shared` packages (what its store and scheduling loop
    are made of) under `destination`, read from this clone's history with `git archive`.

    A clone without that commit (a shallow one) fails the test, saying how to get it:
    the rolling-upgrade tests run the old code itself and have nothing to fall back on.
    """
    found = subprocess.run(
        ["git", "-C", str(REPOSITORY), "cat-file", "-e", f"{commit}^{{commit}}"],
        capture_output=True,
        check=False,
    )
    if found.returncode != 0:
        pytest.fail(
            f"the previous release {commit[:7]} is not in this clone's history "
            f"({REPOSITORY}): the rolling-upgrade tests run its code. Fetch the history "
            "(git fetch --unshallow; actions/checkout: fetch-depth: 0)",
            pytrace=False,
        )
    archive = subprocess.run(
        ["git", "-C", str(REPOSITORY), "archive", "--format=tar", commit, "cloud", "shared"],
        capture_output=True,
        check=True,
    ).stdout
    destination.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(destination, filter="data")
    return destination
