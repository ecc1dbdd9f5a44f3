"""A PostgreSQL that cannot be reached for a while (a restart, a failover, a database
closed to connections) makes the store raise `StoreUnavailableError`, never the
driver's own error, and the store works again once the database is back.

Losing an open connection always was `StoreUnavailableError`; failing to make a new one
(connection refused, "database is not currently accepting connections") was not, so
the API answered 500 and every background loop of the control plane died on it.
The leadership poll treats a database it cannot reach as someone else leading.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import msgspec
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine
from structlog.testing import capture_logs

from cloud.store import NewTenant, Store, StoreUnavailableError, open_store
from shared.settings import StoreSettings
from tests.store.databases import (
    POSTGRES_URL,
    DatabaseUnderTest,
    postgres_database,
    postgres_reachable,
    sqlite_database,
)
from tests.support.brokers import require_or_skip
from tests.support.tcp_proxy import TcpProxy
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(60)


class DatabaseProxy(TcpProxy):
    """A TCP proxy in front of the real PostgreSQL, which can also `stall`: take
    connections and never answer (a server that hangs, a host gone behind a load
    balancer), so that connecting times out."""

    def __init__(self, target_host: str, target_port: int) -> None:
        super().__init__(target_host, target_port)
        self.stall = False
        self._stalled: list[asyncio.StreamWriter] = []

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.stall:
            self._stalled.append(writer)  # held open, silent
            return
        await super()._accept(reader, writer)

    def cut(self) -> int:
        stalled, self._stalled = self._stalled, []
        for writer in stalled:
            writer.transport.abort()
        return super().cut() + len(stalled)


@contextlib.asynccontextmanager
async def proxied_postgres(
    tmp_path: Path,
) -> AsyncIterator[tuple[DatabaseUnderTest, DatabaseProxy]]:
    """A schema of its own on the real PostgreSQL, reached through a proxy the test
    unplugs (the server refuses connections, as while it restarts) and plugs again.
    Connecting times out after half a second."""
    target = make_url(POSTGRES_URL)
    proxy = DatabaseProxy(target.host or "127.0.0.1", target.port or 5432)
    await proxy.start()
    try:
        async with postgres_database(tmp_path) as database:
            proxied_url = target.set(port=proxy.port).render_as_string(hide_password=False)
            settings = msgspec.structs.replace(
                database.settings, database_url=proxied_url, connect_timeout_s=0.5
            )
            yield DatabaseUnderTest("postgresql", settings), proxy
    finally:
        await proxy.stop()


async def begin_outage(proxy: DatabaseProxy, kind: str) -> None:
    """The open connections die, and new ones are refused, reset or left unanswered."""
    if kind == "refused":
        await proxy.unplug()
    else:
        proxy.refuse = kind == "reset"
        proxy.stall = kind == "silent"
        proxy.cut()


async def end_outage(proxy: DatabaseProxy, kind: str) -> None:
    if kind == "refused":
        await proxy.plug()
    else:
        proxy.refuse = proxy.stall = False
        proxy.cut()  # the connections left unanswered


def store_calls(store: Store) -> dict[str, Callable[[], Awaitable[object]]]:
    """A read or write of each kind the control plane's background loops and API make."""
    return {
        "node_admin": store.node_admin,  # node settings refresh
        "placed_attempts": store.placed_attempts,  # assignments refresh
        "last_event_seq": store.last_event_seq,  # the event hub
        "load_snapshot": store.load_snapshot,  # a scheduling pass
        "create_tenant": lambda: store.create_tenant(
            NewTenant(name=f"t-{uuid.uuid4().hex[:8]}")
        ),  # a write
    }


async def assert_unavailable(store: Store) -> None:
    # Twice: the first call may meet a pooled connection the outage killed (always
    # mapped); from then on every call has to connect afresh, and cannot.
    for _ in range(2):
        for name, call in store_calls(store).items():
            try:
                await call()
            except StoreUnavailableError:
                continue
            pytest.fail(f"{name} worked with the database away")


async def assert_available(store: Store) -> None:
    for call in store_calls(store).values():
        await call()


@pytest.mark.parametrize("outage", ["refused", "reset", "silent"])
async def test_a_database_that_cannot_be_reached_is_unavailable_then_works_again(
    tmp_path: Path, outage: str
) -> None:
    async with (
        proxied_postgres(tmp_path) as (database, proxy),
        await open_store(database.settings) as store,
    ):
        await assert_available(store)
        await begin_outage(proxy, outage)
        await assert_unavailable(store)
        await end_outage(proxy, outage)
        await assert_available(store)


