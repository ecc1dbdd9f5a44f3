"""Races made certain on PostgreSQL: a gate transaction takes a lock that two concurrent
store calls both need, the test waits until both are queued behind it (directly, or
behind another call queued behind it), then the gate lets them go at the same moment."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from cloud.store import create_store_engine
from tests.store.databases import DatabaseUnderTest
from tests.support.waiting import eventually_async

_LOCK_WAITS = text(
    "SELECT pid, pg_blocking_pids(pid) AS blockers FROM pg_stat_activity "
    "WHERE wait_event_type = 'Lock'"
)


async def _waiting_behind(observer: AsyncConnection, gate_pid: int) -> int:
    """How many sessions wait, directly or through others, for the gate's locks (other
    sessions of the server, other tests', are not counted)."""
    async with observer.begin():
        rows = await observer.execute(_LOCK_WAITS)
        blockers = {row.pid: set(row.blockers) for row in rows}
    queued: set[int] = set()
    reached = {gate_pid}
    while reached:
        reached = {pid for pid, by in blockers.items() if by & reached} - queued
        queued |= reached
    return len(queued)


@contextlib.asynccontextmanager
async def gate(
    database: DatabaseUnderTest, lock: str, params: Mapping[str, object] | None = None
) -> AsyncIterator[Callable[[int], Awaitable[None]]]:
    """Hold what the statement `lock` locks for the block, which gets `until_waiting(n)`:
    it returns once n sessions wait behind the gate. Leaving the block releases them."""
    engine = create_store_engine(database.settings)
    try:
        async with engine.connect() as holder, engine.connect() as observer:
            await holder.begin()
            await holder.execute(text(lock), dict(params or {}))
            holder_pid = int((await holder.execute(text("SELECT pg_backend_pid()"))).scalar_one())

            async def until_waiting(sessions: int) -> None:
                async def enough() -> bool:
                    return await _waiting_behind(observer, holder_pid) >= sessions

                await eventually_async(
                    enough, message=f"{sessions} sessions never queued behind the gate"
                )

            try:
                yield until_waiting
            finally:
                await holder.commit()
    finally:
        await engine.dispose()
