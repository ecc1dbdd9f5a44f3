"""Work rows: submission with idempotency keys, scoped reads, keyset pagination."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from sqlalchemy import Select, and_, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from cloud.store.changes import state_event_row
from cloud.store.errors import QueueFullError, TenantNotFoundError
from cloud.store.records import AllocationRecord, SubmitResult, WorkPage, WorkRecord
from cloud.store.rows import allocation_from_row, work_from_row
from cloud.store.schema import WORK_RECORD_COLUMNS, allocations, tenants, work
from cloud.store.sql import StoreContext, append_events, chunks, insert_ignoring
from cloud.store.states import TERMINAL_STATES
from shared.work_literals import WORK_STATES, PriorityClass, WorkKind, WorkState

MAX_PAGE = 1000


async def insert_work(
    connection: AsyncConnection,
    context: StoreContext,
    *,
    work_id: str,
    tenant_id: str,
    kind: WorkKind,
    spec: bytes,
    priority: PriorityClass,
    idempotency_key: str | None,
) -> SubmitResult:
    """Insert pending work, or return the tenant's earlier work with the same key.

    `ON CONFLICT DO NOTHING` makes the pair atomic under concurrency: on PostgreSQL a
    second insert with the key waits for the first transaction and then sees its row;
    on SQLite writers are serialised by `BEGIN IMMEDIATE`. New work beyond the
    tenant's `max_queued` raises `QueueFullError` (a retry still gets its original).
    """
    if idempotency_key is not None:
        earlier = await select_work_by_idempotency_key(connection, tenant_id, idempotency_key)
        if earlier is not None:
            return SubmitResult(earlier, False)
    await _check_queue(connection, tenant_id)
    now = context.clock()
    record = WorkRecord(
        work_id=work_id,
        tenant_id=tenant_id,
        kind=kind,
        spec=spec,
        priority=priority,
        state="pending",
        state_reason=None,
        attempts=0,
        submitted_at=now,
        updated_at=now,
        idempotency_key=idempotency_key,
        version=1,
    )
    values: dict[str, Any] = {
        "id": work_id,
        "tenant_id": tenant_id,
        "kind": kind,
        "spec": spec,
        "priority": priority,
        "state": "pending",
        "state_reason": None,
        "attempts": 0,
        "failures": 0,
        "not_before": None,
        "submitted_at": now,
        "updated_at": now,
        "idempotency_key": idempotency_key,
        "version": 1,
    }
    statement = insert_ignoring(context.backend, work, ["tenant_id", "idempotency_key"])
    try:
        inserted = (await connection.execute(statement, values)).rowcount
    except IntegrityError:
        # The only other constraint a valid record can break: the tenant's foreign key.
        raise TenantNotFoundError(tenant_id) from None
    if inserted == 0:
        query = select(*WORK_RECORD_COLUMNS).where(
            work.c.tenant_id == tenant_id, work.c.idempotency_key == idempotency_key
        )
        return SubmitResult(work_from_row((await connection.execute(query)).one()), False)
    await append_events(connection, context, [state_event_row(record, None, now)], returning=False)
    return SubmitResult(record, True)


async def _check_queue(connection: AsyncConnection, tenant_id: str) -> None:
    """Raise `QueueFullError` when the tenant's pending work is at its `max_queued`.
    The tenant's row is locked first (PostgreSQL), so concurrent submissions of one
    tenant count one after the other and never pass the cap together."""
    cap_query = select(tenants.c.max_queued).where(tenants.c.id == tenant_id)
    if (await connection.execute(cap_query)).scalar() is None:
        return  # no cap (or no such tenant: the insert says so)
    cap = (await connection.execute(cap_query.with_for_update())).scalar()
    if cap is None:
        return
    pending = select(func.count()).where(work.c.tenant_id == tenant_id, work.c.state == "pending")
    queued = int((await connection.execute(pending)).scalar_one())
    if queued >= cap:
        raise QueueFullError(tenant_id, int(cap), queued)


async def select_work(
    connection: AsyncConnection, work_id: str, tenant_id: str | None
) -> WorkRecord | None:
    query = select(*WORK_RECORD_COLUMNS).where(work.c.id == work_id)
    if tenant_id is not None:
        query = query.where(work.c.tenant_id == tenant_id)
    row = (await connection.execute(query)).first()
    return None if row is None else work_from_row(row)


async def select_work_by_idempotency_key(
    connection: AsyncConnection, tenant_id: str, idempotency_key: str
) -> WorkRecord | None:
    query = select(*WORK_RECORD_COLUMNS).where(
        work.c.tenant_id == tenant_id, work.c.idempotency_key == idempotency_key
    )
    row = (await connection.execute(query)).first()
    return None if row is None else work_from_row(row)


async def list_work_page(
    connection: AsyncConnection,
    tenant_id: str | None,
    *,
    states: Sequence[WorkState],
    kinds: Sequence[WorkKind],
    priorities: Sequence[PriorityClass],
    limit: int,
    cursor: str | None,
) -> WorkPage:
    """Newest first. The cursor is the last id of the previous page: ids only grow, so
    work submitted meanwhile lands before the first page and never shifts later ones."""
    if not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit must be within 1..{MAX_PAGE}")
    conditions = [] if tenant_id is None else [work.c.tenant_id == tenant_id]
    if states:
        conditions.append(work.c.state.in_(list(states)))
    if kinds:
        conditions.append(work.c.kind.in_(list(kinds)))
    if priorities:
        conditions.append(work.c.priority.in_(list(priorities)))
    if cursor is not None:
        conditions.append(work.c.id < cursor)
    query = (
        select(*WORK_RECORD_COLUMNS)
        .where(and_(True, *conditions))
        .order_by(work.c.id.desc())
        .limit(limit + 1)
    )
    rows = (await connection.execute(query)).all()
    items = tuple(work_from_row(row) for row in rows[:limit])
    return WorkPage(items, items[-1].work_id if len(rows) > limit else None)


async def select_active_work(
    connection: AsyncConnection, previous: Mapping[str, WorkRecord] | None = None
) -> tuple[WorkRecord, ...]:
    """Every non-terminal item, oldest first.

    With `previous` (the records of an earlier read), only items whose version moved
    are read in full: a scheduling loop with thousands of queued jobs then reads ids,
    versions and reasons (which change without a version) instead of every spec.
    """
    active = [state for state in WORK_STATES if state not in TERMINAL_STATES]
    if not previous:
        query = select(*WORK_RECORD_COLUMNS).where(work.c.state.in_(active)).order_by(work.c.id)
        return tuple(work_from_row(row) for row in await connection.execute(query))
    light = select(work.c.id, work.c.version, work.c.state_reason).where(work.c.state.in_(active))
    current: dict[str, WorkRecord] = {}
    stale: list[str] = []
    for work_id, version, reason in await connection.execute(light):
        known = previous.get(work_id)
        if known is None or known.version != int(version):
            stale.append(work_id)
        else:
            current[work_id] = (
                known if known.state_reason == reason else replace(known, state_reason=reason)
            )
    for batch in chunks(stale):
        query = select(*WORK_RECORD_COLUMNS).where(work.c.id.in_(batch))
        for row in await connection.execute(query):
            record = work_from_row(row)
            current[record.work_id] = record
    return tuple(current[work_id] for work_id in sorted(current))


def allocations_query() -> Select[Any]:
    return select(
        allocations,
        work.c.tenant_id,
        work.c.kind.label("work_kind"),
        work.c.priority,
    ).join(work, work.c.id == allocations.c.work_id)


async def select_allocations(
    connection: AsyncConnection, *, work_id: str | None = None, node_id: str | None = None
) -> tuple[AllocationRecord, ...]:
    query = allocations_query()
    if work_id is not None:
        query = query.where(allocations.c.work_id == work_id)
    if node_id is not None:
        query = query.where(allocations.c.node_id == node_id)
    query = query.order_by(allocations.c.work_id, allocations.c.member_index)
    return tuple(allocation_from_row(row) for row in await connection.execute(query))
