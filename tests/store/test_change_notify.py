"""Commits of one process wake the commit listeners of another (PostgreSQL NOTIFY),
only when they commit, only in their own schema, and again after the listening
connection was killed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from cloud.store import Store, open_store
from cloud.store.change_notify import ChangeNotifier, change_channel
from cloud.store.errors import TenantExistsError
from cloud.store.records import NewTenant
from tests.store.databases import POSTGRES_URL, postgres_database, sqlite_database
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(60)


class Wakes:
    """Counts the calls of a commit listener."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1

    async def reached(self, count: int) -> None:
        await eventually(lambda: self.count >= count, message=lambda: f"{self.count} wakes")


@pytest.fixture
async def two_processes(tmp_path: Path) -> AsyncIterator[tuple[Store, Store]]:
    """Two stores on one schema, each with its own engine, as two replicas have; the
    first listens for the other's changes."""
    async with postgres_database(tmp_path) as database:
        listening = await open_store(database.settings)
        other = await open_store(database.settings)
        try:
            listening.listen_for_changes()
            assert listening.change_listener is not None
            await asyncio.wait_for(listening.change_listener.listening.wait(), 10)
            yield listening, other
        finally:
            await other.close()
            await listening.close()


async def test_another_process_commit_wakes_the_listeners(
    two_processes: tuple[Store, Store],
) -> None:
    listening, other = two_processes
    wakes = Wakes()
    listening.add_commit_listener(wakes)
    await other.create_tenant(NewTenant(name="acme"))
    await wakes.reached(1)

    # Its own commit: the listeners are told once, in-process, not again by its echo.
    await listening.create_tenant(NewTenant(name="own"))
    assert wakes.count == 2
    # A transaction that rolls back tells nobody: nothing is even queued to be sent.
    notifier = other.change_notifier
    assert notifier is not None
    await eventually(lambda: not notifier.busy, message="acme's notification not sent")
    assert notifier.sent == 1
    with pytest.raises(TenantExistsError):
        await other.create_tenant(NewTenant(name="acme"))
    assert not notifier.busy
    await other.create_tenant(NewTenant(name="globex"))
    await wakes.reached(3)
    assert listening.change_listener is not None
    # Its own echo came to nothing.
    assert listening.change_listener.notified == 2
    assert wakes.count == 3


async def test_a_killed_listening_connection_comes_back_and_wakes_again(
    two_processes: tuple[Store, Store],
) -> None:
    listening, other = two_processes
    listener = listening.change_listener
    assert listener is not None
    assert listener.backend_pid is not None
    wakes = Wakes()
    listening.add_commit_listener(wakes)
    engine = create_async_engine(make_url(POSTGRES_URL).set(drivername="postgresql+asyncpg"))
    try:
        async with engine.begin() as connection:
            killed = (
                await connection.execute(
                    text("SELECT pg_terminate_backend(:pid)"), {"pid": listener.backend_pid}
                )
            ).scalar()
        assert killed is True
    finally:
        await engine.dispose()
    await eventually(lambda: listener.connects == 2, message="the listener did not reconnect")
    # Back: one wake for whatever committed while nobody listened...
    await wakes.reached(1)
    # ...and other processes' commits wake it again.
    await other.create_tenant(NewTenant(name="after"))
    await wakes.reached(2)
    assert listener.notified == 1


async def test_other_schemas_changes_go_elsewhere_and_sqlite_has_none(tmp_path: Path) -> None:
    assert change_channel("gftest_a") != change_channel("gftest_b")
    assert len(change_channel("x" * 63)) <= 63  # a channel is an identifier
    store = await open_store(sqlite_database(tmp_path).settings)
    try:
        store.listen_for_changes()
        assert store.change_listener is None
    finally:
        await store.close()


async def test_commits_during_a_notification_are_announced_by_one_more() -> None:
    """The seam is the sending: here a fake that waits to be let through."""
    sends: list[asyncio.Event] = []

    async def send() -> None:
        sends.append(asyncio.Event())
        await sends[-1].wait()

    notifier = ChangeNotifier(send, "channel", min_interval_s=0.0)
    notifier.changed()
    await eventually(lambda: len(sends) == 1)
    for _ in range(5):  # commits while the first is being sent
        notifier.changed()
    sends[0].set()
    await eventually(lambda: len(sends) == 2)
    sends[1].set()
    await eventually(lambda: not notifier.busy)
    assert notifier.sent == 2
    await notifier.close()
    notifier.changed()  # closed: nothing more is sent
    assert not notifier.busy


async def test_a_notification_that_fails_is_dropped_and_the_next_is_sent() -> None:
    failures = [OSError("connection refused")]
    attempts = 0

    async def send() -> None:
        nonlocal attempts
        attempts += 1
        if failures:
            raise failures.pop()

    notifier = ChangeNotifier(send, "channel", errors=(OSError,))
    notifier.changed()
    await eventually(lambda: not notifier.busy)
    assert (attempts, notifier.sent) == (1, 0)
    notifier.changed()
    await eventually(lambda: not notifier.busy)
    assert (attempts, notifier.sent) == (2, 1)
    await notifier.close()
