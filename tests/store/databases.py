"""Databases for store tests: a SQLite file per test, or a PostgreSQL schema of its own.

Each PostgreSQL test gets a fresh schema (`gftest_<random>`, set as the connections'
search_path through `store.database_schema`) on the real server, dropped afterwards,
so concurrent test runs and leftovers of killed runs never meet.
"""

from __future__ import annotations

import contextlib
import os
import socket
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from shared.settings import StoreSettings
from tests.support.brokers import require_or_skip

POSTGRES_URL = os.environ.get(
    "GREENFED_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)


@dataclass(frozen=True)
class DatabaseUnderTest:
    kind: Literal["sqlite", "postgresql"]
    settings: StoreSettings


def postgres_reachable(url: str = POSTGRES_URL, timeout_s: float = 0.5) -> bool:
    parsed = make_url(url)
    try:
        with socket.create_connection((parsed.host or "127.0.0.1", parsed.port or 5432), timeout_s):
            return True
    except OSError:
        return False


def sqlite_database(tmp_path: Path) -> DatabaseUnderTest:
    return DatabaseUnderTest("sqlite", StoreSettings(data_dir=str(tmp_path / "data")))


async def drop_schema(schema: str, url: str = POSTGRES_URL) -> None:
    engine = create_async_engine(make_url(url).set(drivername="postgresql+asyncpg"))
    try:
        async with engine.begin() as connection:
            await connection.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
    finally:
        await engine.dispose()


@contextlib.asynccontextmanager
async def postgres_database(tmp_path: Path) -> AsyncIterator[DatabaseUnderTest]:
    """A schema of its own on the real PostgreSQL; skip (or fail in CI) when unreachable."""
    if not postgres_reachable():
        require_or_skip(f"no PostgreSQL at {make_url(POSTGRES_URL).render_as_string()}")
    schema = f"gftest_{uuid.uuid4().hex[:12]}"
    settings = StoreSettings(
        database_url=POSTGRES_URL, database_schema=schema, data_dir=str(tmp_path / "data")
    )
    try:
        yield DatabaseUnderTest("postgresql", settings)
    finally:
        await drop_schema(schema)
