"""Job control by a person, in the store: hold and release, suspend and resume, requeue,
and changing a queued job (cloud/api/job_control.py decides what is allowed and why).

- A hold keeps pending work out of the scheduler's queue (`work.hold`: "held" or
  "suspended"; cloud/loop/inputs.py leaves such work out) until it is lifted. Setting
  or lifting it changes no state: the work stays pending, its reason says who held it,
  and a `work.hold` event records the change.
- A requeue (and the suspend of placed work) moves scheduled or running work back to
  pending along the state machine's requeue edge, as a preemption does: its
  allocations end, its nodes are told (the agent stops the workers; a job that saves
  checkpoints resumes from its newest one when placed again, `GREENFED_ATTEMPT` one
  higher). Unlike a preemption it never fails the job: `work.requeues` counts these
  placements apart, and `store.max_attempts` does not count them.
- A queued job (pending, never placed) may get a new spec and priority; a `work.updated`
  event names the fields that changed (none changed: nothing is written).

Every change bumps the work's version (a pass planned before it is planned again) and
is recorded in the audit log with the change itself, in one transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import msgspec
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from cloud.store.audit import NewAudit, insert_audit
from cloud.store.changes import Changes, apply_changes, event_row
from cloud.store.errors import IllegalTransitionError, VersionConflictError, WorkNotFoundError
from cloud.store.records import CommitResult, NewEvent, StateWrite, WorkRecord
from cloud.store.rows import check_json_object, encode_json, work_from_row
from cloud.store.schema import WORK_RECORD_COLUMNS, work
from cloud.store.sql import StoreContext, append_events
from cloud.store.states import PLACED_STATES, HoldKind
from shared.work_literals import PriorityClass, WorkKind

HOLD_EVENT = "work.hold"
UPDATED_EVENT = "work.updated"


class HoldChanged(msgspec.Struct, frozen=True, kw_only=True):
    """Payload of a `work.hold` event: pending work held, suspended, released or resumed."""

    work_id: str
    kind: WorkKind
    hold: HoldKind | None  # None: lifted, the work is queued again
    reason: str | None
    actor: str | None  # the tenant who asked, by name
    version: int


class QueuedWorkChanged(msgspec.Struct, frozen=True, kw_only=True):
    """Payload of a `work.updated` event for a queued job's changed spec."""

    work_id: str
    version: int
    changed: tuple[str, ...]  # the spec's fields that changed, e.g. ("priority", "workers")
    actor: str | None


async def locked_work(connection: AsyncConnection, tenant_id: str, work_id: str) -> WorkRecord:
    """The tenant's work, its row locked until the transaction ends (PostgreSQL; SQLite's
    writer holds the whole database). Raises `WorkNotFoundError`."""
    query = (
        select(*WORK_RECORD_COLUMNS)
        .where(work.c.id == work_id, work.c.tenant_id == tenant_id)
        .with_for_update()
    )
    row = (await connection.execute(query)).first()
    if row is None:
        raise WorkNotFoundError(work_id)
    return work_from_row(row)


async def _locked(
    connection: AsyncConnection, tenant_id: str, work_id: str, expected_version: int | None
) -> WorkRecord:
    record = await locked_work(connection, tenant_id, work_id)
    if expected_version is not None and record.version != expected_version:
        raise VersionConflictError([work_id])
    return record


def _hold_event(record: WorkRecord, actor: str | None, at: float) -> NewEvent:
    payload = HoldChanged(
        work_id=record.work_id,
        kind=record.kind,
        hold=record.hold,
        reason=record.state_reason,
        actor=actor,
        version=record.version,
    )
    return NewEvent(
        kind=HOLD_EVENT,
        payload=encode_json(payload),
        tenant_id=record.tenant_id,
        work_id=record.work_id,
    )


