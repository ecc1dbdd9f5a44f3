"""Work found by what a person types instead of its id: its name or a prefix of its id.

`select_work_matching` reads the candidates (a bounded number, newest first); which of
them the reference means, or that it is ambiguous, is decided in cloud/work/lookup.py.
The name lives in the stored spec (a JSON document): SQLite reads it with
`json_extract`, PostgreSQL with `->>` on its `json` column, so no column or migration
is needed; the tenant's index narrows the rows read to its own.
"""

from __future__ import annotations

from sqlalchemy import ColumnElement, func, select, type_coerce
from sqlalchemy.dialects.postgresql import JSON
from sqlalchemy.ext.asyncio import AsyncConnection

from cloud.store.records import WorkRecord
from cloud.store.rows import work_from_row
from cloud.store.schema import WORK_RECORD_COLUMNS, work
from cloud.store.states import TERMINAL_STATES
from shared.work_literals import WorkKind


def _spec_name(dialect: str) -> ColumnElement[str]:
    if dialect == "postgresql":
        as_text: ColumnElement[str] = type_coerce(work.c.spec, JSON)["name"].as_string()
        return as_text
    extracted: ColumnElement[str] = func.json_extract(work.c.spec, "$.name")
    return extracted


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
    conditions = [work.c.kind == kind]
    if active_only:
        conditions.append(work.c.state.not_in(sorted(TERMINAL_STATES)))
    if tenant_id is not None:
        conditions.append(work.c.tenant_id == tenant_id)
    if name is not None:
        conditions.append(_spec_name(connection.dialect.name) == name)
    if id_prefix is not None:
        # Ids are Crockford base 32 (no '%' or '_'): the prefix needs no escaping.
        conditions.append(work.c.id.startswith(id_prefix, autoescape=True))
    query = select(*WORK_RECORD_COLUMNS).where(*conditions).order_by(work.c.id.desc()).limit(limit)
    rows = (await connection.execute(query)).all()
    return tuple(work_from_row(row) for row in rows)
