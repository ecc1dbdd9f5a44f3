"""Dialect differences in one place: conflict-tolerant inserts, generation bumps, chunking."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, NamedTuple, TypeVar

from sqlalchemy import ColumnElement, Double, Table, bindparam, func, literal_column, select
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


# Not `at`: SQLAlchemy keeps a column's own name for the VALUES clause's parameter.
_AT_PARAMETER: Final = "b_at"
# Below any time: what an empty log's "last event time" counts as.
_BEFORE_ANY_TIME: Final = literal_column("-1e308", Double)


class AppendedEvent(NamedTuple):
    """Where an appended event went in the log: its sequence number, and the time it
    was stamped with (`at`: never earlier than the event before it)."""

    seq: int
    at: float


def _never_before_the_last_event(backend: Backend) -> ColumnElement[float]:
    """The row's own `at`, or the log's last `at` where that is later.

    Evaluated inside the INSERT, under the event-log lock (PostgreSQL's advisory lock,
    SQLite's write lock), so it reads the last event committed before this one took its
    sequence number: event times never go backwards in sequence order, whatever the
    clocks of the replicas said. That is what lets `?since=TIME` start at the newest
    event before TIME and miss nothing.
    """
    # Each used once, without bound parameters of their own: SQLAlchemy repeats the
    # VALUES expression for every row of a multi-row INSERT, and asyncpg numbers the
    # parameters. max(seq) is read from the primary key's index.
    own_at = bindparam(_AT_PARAMETER, type_=Double)
    last_seq = select(func.max(events.c.seq)).scalar_subquery()
    last_at = select(events.c.at).where(events.c.seq == last_seq).scalar_subquery()
    later = func.greatest if backend == "postgresql" else func.max  # SQLite's max(a, b)
    result: ColumnElement[float] = later(own_at, func.coalesce(last_at, _BEFORE_ANY_TIME))
    return result


@functools.cache
def _append_statement(backend: Backend) -> Insert:
    """Built once per backend: its SQL is then compiled once, not checked each time."""
    return insert_ignoring(backend, events, ["event_id"]).values(
        at=_never_before_the_last_event(backend)
    )


def _with_non_decreasing_times(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The rows as parameters of the stamping INSERT, each `at` at least the one before:
    the rows of one multi-row VALUES all compare with the same last event."""
    parameters: list[dict[str, Any]] = []
    floor = float("-inf")
    for row in rows:
        values = {key: value for key, value in row.items() if key != "at"}
        floor = max(floor, float(row["at"]))
        values[_AT_PARAMETER] = floor
        parameters.append(values)
    return parameters


async def append_events(
    connection: AsyncConnection,
    context: StoreContext,
    rows: Sequence[Mapping[str, Any]],
    *,
    returning: bool = True,
) -> list[AppendedEvent]:
    """Append events (rows of `events` without `seq`); returns where they went, in
    sequence order (with `returning=False` an empty list, and one round trip fewer).

    A row whose `event_id` is already in the log is dropped (agents resend events
    until the broker acknowledges them). A row's `at` is raised to the last event's
    where the clock that made it is behind (see `_never_before_the_last_event`). Call
    this last in a transaction: on PostgreSQL it takes a transaction lock so that
    sequence numbers are assigned in commit order, which is what lets a reader resume
    after a sequence number without missing a transaction that committed late.
    """
    if not rows:
        return []
    if context.backend == "postgresql":
        await connection.execute(select(func.pg_advisory_xact_lock(context.events_lock_key)))
    # One cached statement; SQLAlchemy batches many rows into multi-row VALUES itself.
    plain = _append_statement(context.backend)
    parameters = _with_non_decreasing_times(rows)
    if not returning:
        await connection.execute(plain, parameters)
        return []
    statement = plain.returning(events.c.seq, events.c.at)
    if len(rows) == 1:
        result = await connection.execute(statement, parameters[0])
    else:
        result = await connection.execute(statement, parameters)
    appended = [AppendedEvent(int(row.seq), float(row.at)) for row in result]
    return sorted(appended)