async def test_the_leadership_poll_waits_out_a_database_that_is_away(tmp_path: Path) -> None:
    """It neither raises (which ended the scheduling loop, and with it the process) nor
    leads: it polls on, and leads once the database is back."""

    async def lead_once(store: Store) -> bool:
        async with store.leadership(poll_interval_s=0.05) as lease:
            return lease.held

    async with (
        proxied_postgres(tmp_path) as (database, proxy),
        await open_store(database.settings) as store,
    ):
        await proxy.unplug()
        with capture_logs() as logs:

            def failed_polls() -> int:
                return sum(
                    line["event"] == "leadership poll failed: store unavailable" for line in logs
                )

            # A poll that raised would end the group with its error.
            async with asyncio.timeout(20), asyncio.TaskGroup() as group:
                leading = group.create_task(lead_once(store))
                await eventually(lambda: failed_polls() >= 3, message="no poll met the outage")
                assert not leading.done()  # nobody leads while the database is away
                await proxy.plug()
        assert leading.result()


@contextlib.asynccontextmanager
async def database_of_its_own() -> AsyncIterator[str]:
    """A database created for the test (ALTER DATABASE acts on whole databases), dropped
    afterwards; its URL."""
    admin = create_async_engine(
        make_url(POSTGRES_URL).set(drivername="postgresql+asyncpg"),
        isolation_level="AUTOCOMMIT",
    )
    name = f"gftest_db_{uuid.uuid4().hex[:12]}"
    try:
        async with admin.connect() as connection:
            await connection.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            yield make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)
        finally:
            async with admin.connect() as connection:
                await connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        await admin.dispose()


async def allow_connections(database_url: str, allowed: bool) -> None:
    """As an admin does (or a failover leaves it): a database that turns every new
    connection away ("is not currently accepting connections"), its sessions ended."""
    name = make_url(database_url).database
    admin = create_async_engine(
        make_url(POSTGRES_URL).set(drivername="postgresql+asyncpg"),
        isolation_level="AUTOCOMMIT",
    )
    try:
        async with admin.connect() as connection:
            await connection.execute(
                text(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS {str(allowed).lower()}')
            )
            if not allowed:
                await connection.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                        " WHERE datname = :name"
                    ),
                    {"name": name},
                )
    finally:
        await admin.dispose()


async def test_a_database_closed_to_connections_is_unavailable_then_works_again(
    tmp_path: Path,
) -> None:
    if not postgres_reachable():
        require_or_skip("no PostgreSQL to close to connections")
    async with database_of_its_own() as database_url:
        settings = StoreSettings(database_url=database_url, data_dir=str(tmp_path / "data"))
        async with await open_store(settings) as store:
            await assert_available(store)
            await allow_connections(database_url, False)
            try:
                await assert_unavailable(store)
            finally:
                await allow_connections(database_url, True)
            await assert_available(store)


async def test_a_sqlite_file_that_cannot_be_opened_is_unavailable(tmp_path: Path) -> None:
    """The data directory gone (a volume unmounted): a connection that has to be opened
    now ("unable to open database file") is `StoreUnavailableError` as well."""
    settings = StoreSettings(data_dir=str(tmp_path / "data"), pool_size=1)
    async with await open_store(settings) as store:
        (tmp_path / "data").rename(tmp_path / "away")
        # Two at once: the second needs a connection beyond the pooled one.
        outcomes = await asyncio.gather(
            store.node_admin(), store.node_admin(), return_exceptions=True
        )
        failures = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
        assert failures, "both calls shared the pooled connection"
        for failure in failures:
            assert isinstance(failure, StoreUnavailableError), repr(failure)
        (tmp_path / "away").rename(tmp_path / "data")
        await asyncio.gather(store.node_admin(), store.node_admin())


async def test_a_pool_whose_connections_stay_taken_is_unavailable(tmp_path: Path) -> None:
    """Connects hanging in an outage keep every pooled connection taken: SQLAlchemy's wait
    for one ends in its own TimeoutError (after `pool_timeout`, 30 s, no setting of ours),
    which is the store being unavailable, never an internal error."""
    from sqlalchemy.exc import TimeoutError as PoolTimeoutError

    store = await open_store(sqlite_database(tmp_path).settings)
    try:
        with (
            pytest.raises(StoreUnavailableError, match="QueuePool limit"),
            store._connect_errors(),
        ):
            raise PoolTimeoutError("QueuePool limit of size 5 overflow 5 reached")
    finally:
        await store.close()
