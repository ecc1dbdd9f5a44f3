"""From `[store]` settings to a configured SQLAlchemy async engine.

SQLite (the default, a file in the data directory) runs in WAL mode with
`synchronous=NORMAL`: a committed transaction survives a crash of the process (the
WAL is in the OS page cache), while a power loss or kernel crash may lose the last
few commits, never corrupt the database. `store.sqlite_synchronous = "full"` makes
every commit survive power loss too, at the cost of an fsync per commit.

SQLAlchemy's SQLite driver does not emit BEGIN itself (the sqlite3 module's legacy
transaction control); the engine takes that over, so every transaction is a real
one: `BEGIN IMMEDIATE` for writes (the write lock is taken up front and waits up to
`busy_timeout_s`, instead of failing half-way on a lock upgrade), `BEGIN` for reads.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from sqlalchemy import event
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import ConnectionPoolEntry

from cloud.store.errors import StoreConfigError
from shared.settings import StoreSettings

SQLITE_FILE_NAME: Final = "greenfed.db"
# Execution option that marks a write transaction (BEGIN IMMEDIATE on SQLite).
WRITE_OPTION: Final = "greenfed_write"
_SQLITE_DRIVERS: Final = ("sqlite", "sqlite+aiosqlite")
_POSTGRES_DRIVERS: Final = ("postgresql", "postgres", "postgresql+asyncpg")
# Kept in step with shared.settings.DATABASE_URL_SCHEMES (a test checks).
ACCEPTED_SCHEMES: Final = (*_SQLITE_DRIVERS, *_POSTGRES_DRIVERS)

Backend = Literal["sqlite", "postgresql"]

# Query parameters of a PostgreSQL URL that reach asyncpg's connect(): asyncpg takes
# these by the same name (SQLAlchemy splits `host` for sockets and several hosts).
_ASYNCPG_PARAMETERS: Final = frozenset(
    {"host", "ssl", "target_session_attrs", "passfile", "krbsrvname", "gsslib"}
)
# libpq's sslmode, which URLs copied from psql carry; asyncpg's `ssl` takes the same values.
SSL_MODES: Final = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
# Where libpq parameters asyncpg does not take by name are given instead.
_PARAMETER_HINTS: Final = {
    "sslrootcert": "set the PGSSLROOTCERT environment variable instead",
    "sslcert": "set the PGSSLCERT environment variable instead",
    "sslkey": "set the PGSSLKEY environment variable instead",
    "sslcrl": "set the PGSSLCRL environment variable instead",
    "connect_timeout": "use store.connect_timeout_s instead",
    "port": "put the port after the host (host:5432) instead",
}
_PASSWORD_IN_URL: Final = re.compile(r"(?<=://)([^:/?#@]*):[^@/?#]*@")


@dataclass(frozen=True, slots=True)
class DatabaseTarget:
    """Where the store lives, resolved from settings (the data directory applied)."""

    backend: Backend
    url: URL
    sqlite_path: Path | None  # SQLite only: the database file
    schema: str | None  # PostgreSQL only: the schema set as search_path

    def describe(self) -> str:
        """The URL for logs and errors, password hidden."""
        text = self.url.render_as_string(hide_password=True)
        return f"{text} (schema {self.schema})" if self.schema else text


def resolve_database(settings: StoreSettings) -> DatabaseTarget:
    """Parse `store.database_url` (empty: SQLite in `store.data_dir`); create the directory."""
    if not settings.database_url:
        data_dir = settings.resolved_data_dir()
        try:
            data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as error:
            raise StoreConfigError(
                f"store.data_dir: cannot create {data_dir}: {error.strerror}"
            ) from None
        path = data_dir / SQLITE_FILE_NAME
        return DatabaseTarget(
            "sqlite", URL.create("sqlite+aiosqlite", database=str(path)), path, None
        )
    try:
        url = make_url(settings.database_url)
    except (ArgumentError, ValueError):  # ValueError: a port that is not a number
        raise StoreConfigError(
            f"store.database_url: {_hide_password(settings.database_url)!r} is not a "
            "database URL (sqlite:///path/to/greenfed.db or "
            "postgresql://user@host:5432/dbname)"
        ) from None
    driver = url.drivername.lower()
    if driver in _SQLITE_DRIVERS:
        return _sqlite_target(url, settings)
    if driver in _POSTGRES_DRIVERS:
        if not url.host and not url.query.get("host"):
            raise StoreConfigError("store.database_url: a PostgreSQL URL needs a host")
        return DatabaseTarget(
            "postgresql",
            url.set(drivername="postgresql+asyncpg", query=_asyncpg_query(url.query)),
            None,
            settings.database_schema or None,
        )
    raise StoreConfigError(
        f"store.database_url: unsupported database {url.drivername!r}; use "
        "sqlite:///path/to/greenfed.db or postgresql://user@host:5432/dbname"
    )


def _hide_password(text: str) -> str:
    """A URL as text with its password as ***, for a message (the URL did not parse)."""
    return _PASSWORD_IN_URL.sub(r"\1:***@", text)


def _asyncpg_query(
    query: Mapping[str, str | tuple[str, ...]],
) -> dict[str, str | tuple[str, ...]]:
    """A PostgreSQL URL's query parameters as asyncpg's connect() takes them, `sslmode`
    as `ssl`. SQLAlchemy hands every parameter to connect() as a keyword, so one it does
    not take would fail every connection with a TypeError: refuse it here, by name."""
    result: dict[str, str | tuple[str, ...]] = {}
    for name, value in query.items():
        if name not in ("ssl", "sslmode", *_ASYNCPG_PARAMETERS):
            known = ", ".join(sorted({"sslmode", *_ASYNCPG_PARAMETERS}))
            hint = _PARAMETER_HINTS.get(name, f"the parameters greenfed passes on are {known}")
            raise StoreConfigError(
                f"store.database_url: unsupported query parameter {name!r}; {hint}"
            )
        if isinstance(value, tuple) and name != "host":  # several hosts are allowed
            raise StoreConfigError(f"store.database_url: query parameter {name!r} given twice")
        if name in ("ssl", "sslmode"):
            if "ssl" in result:
                raise StoreConfigError("store.database_url: give sslmode or ssl, not both")
            if value not in SSL_MODES:
                raise StoreConfigError(
                    f"store.database_url: {name}={value!r} is not one of {', '.join(SSL_MODES)}"
                )
            name = "ssl"
        result[name] = value
    return result


def _sqlite_target(url: URL, settings: StoreSettings) -> DatabaseTarget:
    database = url.database or ""
    if database in ("", ":memory:") or database.startswith("file::memory:"):
        raise StoreConfigError(
            "store.database_url: an in-memory SQLite database loses everything when the "
            "process ends; give a file path (sqlite:///path/to/greenfed.db)"
        )
    if settings.database_schema:
        raise StoreConfigError("store.database_schema: only PostgreSQL databases have schemas")
    path = Path(database).expanduser().resolve()
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as error:
        raise StoreConfigError(
            f"store.database_url: cannot create {path.parent}: {error.strerror}"
        ) from None
    return DatabaseTarget(
        "sqlite", url.set(drivername="sqlite+aiosqlite", database=str(path)), path, None
    )


def create_store_engine(settings: StoreSettings) -> AsyncEngine:
    """A configured engine; connects lazily (`open_store` connects and migrates)."""
    return build_engine(resolve_database(settings), settings)


def build_engine(target: DatabaseTarget, settings: StoreSettings) -> AsyncEngine:
    if target.backend == "sqlite":
        return _sqlite_engine(target, settings)
    return _postgres_engine(target, settings)


def _sqlite_engine(target: DatabaseTarget, settings: StoreSettings) -> AsyncEngine:
    engine = create_async_engine(
        target.url,
        pool_size=settings.pool_size,
        max_overflow=settings.pool_size,
        connect_args={"timeout": settings.busy_timeout_s},
    )
    busy_timeout_ms = round(settings.busy_timeout_s * 1000)
    synchronous = settings.sqlite_synchronous.upper()

    def on_connect(dbapi_connection: Any, _record: ConnectionPoolEntry) -> None:
        # The engine emits BEGIN itself (see the module docstring).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {busy_timeout_ms}")
            cursor.execute(f"PRAGMA synchronous = {synchronous}")
            cursor.execute("PRAGMA foreign_keys = ON")
        finally:
            cursor.close()

    def on_begin(connection: Connection) -> None:
        write = connection.get_execution_options().get(WRITE_OPTION, False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    event.listen(engine.sync_engine, "connect", on_connect)
    event.listen(engine.sync_engine, "begin", on_begin)
    return engine


async def enable_wal(engine: AsyncEngine, timeout_s: float) -> None:
    """Switch the SQLite file to WAL (a persistent property of the file), before anything
    else touches it. SQLite answers a switch racing another connection with "database is
    locked" without waiting for the busy timeout, so this retries until `timeout_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    async with engine.connect() as connection:
        raw = await connection.get_raw_connection()
        driver = raw.driver_connection  # aiosqlite: outside any transaction, as required
        assert driver is not None
        while True:
            try:
                cursor = await driver.execute("PRAGMA journal_mode = WAL")
                mode = (await cursor.fetchone())[0]
                await cursor.close()
            except sqlite3.OperationalError as error:
                if "locked" not in str(error) or loop.time() >= deadline:
                    raise
                await asyncio.sleep(0.01)
                continue
            if str(mode).lower() != "wal":
                raise sqlite3.OperationalError(f"journal_mode is {mode}, WAL is unavailable")
            return


def _json_text(text: str) -> str:
    return text


def _postgres_engine(target: DatabaseTarget, settings: StoreSettings) -> AsyncEngine:
    server_settings = {"application_name": "greenfed"}
    if target.schema:
        server_settings["search_path"] = target.schema
    return create_async_engine(
        target.url,
        pool_size=settings.pool_size,
        max_overflow=settings.pool_size,
        # No ping on checkout: it costs a round trip per transaction (a fifth of a
        # submission). After a server restart the first statement on a dead connection
        # fails (StoreUnavailableError, nothing acknowledged) and the pool is refreshed.
        pool_pre_ping=False,
        # The driver's json codec hands over the JSON text as it is (see jsontype.py).
        json_deserializer=_json_text,
        connect_args={"timeout": settings.connect_timeout_s, "server_settings": server_settings},
    )
