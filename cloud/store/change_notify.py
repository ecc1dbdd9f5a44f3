"""Telling other processes that the store changed: PostgreSQL NOTIFY and LISTEN.

A commit that tells this process's commit listeners (the scheduling loop, the event
streams) also tells other processes: `ChangeNotifier` sends a `pg_notify` on the
schema's channel once the transaction has committed, so nothing is announced that
did not commit and a listener that wakes sees what woke it. The notification is not
part of the transaction: inside it, it was one more round trip on the path of every
acknowledgement (and PostgreSQL serialises the commits of notifying transactions),
which cost a quarter to a third of the submissions a second (benchmarks/RESULTS.md,
issue 28, fourth round). Sent apart, one at a time, one notification covers every commit made
before it was sent. Every replica listens on one connection of its own and calls its
commit listeners when another process committed: a job submitted to an API-only
replica wakes the leader's passes at once instead of at the next
`scheduling.interval_s`.

The payload names the process that committed (`origin`): a process has already told
its own listeners, so it skips its own notifications. While the listening connection
is down, notifications are lost; the reconnect loop wakes the listeners once after
every reconnect, and the interval poll covers the gap. SQLite has no such channel:
there, commits of other processes are seen only by polling.

The same connection marks the replica as running: it holds the schema's "replica"
advisory lock in shared mode (cloud/store/locks.py) for as long as it is open, taken
again on every reconnect, so that a restore, which tries that lock exclusively, sees
every replica, API-only ones included, and refuses to replace the store under them.
Shared, the replicas never wait for each other, and no other lock (migrations,
backups, leadership) uses that key. While the connection is down (the database
restarting) the replica is not seen.
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Final

import asyncpg  # type: ignore[import-untyped]
import structlog
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from shared.backoff import Backoff
from shared.tasks import stop_task

CHANNEL_PREFIX: Final = "greenfed_changes_"
# What connecting or listening may fail with: the listener retries after any of them.
_CONNECTION_ERRORS: Final = (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError)
# Options SQLAlchemy's asyncpg dialect takes for itself; asyncpg.connect refuses them.
_DIALECT_ONLY: Final = (
    "async_creator_fn",
    "prepared_statement_cache_size",
    "prepared_statement_name_func",
)


def change_channel(namespace: str) -> str:
    """The channel of one schema's changes: installations in different schemas of one
    database must not wake each other. Hashed, as a channel name is an identifier of at
    most 63 bytes and a schema name may use all of them."""
    digest = hashlib.blake2b(f"greenfed:{namespace}:changes".encode(), digest_size=8)
    return CHANNEL_PREFIX + digest.hexdigest()


def new_origin() -> str:
    """What a process's notifications carry, so that it knows its own."""
    return uuid.uuid4().hex


async def notify_change(connection: AsyncConnection, channel: str, origin: str) -> None:
    await connection.execute(select(func.pg_notify(channel, origin)))


