"""Scheduling leadership: at most one process runs the scheduling loop.

PostgreSQL: a session-level advisory lock (per schema) held by one dedicated
connection. The leader commits its plans on that same connection, so a plan can
only commit while the session, and with it the lock, is alive: a leader whose
connection died gets `LeadershipLostError` instead of a split brain.

SQLite: an exclusive `flock` on `<database file>.leader.lock` beside the database
(in the data directory by default). The kernel releases it when the process dies.

Other replicas serve the API from the same database and poll for leadership every
`store.leader_poll_interval_s`; when the leader stops or dies, one of them takes over.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from pathlib import Path
from types import TracebackType

from sqlalchemy import func, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from cloud.store.errors import LeadershipLostError


class LeadershipLease(ABC):
    """Held leadership; `release()` (or leaving `async with`) hands it on."""

    @property
    @abstractmethod
    def held(self) -> bool: ...

    @abstractmethod
    async def check(self) -> None:
        """Raise `LeadershipLostError` unless leadership is still held."""

    @abstractmethod
    async def release(self) -> None: ...

    async def __aenter__(self) -> LeadershipLease:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.release()


class PostgresLease(LeadershipLease):
    def __init__(self, connection: AsyncConnection, key: int, backend_pid: int) -> None:
        self._connection: AsyncConnection | None = connection
        self._key = key
        self._backend_pid = backend_pid  # the server session that holds the lock
        self._lock = asyncio.Lock()  # one statement at a time on the connection

    @property
    def held(self) -> bool:
        return self._connection is not None and not self._connection.invalidated

    @property
    def key(self) -> int:
        return self._key

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncConnection]:
        """A transaction on the lock's own session: it commits only while we lead.

        Whatever ends the session (the server, the network, a task cancelled in the
        middle of a statement, which SQLAlchemy answers by invalidating the connection)
        loses the lease: the same `AsyncConnection` would otherwise reconnect on its
        next statement, to a session without the lock, and commit as the leader beside
        the replica that takes the lock next."""
        async with self._lock:
            connection = await self._live()
            try:
                async with connection.begin():
                    yield connection
            except BaseException as error:
                ended = connection.invalidated or (
                    isinstance(error, DBAPIError) and error.connection_invalidated
                )
                if not ended:
                    raise
                await self._lose()
                if not isinstance(error, Exception):
                    raise  # a cancellation stays one
                raise LeadershipLostError(
                    "the leader's database session ended; leadership is lost"
                ) from error

    async def check(self) -> None:
        """Also asks the server which session it is: one that is not the session that
        took the lock (however the connection came to be replaced) has lost it."""
        async with self.transaction() as connection:
            backend_pid = (await connection.execute(select(func.pg_backend_pid()))).scalar()
        if backend_pid != self._backend_pid:
            async with self._lock:
                await self._lose()
            raise LeadershipLostError(
                "the leader's database session was replaced; leadership is lost"
            )

    async def release(self) -> None:
        async with self._lock:
            if self._connection is None:
                return
            connection, self._connection = self._connection, None
            if connection.invalidated:
                # The session, and the lock with it, ended already: unlocking would
                # reconnect to a session that holds nothing.
                await connection.close()
                return
            try:
                await connection.execute(select(func.pg_advisory_unlock(self._key)))
                await connection.commit()
                await connection.close()
            except DBAPIError:
                # Closing the session releases the lock as well.
                await connection.invalidate()
                await connection.close()

    async def _live(self) -> AsyncConnection:
        if self._connection is None:
            raise LeadershipLostError("this process does not hold scheduling leadership")
        if self._connection.invalidated:
            # Its next statement would reconnect, to a session without the lock.
            await self._lose()
            raise LeadershipLostError("the leader's database session ended; leadership is lost")
        return self._connection

    async def _lose(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(DBAPIError, OSError):
                await connection.invalidate()
            with contextlib.suppress(DBAPIError, OSError):
                await connection.close()


class SqliteLease(LeadershipLease):
    def __init__(self, fd: int, path: Path) -> None:
        self._fd: int | None = fd
        self.path = path

    @property
    def held(self) -> bool:
        return self._fd is not None

    async def check(self) -> None:
        if self._fd is None:
            raise LeadershipLostError("this process does not hold scheduling leadership")

    async def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


async def try_acquire_postgres(connection: AsyncConnection, key: int) -> PostgresLease | None:
    """Take the lock on `connection` (a new session of the caller's): the lease keeps
    the connection; when another session holds the lock, or asking fails, it is closed.
    The caller connects, so that it says what a database it cannot reach means."""
    try:
        locked = (
            await connection.execute(select(func.pg_try_advisory_lock(key), func.pg_backend_pid()))
        ).one()
        await connection.commit()
    except BaseException:
        await connection.close()
        raise
    acquired, backend_pid = locked
    if not acquired:
        await connection.close()
        return None
    return PostgresLease(connection, key, int(backend_pid))


def leader_lock_path(database_path: Path) -> Path:
    return database_path.with_name(database_path.name + ".leader.lock")


def try_acquire_sqlite(database_path: Path) -> SqliteLease | None:
    """`flock` conflicts between open file descriptions, so two stores of one process
    exclude each other just as two processes do."""
    path = leader_lock_path(database_path)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    # Who leads, for a person looking at the data directory.
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return SqliteLease(fd, path)
