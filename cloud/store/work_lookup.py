"""Work found by what a person types instead of its id: its name or a prefix of its id.

`select_work_matching` reads the candidates (a bounded number, newest first); which of
them the reference means, or that it is ambiguous, is decided in cloud/work/lookup.py.
The name lives in the stored spec (a JSON document): SQLite reads it with
`json_extract`, PostgreSQL with `->>` on its `json` column, and an index on that
expression (migration v23) narrows the rows read to the runs of the name, however long
the history.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, Select, literal_column, select
from sqlalchemy.ext.asyncio import AsyncConnection

from cloud.store.migrations.v0023_work_name_index import NAME_EXPRESSION
from cloud.store.records import WorkRecord
from cloud.store.rows import work_from_row
from cloud.store.schema import WORK_RECORD_COLUMNS, work
from cloud.store.states import TERMINAL_STATES
from shared.work_literals import WorkKind


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
    return select(*WORK_RECORD_COLUMNS).where(*conditions).order_by(work.c.id.desc()).limit(limit)