class ChangeNotifier:
    """Announces this process's commits: `changed()` after each (quick, never raises);
    one notification at a time is sent by `send`, and one more after it when commits
    came meanwhile, at least `min_interval_s` after the previous one was sent."""

    def __init__(
        self,
        send: Callable[[], Awaitable[None]],
        channel: str,
        *,
        min_interval_s: float = 0.005,
        errors: tuple[type[BaseException], ...] = (OSError,),
    ) -> None:
        self._send = send
        self._channel = channel
        self._min_interval_s = min_interval_s
        self._errors = errors
        self._pending = False
        self._sending: asyncio.Task[None] | None = None
        self._closed = False
        self._log = structlog.get_logger("greenfed.store")
        self.sent = 0  # notifications sent (tests read it)

    @property
    def busy(self) -> bool:
        """A notification waits to be sent, or is being sent."""
        return self._pending or (self._sending is not None and not self._sending.done())

    def changed(self) -> None:
        if self._closed:
            return
        self._pending = True
        if self._sending is None or self._sending.done():
            self._sending = asyncio.get_running_loop().create_task(
                self._send_pending(), name="store-change-notifier"
            )

    async def _send_pending(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            self._pending = False
            started = loop.time()
            try:
                await self._send()
            except self._errors as error:
                # Lost: the listeners' interval poll covers what it would have told.
                self._log.warning(
                    "cannot announce a change", channel=self._channel, error=str(error)
                )
            else:
                self.sent += 1
            if self._pending:
                # Spacing: under a stream of commits, one notification a few ms.
                await asyncio.sleep(max(0.0, started + self._min_interval_s - loop.time()))

    async def close(self, timeout_s: float = 5.0) -> None:
        """Send what is pending, waiting at most `timeout_s`; later changes are not sent."""
        self._closed = True
        sending, self._sending = self._sending, None
        if sending is None:
            return
        await asyncio.wait([sending], timeout=timeout_s)
        await stop_task(sending)


def listener_connector(
    engine: AsyncEngine, connect_timeout_s: float
) -> Callable[[], Awaitable[asyncpg.Connection]]:
    """Opens a connection of its own (not the pool's) with the engine's address and
    credentials: it stays open for as long as the replica runs."""
    cargs, cparams = engine.dialect.create_connect_args(engine.url)
    params: dict[str, Any] = {k: v for k, v in cparams.items() if k not in _DIALECT_ONLY}
    params |= {
        "timeout": connect_timeout_s,
        "server_settings": {"application_name": "greenfed-changes"},
    }

    async def connect() -> asyncpg.Connection:
        return await asyncpg.connect(*cargs, **params)

    return connect


# How long a stopping listener waits for the server to end its session.
_CLOSE_TIMEOUT_S = 2.0


async def _close_releasing_locks(connection: asyncpg.Connection) -> None:
    """Ends the listener's session so that the server has let go of its locks (the
    replica lock) when this returns: a graceful close waits for the server to end the
    session, whose exit releases them; cutting the socket would leave them held until
    the server notices, and a restore right after a replica stopped was refused. A
    connection that does not answer in time (or already dropped) is cut."""
    if connection.is_closed():
        return
    try:
        async with asyncio.timeout(_CLOSE_TIMEOUT_S):
            await connection.close()
    except asyncio.CancelledError:
        connection.terminate()
        raise
    except Exception:  # a connection that broke meanwhile: nothing is held on it any more
        connection.terminate()


class ChangeListener:
    """LISTENs on `channel` over one connection, reconnecting with capped, jittered
    backoff when it drops, and calls `on_change()` when another process committed.
    `on_change` must be quick and must not raise (the store's commit listeners are).
    With `replica_lock_key`, the connection holds that advisory lock shared first."""

    def __init__(
        self,
        connect: Callable[[], Awaitable[asyncpg.Connection]],
        channel: str,
        origin: str,
        on_change: Callable[[], None],
        *,
        replica_lock_key: int | None = None,
        reconnect_initial_s: float = 0.1,
        reconnect_max_s: float = 5.0,
        check_interval_s: float = 30.0,
    ) -> None:
        self.channel = channel
        self._connect = connect
        self._origin = origin
        self._on_change = on_change
        self._replica_lock_key = replica_lock_key
        self._backoff = Backoff(reconnect_initial_s, reconnect_max_s)
        self._check_interval_s = check_interval_s
        self._log = structlog.get_logger("greenfed.store")
        # Set while LISTEN (and the replica lock) holds; the server process that listens
        # (tests end it).
        self.listening = asyncio.Event()
        self.backend_pid: int | None = None
        self.connects = 0  # LISTENs that took, the first one included
        self.notified = 0  # other processes' notifications received

    def _notified(self, _connection: object, _pid: int, _channel: str, payload: str) -> None:
        if payload == self._origin:
            return  # this process's own commit: its listeners were told already
        self.notified += 1
        self._on_change()

    async def run(self) -> None:
        while True:
            try:
                connection = await self._connect()
            except _CONNECTION_ERRORS as error:
                await self._retry_later(error)
                continue
            try:
                await self._listen(connection)
            except _CONNECTION_ERRORS as error:
                await self._retry_later(error)
            finally:
                self.listening.clear()
                self.backend_pid = None
                await _close_releasing_locks(connection)

    async def _listen(self, connection: asyncpg.Connection) -> None:
        """Returns when the connection is lost; raises when it fails a check."""
        lost = asyncio.Event()
        connection.add_termination_listener(lambda _connection: lost.set())
        if self._replica_lock_key is not None:
            # Session-level: held until this connection closes, the server releasing it
            # when it is cut. It waits only while a restore holds it (for its one
            # transaction); bounded, so a connection cut meanwhile is retried.
            async with asyncio.timeout(self._check_interval_s):
                await connection.execute(
                    "SELECT pg_advisory_lock_shared($1)", self._replica_lock_key
                )
        await connection.add_listener(self.channel, self._notified)
        self.connects += 1
        self.backend_pid = connection.get_server_pid()
        self._backoff.reset()
        self.listening.set()
        if self.connects > 1:
            # What other processes committed while nobody listened here.
            self._log.info("listening for changes again", channel=self.channel)
            self._on_change()
        while not lost.is_set():
            try:
                async with asyncio.timeout(self._check_interval_s):
                    await lost.wait()
            except TimeoutError:
                # A connection cut without a word (a dead peer) is noticed only by using it.
                async with asyncio.timeout(self._check_interval_s):
                    await connection.execute("SELECT 1")
        self._log.warning("the connection listening for changes was lost", channel=self.channel)

    async def _retry_later(self, error: BaseException) -> None:
        delay_s = self._backoff.next_delay_s()
        self._log.warning(
            "cannot listen for changes; retrying",
            channel=self.channel,
            error=f"{type(error).__name__}: {error}",
            attempt=self._backoff.attempt,
            retry_in_s=round(delay_s, 2),
        )
        await asyncio.sleep(delay_s)
