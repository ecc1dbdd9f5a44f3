"""Work rows: submission with idempotency keys, scoped reads, keyset pagination."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import Select, and_, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from cloud.store.changes import state_event_row
from cloud.store.dependencies import insert_dependencies
from cloud.store.errors import QueueFullError, TenantNotFoundError
from cloud.store.records import (
    AllocationRecord,
    NewDependency,
    SubmitResult,
    WorkPage,
    WorkRecord,
    submitted_spec_digest,
)
from cloud.store.rows import allocation_from_row, work_from_row
from cloud.store.schema import WORK_RECORD_COLUMNS, allocations, tenants, work
from cloud.store.sql import StoreContext, append_events, chunks, insert_ignoring
from cloud.store.states import TERMINAL_STATES
from shared.work_literals import WORK_STATES, PriorityClass, WorkKind, WorkState

MAX_PAGE = 1000


@dataclass(frozen=True, slots=True)
class NewWork:
    """One submission of a group committed together (`insert_work_group`)."""

    work_id: str
    tenant_id: str
    kind: WorkKind
    spec: bytes
    priority: PriorityClass
    idempotency_key: str | None
    dependencies: Sequence[NewDependency] = ()


Submitted = SubmitResult | QueueFullError | TenantNotFoundError


async def insert_work_group(
    connection: AsyncConnection, context: StoreContext, group: Sequence[NewWork]
) -> list[Submitted]:
    """Insert pending work that arrived together (cloud/store/group_commit.py), in one
    transaction and a handful of statements whatever their number; per submission, in
    order, its result or why it was refused.

    A retry with an idempotency key (or its twin in the group) gets the tenant's
    earlier work with `created=False`. `ON CONFLICT DO NOTHING` keeps that atomic under
    concurrency: on PostgreSQL an insert with a key another transaction holds waits for
    it and then sees its row; on SQLite writers are serialised by `BEGIN IMMEDIATE`.
    New work beyond the tenant's `max_queued` is refused with `QueueFullError`, in
    arrival order; an unknown tenant with `TenantNotFoundError`.
    """
    results: list[Submitted | None] = [None] * len(group)
    now = context.clock()
    caps, queued = await _tenant_caps(connection, {item.tenant_id for item in group})
    # A retry must not count against a cap, so those tenants' keys are looked up first;
    # any other retry is found by its conflict (one statement fewer for the group).
    earlier = await _earlier_by_key(
        connection, [item for item in group if caps.get(item.tenant_id) is not None]
    )
    leaders: dict[tuple[str, str], int] = {}  # (tenant, key) -> index of its first
    twins: dict[int, int] = {}
    for index, item in enumerate(group):
        if item.idempotency_key is None:
            continue
        pair = (item.tenant_id, item.idempotency_key)
        if pair in earlier:
            results[index] = SubmitResult(earlier[pair], False)
        elif pair in leaders:
            twins[index] = leaders[pair]
        else:
            leaders[pair] = index
    admitted = []
    for index, item in enumerate(group):
        if results[index] is not None or index in twins:
            continue
        if item.tenant_id not in caps:
            results[index] = TenantNotFoundError(item.tenant_id)
            continue
        cap = caps[item.tenant_id]
        if cap is not None:
            count = queued.get(item.tenant_id, 0)
            if count >= cap:
                results[index] = QueueFullError(item.tenant_id, cap, count)
                continue
            queued[item.tenant_id] = count + 1
        admitted.append(index)
    records = {index: _pending_record(group[index], now) for index in admitted}
    inserted: set[str] = set()
    if admitted:
        statement = insert_ignoring(context.backend, work, ["tenant_id", "idempotency_key"])
        rows = await connection.execute(
            statement.returning(work.c.id), [_work_values(records[i]) for i in admitted]
        )
        inserted = {str(work_id) for work_id in rows.scalars()}
    for index in admitted:
        record = records[index]
        if record.work_id in inserted:
            results[index] = SubmitResult(record, True)
            await insert_dependencies(connection, record.work_id, group[index].dependencies)
        else:  # another process committed the same key meanwhile
            assert record.idempotency_key is not None  # only a key conflicts
            winner = await select_work_by_idempotency_key(
                connection, record.tenant_id, record.idempotency_key
            )
            assert winner is not None  # its conflict was with a committed row
            results[index] = SubmitResult(winner, False)
    for index, leader in twins.items():
        first = results[leader]
        results[index] = (
            SubmitResult(first.work, False) if isinstance(first, SubmitResult) else first
        )
    created = [records[i] for i in admitted if records[i].work_id in inserted]
    rows = [state_event_row(record, None, now) for record in created]
    await append_events(connection, context, rows, returning=False)  # last: it locks
    return [result for result in results if result is not None]


async def _earlier_by_key(
    connection: AsyncConnection, group: Sequence[NewWork]
) -> dict[tuple[str, str], WorkRecord]:
    keyed = [item for item in group if item.idempotency_key is not None]
    found: dict[tuple[str, str], WorkRecord] = {}
    for part in chunks(keyed):
        query = select(*WORK_RECORD_COLUMNS).where(
            work.c.tenant_id.in_({item.tenant_id for item in part}),
            work.c.idempotency_key.in_({item.idempotency_key for item in part}),
        )
        for row in await connection.execute(query):
            record = work_from_row(row)
            if record.idempotency_key is not None:
                found[(record.tenant_id, record.idempotency_key)] = record
    return found


async def _tenant_caps(
    connection: AsyncConnection, tenant_ids: set[str]
) -> tuple[dict[str, int | None], dict[str, int]]:
    """The `max_queued` of each tenant that exists, and the pending work of those that
    have one. A capped tenant's row is locked first (PostgreSQL), so concurrent groups
    count one after the other and never pass the cap together."""
    query = select(tenants.c.id, tenants.c.max_queued).where(tenants.c.id.in_(sorted(tenant_ids)))
    caps: dict[str, int | None] = {
        row.id: row.max_queued for row in await connection.execute(query)
    }
    capped = sorted(tenant_id for tenant_id, cap in caps.items() if cap is not None)
    if not capped:
        return caps, {}
    locked = query.where(tenants.c.id.in_(capped)).with_for_update()
    caps |= {row.id: row.max_queued for row in await connection.execute(locked)}
    pending = (
        select(work.c.tenant_id, func.count())
        .where(work.c.tenant_id.in_(capped), work.c.state == "pending")
        .group_by(work.c.tenant_id)
    )
    return caps, {tenant_id: int(count) for tenant_id, count in await connection.execute(pending)}


def _pending_record(item: NewWork, now: float) -> WorkRecord:
    return WorkRecord(
        work_id=item.work_id,
        tenant_id=item.tenant_id,
        kind=item.kind,
        spec=item.spec,
        priority=item.priority,
        state="pending",
        state_reason=None,
        attempts=0,
        submitted_at=now,
        updated_at=now,
        idempotency_key=item.idempotency_key,
        version=1,
        submitted_spec_sha256=(
            None if item.idempotency_key is None else submitted_spec_digest(item.spec)
        ),
    )


def _work_values(record: WorkRecord) -> dict[str, Any]:
    return {
        "id": record.work_id,
        "tenant_id": record.tenant_id,
        "kind": record.kind,
        "spec": record.spec,
        "priority": record.priority,
        "state": "pending",
        "state_reason": None,
        "attempts": 0,
        "failures": 0,
        "not_before": None,
        "submitted_at": record.submitted_at,
        "updated_at": record.updated_at,
        "idempotency_key": record.idempotency_key,
        "version": 1,
        "submitted_spec_sha256": record.submitted_spec_sha256,
    }


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
    connection: AsyncConnection, previous: Sequence[WorkRecord] = ()
) -> tuple[WorkRecord, ...]:
    """Every non-terminal item, oldest first.

    With `previous` (the records of an earlier read), only items whose version moved
    are read in full: a scheduling loop with thousands of queued jobs then reads ids,
    versions and reasons (which change without a version) instead of every spec. Each
    of those light rows is compared with its record in a worker thread: with tens of
    thousands queued that takes tens of ms, which the event loop serves requests in.
    """
    active = [state for state in WORK_STATES if state not in TERMINAL_STATES]
    if not previous:
        query = select(*WORK_RECORD_COLUMNS).where(work.c.state.in_(active)).order_by(work.c.id)
        return tuple(work_from_row(row) for row in await connection.execute(query))
    light = select(work.c.id, work.c.version, work.c.state_reason).where(work.c.state.in_(active))
    rows = (await connection.execute(light)).all()
    current, stale = await asyncio.to_thread(_unchanged, rows, previous)
    for batch in chunks(stale):
        query = select(*WORK_RECORD_COLUMNS).where(work.c.id.in_(batch))
        for row in await connection.execute(query):
            record = work_from_row(row)
            current[record.work_id] = record
    return await asyncio.to_thread(_in_id_order, current)


def _unchanged(
    rows: Sequence[Any], previous: Sequence[WorkRecord]
) -> tuple[dict[str, WorkRecord], list[str]]:
    """The records of `previous` that the light rows (id, version, reason) show
    unchanged (a new reason replaced), and the ids to read in full."""
    known = {record.work_id: record for record in previous}
    current: dict[str, WorkRecord] = {}
    stale: list[str] = []
    for work_id, version, reason in rows:
        record = known.get(work_id)
        if record is None or record.version != int(version):
            stale.append(work_id)
        else:
            current[work_id] = (
                record if record.state_reason == reason else replace(record, state_reason=reason)
            )
    return current, stale


def _in_id_order(records: dict[str, WorkRecord]) -> tuple[WorkRecord, ...]:
    return tuple(records[work_id] for work_id in sorted(records))


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
