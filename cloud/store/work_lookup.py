"""Work found by what a person types instead of its id: its name or a prefix of its id.

`select_work_matching` reads the candidates (a bounded number, newest first); which of
them the reference means, or that it is ambiguous, is decided in cloud/work/lookup.py.
`select_live_named` reads a name's live work with each job array once: an array of
thousands of tasks is one match, and cannot crowd the name's other live work out of
the bounded read. The name lives in the stored spec (a JSON document): SQLite reads it
with `json_extract`, PostgreSQL with `->>` on its `json` column, and an index on that
expression (migration v23) narrows the rows read to the runs of the name, however long
the history.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Select, exists, func, literal_column, select
from sqlalchemy.ext.asyncio import AsyncConnection

from cloud.store.migrations.v0023_work_name_index import NAME_EXPRESSION
from cloud.store.records import WorkRecord
from cloud.store.rows import work_from_row
from cloud.store.schema import WORK_RECORD_COLUMNS, array_tasks, work
from cloud.store.states import TERMINAL_STATES
from shared.work_literals import WorkKind


@dataclass(frozen=True, slots=True)
class NamedArray:
    """A job array with tasks of the name that have not ended."""

    array_id: str
    live_tasks: int
    submitted_at: float


@dataclass(frozen=True, slots=True)
class LiveNamed:
    """The live work of a name, each job array once (both newest first, at most the
    limit asked for each)."""

    work: tuple[WorkRecord, ...]  # no job array's task
    arrays: tuple[NamedArray, ...]


def _spec_name(dialect: str) -> ColumnElement[str]:
    # The index's own text, not a bound parameter for the key: either database uses an
    # expression index only for the very expression it indexed.
    return literal_column(NAME_EXPRESSION[dialect])


async def select_work_matching(
    connection: AsyncConnection,
    tenant_id: str | None,
    kind: WorkKind,
    *,
    name: str | None = None,
    id_prefix: str | None = None,
    active_only: bool = False,
    limit: int,
) -> tuple[WorkRecord, ...]:
    """The tenant's work of `kind` (every tenant's with `tenant_id=None`) named `name`
    or whose id starts with `id_prefix` (`active_only`: not ended), newest first, at
    most `limit`."""
    query = work_matching_query(
        connection.dialect.name,
        tenant_id,
        kind,
        name=name,
        id_prefix=id_prefix,
        active_only=active_only,
        limit=limit,
    )
    rows = (await connection.execute(query)).all()
    return tuple(work_from_row(row) for row in rows)


async def select_live_named(
    connection: AsyncConnection, tenant_id: str | None, kind: WorkKind, name: str, *, limit: int
) -> LiveNamed:
    """The tenant's live work of `kind` (every tenant's with `tenant_id=None`) named
    `name`: at most `limit` items that are no job array's task, and at most `limit` job
    arrays with live tasks of the name."""
    dialect = connection.dialect.name
    rows = (
        await connection.execute(live_work_named_query(dialect, tenant_id, kind, name, limit=limit))
    ).all()
    arrays = await connection.execute(
        live_arrays_named_query(dialect, tenant_id, kind, name, limit=limit)
    )
    return LiveNamed(
        work=tuple(work_from_row(row) for row in rows),
        arrays=tuple(
            NamedArray(str(row.array_id), int(row.live_tasks), float(row.submitted_at))
            for row in arrays
        ),
    )


def _conditions(
    dialect: str,
    tenant_id: str | None,
    kind: WorkKind,
    *,
    name: str | None = None,
    id_prefix: str | None = None,
    active_only: bool = False,
) -> list[ColumnElement[bool]]:
    conditions = [work.c.kind == kind]
    if active_only:
        conditions.append(work.c.state.not_in(sorted(TERMINAL_STATES)))
    if tenant_id is not None:
        conditions.append(work.c.tenant_id == tenant_id)
    if name is not None:
        conditions.append(_spec_name(dialect) == name)
    if id_prefix is not None:
        # Ids are Crockford base 32 (no '%' or '_'): the prefix needs no escaping.
        conditions.append(work.c.id.startswith(id_prefix, autoescape=True))
    return conditions


def work_matching_query(
    dialect: str,
    tenant_id: str | None,
    kind: WorkKind,
    *,
    name: str | None = None,
    id_prefix: str | None = None,
    active_only: bool = False,
    limit: int,
) -> Select[Any]:
    """`select_work_matching`'s query (apart, so that tests can ask each database how
    it would read it)."""
    conditions = _conditions(
        dialect, tenant_id, kind, name=name, id_prefix=id_prefix, active_only=active_only
    )
    return select(*WORK_RECORD_COLUMNS).where(*conditions).order_by(work.c.id.desc()).limit(limit)


def live_work_named_query(
    dialect: str, tenant_id: str | None, kind: WorkKind, name: str, *, limit: int
) -> Select[Any]:
    """The live work of the name that is no array's task (the task's row, if any, is
    found by its unique work id)."""
    conditions = _conditions(dialect, tenant_id, kind, name=name, active_only=True)
    task = exists().where(array_tasks.c.work_id == work.c.id)
    return (
        select(*WORK_RECORD_COLUMNS)
        .where(*conditions, ~task)
        .order_by(work.c.id.desc())
        .limit(limit)
    )


def live_arrays_named_query(
    dialect: str, tenant_id: str | None, kind: WorkKind, name: str, *, limit: int
) -> Select[Any]:
    """The arrays with live tasks of the name, newest first. Every live task of the
    name is read (an array's tasks all carry its name): the name index narrows the rows
    to the runs of the name, and each task's array is found by its unique work id."""
    conditions = _conditions(dialect, tenant_id, kind, name=name, active_only=True)
    return (
        select(
            array_tasks.c.array_id,
            func.count().label("live_tasks"),
            func.min(work.c.submitted_at).label("submitted_at"),
        )
        .select_from(work.join(array_tasks, array_tasks.c.work_id == work.c.id))
        .where(*conditions)
        .group_by(array_tasks.c.array_id)
        .order_by(array_tasks.c.array_id.desc())
        .limit(limit)
    )