async def set_hold(
    connection: AsyncConnection,
    context: StoreContext,
    tenant_id: str,
    work_id: str,
    hold: HoldKind | None,
    *,
    reason: str,
    actor: str | None,
    expected_version: int | None,
    audit: NewAudit | None,
) -> WorkRecord:
    """Hold (or lift the hold of) the tenant's pending work. Raises `WorkNotFoundError`,
    `VersionConflictError`, and `IllegalTransitionError` for work not pending."""
    record = await _locked(connection, tenant_id, work_id, expected_version)
    if record.state != "pending":
        raise IllegalTransitionError(work_id, record.state, "pending")
    now = context.clock()
    if audit is not None:
        await insert_audit(connection, audit, now)
    changed = replace(
        record, hold=hold, state_reason=reason, version=record.version + 1, updated_at=now
    )
    await connection.execute(
        update(work)
        .where(work.c.id == work_id)
        .values(hold=hold, state_reason=reason, version=changed.version, updated_at=now)
    )
    # Last: on PostgreSQL the append serialises the event log in commit order.
    await append_events(
        connection, context, [event_row(_hold_event(changed, actor, now), now)], returning=False
    )
    return changed


async def requeue_placed(
    connection: AsyncConnection,
    context: StoreContext,
    tenant_id: str,
    work_id: str,
    *,
    hold: HoldKind | None,
    reason: str,
    actor: str | None,
    expected_version: int | None,
    audit: NewAudit | None,
) -> CommitResult:
    """The tenant's scheduled or running work back to pending (held with `hold`, if
    given): its allocations end and its nodes get a new desired state. Raises
    `WorkNotFoundError`, `VersionConflictError`, and `IllegalTransitionError` for work
    not placed."""
    record = await _locked(connection, tenant_id, work_id, expected_version)
    if record.state not in PLACED_STATES:
        raise IllegalTransitionError(work_id, record.state, "pending")
    now = context.clock()
    if audit is not None:
        await insert_audit(connection, audit, now)
    # Before the state change, which reads the row again and keeps these columns.
    await connection.execute(
        update(work).where(work.c.id == work_id).values(hold=hold, requeues=record.requeues + 1)
    )
    after = replace(record, hold=hold, state_reason=reason, version=record.version + 1)
    held = () if hold is None else (_hold_event(after, actor, now),)
    return await apply_changes(
        connection,
        context,
        Changes(
            state_changes=(
                StateWrite(
                    work_id=work_id,
                    to_state="pending",
                    reason=reason,
                    expected_version=record.version,
                    actor=actor,
                ),
            ),
            events=held,
            tenant_id=tenant_id,
        ),
    )


async def update_queued(
    connection: AsyncConnection,
    context: StoreContext,
    tenant_id: str,
    work_id: str,
    *,
    spec: bytes,
    priority: PriorityClass,
    changed_fields: Sequence[str],
    actor: str | None,
    expected_version: int | None,
    audit: NewAudit | None,
) -> WorkRecord:
    """Replace the spec and priority of the tenant's queued work (pending and never
    placed: nothing of it runs anywhere); `changed_fields` names what differs (the
    caller compares), and with none nothing is written: the work is returned as it is.
    Raises `WorkNotFoundError`, `VersionConflictError`, and `IllegalTransitionError`
    for work placed before."""
    check_json_object(spec, "spec")
    record = await _locked(connection, tenant_id, work_id, expected_version)
    if record.state != "pending" or record.attempts > 0:
        raise IllegalTransitionError(work_id, record.state, record.state)
    if not changed_fields:
        return record  # no version, no event, no audit entry for a change of nothing
    now = context.clock()
    if audit is not None:
        await insert_audit(connection, audit, now)
    changed = replace(
        record, spec=spec, priority=priority, version=record.version + 1, updated_at=now
    )
    await connection.execute(
        update(work)
        .where(work.c.id == work_id)
        .values(spec=spec, priority=priority, version=changed.version, updated_at=now)
    )
    payload = QueuedWorkChanged(
        work_id=work_id, version=changed.version, changed=tuple(changed_fields), actor=actor
    )
    event = NewEvent(
        kind=UPDATED_EVENT, payload=encode_json(payload), tenant_id=tenant_id, work_id=work_id
    )
    await append_events(connection, context, [event_row(event, now)], returning=False)
    return changed
