"""The PostgreSQL session that holds the scheduling leader's advisory lock: which
backend it is, and ending it as a database restart or an admin's
pg_terminate_backend would."""

from __future__ import annotations

from sqlalchemy import text

from cloud.store import Store
from cloud.store.locks import advisory_key

_HOLDERS = (
    "FROM pg_locks WHERE locktype = 'advisory'"
    " AND classid = :high AND objid = :low AND objsubid = 1 AND granted"
)


def _key_parts(schema: str) -> dict[str, int]:
    key = advisory_key(schema, "leader")
    return {"high": (key >> 32) & 0xFFFFFFFF, "low": key & 0xFFFFFFFF}


async def leader_lock_holder(store: Store, schema: str) -> int:
    """The backend pid of the session holding the leader's lock in `schema`."""
    async with store._read() as connection:
        holder = await connection.execute(text(f"SELECT pid {_HOLDERS}"), _key_parts(schema))
        return int(holder.scalar_one())


async def end_leader_session(store: Store, schema: str) -> list[bool]:
    """Terminate the session holding the leader's lock in `schema`, through `store`'s
    own connection: what pg_terminate_backend said for each holder."""
    async with store._write() as connection:
        killed = await connection.execute(
            text(f"SELECT pg_terminate_backend(pid) {_HOLDERS}"), _key_parts(schema)
        )
        return list(killed.scalars().all())
