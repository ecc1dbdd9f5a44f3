"""Dialect differences in one place: conflict-tolerant inserts, generation bumps, chunking."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from sqlalchemy import Table, func, select
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.dml import Insert

from cloud.store.engine import Backend
from cloud.store.schema import events, node_generations

# Bound parameters per statement stay far below SQLite's 32766 and asyncpg's 32767.
CHUNK: Final = 500
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class StoreContext:
    """What the statements of one store need to know about it."""

    backend: Backend
    events_lock_key: int  # PostgreSQL: serialises event appends into commit order
    max_attempts: int
    clock: Callable[[], float]


def chunks(items: Sequence[T], size: int = CHUNK) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def dialect_insert(backend: Backend, table: Table) -> Any:
    """The backend's own INSERT, the one with ON CONFLICT clauses (both dialects spell
    them alike: `on_conflict_do_nothing`, `on_conflict_do_update`, `excluded`)."""
    return postgresql_insert(table) if backend == "postgresql" else sqlite_insert(table)


def insert_ignoring(backend: Backend, table: Table, conflict_columns: Sequence[str]) -> Insert:
    """INSERT ... ON CONFLICT (columns) DO NOTHING; NULLs never conflict."""
    statement: Insert = dialect_insert(backend, table).on_conflict_do_nothing(
        index_elements=conflict_columns
    )
    return statement


def upsert(
    backend: Backend, table: Table, values: Mapping[str, Any], conflict_columns: Sequence[str]
) -> Insert:
    """INSERT ... ON CONFLICT (columns) DO UPDATE SET every other column to `values`."""
    statement: Insert = (
        dialect_insert(backend, table)
        .values(dict(values))
        .on_conflict_do_update(
            index_elements=conflict_columns,
            set_={k: v for k, v in values.items() if k not in conflict_columns},
        )
    )
    return statement


async def bump_generations(
    connection: AsyncConnection, context: StoreContext, node_ids: set[str]
) -> dict[str, int]:
    """Add one to each node's desired-state generation (first bump: 1); the new values."""
    result: dict[str, int] = {}
    # Sorted: concurrent transactions lock the rows in one order and never deadlock.
    ordered = sorted(node_ids)
    for batch in chunks(ordered):
        values = [{"node_id": node_id, "generation": 1} for node_id in batch]
        statement = dialect_insert(context.backend, node_generations).values(values)
        statement = statement.on_conflict_do_update(
            index_elements=["node_id"],
            set_={"generation": node_generations.c.generation + 1},
        ).returning(node_generations.c.node_id, node_generations.c.generation)
        for row in await connection.execute(statement):
            result[row.node_id] = int(row.generation)
    return result


async def raise_generations(
    connection: AsyncConnection, context: StoreContext, floors: Mapping[str, int]
) -> dict[str, int]:
    """Raise each node's generation to its floor where it is lower (a row made where
    there is none); the nodes raised, with their new generation."""
    result: dict[str, int] = {}
    for batch in chunks(sorted(floors)):
        values = [{"node_id": node_id, "generation": floors[node_id]} for node_id in batch]
        statement = dialect_insert(context.backend, node_generations).values(values)
        statement = statement.on_conflict_do_update(
            index_elements=["node_id"],
            set_={"generation": statement.excluded.generation},
            where=node_generations.c.generation < statement.excluded.generation,
        ).returning(node_generations.c.node_id, node_generations.c.generation)
        for row in await connection.execute(statement):
            result[row.node_id] = int(row.generation)
    return result


async def append_events(
    connection: AsyncConnection,
    context: StoreContext,
    rows: Sequence[Mapping[str, Any]],
    *,
    returning: bool = True,
) -> list[int]:
    """Append events (rows of `events` without `seq`); returns the new sequence numbers
    (with `returning=False` an empty list, and one round trip fewer).

    A row whose `event_id` is already in the log is dropped (agents resend events
    until the broker acknowledges them). Call this last in a transaction: on
    PostgreSQL it takes a transaction lock so that sequence numbers are assigned in
    commit order, which is what lets a reader resume after a sequence number without
    missing a transaction that committed late.
    """
    if not rows:
        return []
    if context.backend == "postgresql":
        await connection.execute(select(func.pg_advisory_xact_lock(context.events_lock_key)))
    # One cached statement; SQLAlchemy batches many rows into multi-row VALUES itself.
    plain = insert_ignoring(context.backend, events, ["event_id"])
    if not returning:
        await connection.execute(plain, [dict(row) for row in rows])
        return []
    statement = plain.returning(events.c.seq)
    if len(rows) == 1:
        seqs = (await connection.execute(statement, dict(rows[0]))).scalars().all()
    else:
        seqs = (await connection.execute(statement, [dict(row) for row in rows])).scalars().all()
    return sorted(int(seq) for seq in seqs)
