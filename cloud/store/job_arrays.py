"""Job arrays in the store: every task an ordinary training job (a `work` row), mapped
to its array and index by `array_tasks`.

An array is submitted as one transaction (`insert_array`): all its tasks or none, so a
201 means every task is committed. Its idempotency key is held by its first task, which
also keeps the digest of its spec as submitted (`WorkRecord.submitted_spec_sha256`,
with or without a key); a retry gets that task back, which names its array. The
tenant's `max_queued` counts tasks: an array that does not fit whole is refused whole.
Every task keeps its own dependency rows, written in one batch (the API bounds their
number: cloud/api/job_arrays.py `MAX_ARRAY_DEPENDENCY_ROWS`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from sqlalchemy import and_, insert, select
from sqlalchemy.ext.asyncio import AsyncConnection

from cloud.store.changes import state_event_row
from cloud.store.dependencies import insert_dependencies_of
from cloud.store.errors import QueueFullError, TenantNotFoundError
from cloud.store.records import SubmitResult, WorkRecord, submitted_spec_digest
from cloud.store.rows import work_from_row
from cloud.store.schema import WORK_RECORD_COLUMNS, array_tasks, work
from cloud.store.sql import StoreContext, append_events, chunks
from cloud.store.work import (
    NewWork,
    _pending_record,
    _tenant_caps,
    _work_values,
    select_work_by_idempotency_key,
)


@dataclass(frozen=True, slots=True)
class NewArrayTask:
    """One task of an array being submitted: its index and the job it is."""

    index: int
    work: NewWork


@dataclass(frozen=True, slots=True)
class ArrayTaskRecord:
    """One task of an array as stored: its index and its job."""

    array_id: str
    index: int
    work: WorkRecord


async def insert_array(
    connection: AsyncConnection,
    context: StoreContext,
    tenant_id: str,
    array_id: str,
    tasks: Sequence[NewArrayTask],
) -> SubmitResult | QueueFullError | TenantNotFoundError:
    """Insert every task of an array as pending work, in the caller's transaction.

    The first task carries the submission's idempotency key: an earlier submission with
    that key is returned (`created=False`) and nothing is inserted. A concurrent one
    that commits the key first makes this insert fail on the key's unique index; the
    caller looks the key up again then.
    """
    now = context.clock()
    caps, queued = await _tenant_caps(connection, {tenant_id})
    if tenant_id not in caps:
        return TenantNotFoundError(tenant_id)
    key = tasks[0].work.idempotency_key
    if key is not None:
        earlier = await select_work_by_idempotency_key(connection, tenant_id, key)
        if earlier is not None:
            return SubmitResult(earlier, False)
    cap = caps[tenant_id]
    count = queued.get(tenant_id, 0)
    if cap is not None and count + len(tasks) > cap:
        return QueueFullError(tenant_id, cap, count)
    records = [_pending_record(task.work, now) for task in tasks]
    records[0] = _with_submitted_digest(records[0])
    for records_part in chunks(records):
        await connection.execute(insert(work), [_work_values(record) for record in records_part])
    await insert_dependencies_of(
        connection, [(task.work.work_id, task.work.dependencies) for task in tasks]
    )
    rows = [
        {
            "array_id": array_id,
            "task_index": task.index,
            "work_id": task.work.work_id,
            "tenant_id": tenant_id,
        }
        for task in tasks
    ]
    for rows_part in chunks(rows):
        await connection.execute(insert(array_tasks), rows_part)
    events = [state_event_row(record, None, now) for record in records]
    await append_events(connection, context, events, returning=False)  # last: it locks
    return SubmitResult(records[0], True)


def _with_submitted_digest(first: WorkRecord) -> WorkRecord:
    """The first task keeps the digest of its spec as submitted even without a key: the
    array's view shows the spec submitted, which a PATCH of any task does not change,
    and finds a task still as submitted by it (cloud/api/job_arrays.py). One digest per
    array, not one per task."""
    if first.submitted_spec_sha256 is not None:
        return first
    return replace(first, submitted_spec_sha256=submitted_spec_digest(first.spec))


async def select_array_tasks(
    connection: AsyncConnection, tenant_id: str | None, array_id: str
) -> tuple[ArrayTaskRecord, ...]:
    """The tasks of the tenant's array (`None`: any tenant's), by index; none: no such
    array."""
    query = (
        select(array_tasks.c.task_index, *WORK_RECORD_COLUMNS)
        .join(work, work.c.id == array_tasks.c.work_id)
        .where(array_tasks.c.array_id == array_id)
        .order_by(array_tasks.c.task_index)
    )
    if tenant_id is not None:
        query = query.where(array_tasks.c.tenant_id == tenant_id)
    return tuple(
        ArrayTaskRecord(array_id, int(row.task_index), work_from_row(row))
        for row in await connection.execute(query)
    )


async def select_task_id(
    connection: AsyncConnection, tenant_id: str | None, array_id: str, index: int
) -> str | None:
    """The job id of task `index` of the tenant's array (`None`: any tenant's)."""
    conditions = [array_tasks.c.array_id == array_id, array_tasks.c.task_index == index]
    if tenant_id is not None:
        conditions.append(array_tasks.c.tenant_id == tenant_id)
    query = select(array_tasks.c.work_id).where(and_(*conditions))
    found = (await connection.execute(query)).scalar()
    return None if found is None else str(found)
