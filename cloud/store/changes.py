"""Applying state changes, evictions and placements inside one transaction.

Every change to work goes through `apply_changes`: it locks the rows, checks the
expected versions, walks each item through the state machine in memory, and only
then writes: work rows, allocations, the generations of every node whose
allocations changed, and a `work.state` event for every state change. Any error
raises before the transaction commits, so a failure leaves nothing behind.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

import msgspec
from sqlalchemy import bindparam, delete, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from cloud.store.drain_waiting import replace_drain_waiting
from cloud.store.errors import (
    IllegalTransitionError,
    InvalidPassWriteError,
    VersionConflictError,
    WorkNotFoundError,
)
from cloud.store.records import (
    CommitResult,
    EvictionWrite,
    NewAllocation,
    NewEvent,
    PlacementWrite,
    StateWrite,
    WorkRecord,
)
from cloud.store.rows import check_json_object, encode_json, work_from_row
from cloud.store.schema import WORK_RECORD_COLUMNS, allocations, events, work
from cloud.store.sql import StoreContext, append_events, bump_generations, chunks
from cloud.store.states import PLACED_STATES, is_legal, requeue
from shared.work_literals import WorkKind, WorkState

WORK_STATE_EVENT: Final = "work.state"


class WorkStateChanged(msgspec.Struct, frozen=True, kw_only=True):
    """Payload of a `work.state` event: what a tenant's event stream shows."""

    work_id: str
    kind: WorkKind
    state: WorkState
    previous_state: WorkState | None  # None: just submitted
    reason: str | None
    attempts: int
    version: int
    failures: int = 0  # the job's own failures so far, each retried by its policy
    retry_at: float | None = None  # pending after a failure: not placed before then
    actor: str | None = None  # the tenant who caused it (a cancellation); None: the system


def state_event_row(
    record: WorkRecord, previous: WorkState | None, at: float, actor: str | None = None
) -> dict[str, Any]:
    payload = WorkStateChanged(
        work_id=record.work_id,
        kind=record.kind,
        state=record.state,
        previous_state=previous,
        reason=record.state_reason,
        attempts=record.attempts,
        version=record.version,
        failures=record.failures,
        retry_at=record.not_before if record.state == "pending" else None,
        actor=actor,
    )
    return {
        "tenant_id": record.tenant_id,
        "work_id": record.work_id,
        "kind": WORK_STATE_EVENT,
        "payload": encode_json(payload),
        "at": at,
        "event_id": None,
    }


def event_row(event: NewEvent, at: float) -> dict[str, Any]:
    check_json_object(event.payload, f"payload of event {event.kind!r}")
    return {
        "tenant_id": event.tenant_id,
        "work_id": event.work_id,
        "kind": event.kind,
        "payload": event.payload,
        "at": at,
        "event_id": event.event_id,
    }


AllocationAction = Literal["keep", "clear", "replace"]


@dataclass(slots=True)
class _Draft:
    """A work row being changed in memory; written only when every item has passed."""

    original: WorkRecord
    state: WorkState
    reason: str | None
    attempts: int
    failures: int = 0
    not_before: float | None = None
    steps: list[tuple[WorkState, WorkState, str | None]] = field(default_factory=list)
    allocation_action: AllocationAction = "keep"
    new_allocations: tuple[NewAllocation, ...] = ()

    def move(self, to_state: WorkState, reason: str | None) -> None:
        if not is_legal(self.state, to_state):
            raise IllegalTransitionError(self.original.work_id, self.state, to_state)
        if to_state == "scheduled":
            self.attempts += 1
            self.not_before = None
        if to_state not in PLACED_STATES:
            self.allocation_action, self.new_allocations = "clear", ()
        self.steps.append((self.state, to_state, reason))
        self.state, self.reason = to_state, reason

    def place(self, placement: PlacementWrite) -> None:
        if self.state == "pending":
            self.move("scheduled", placement.reason)
        elif self.state in PLACED_STATES:
            if placement.reason is not None:
                self.reason = placement.reason
        else:
            raise IllegalTransitionError(self.original.work_id, self.state, "scheduled")
        self.allocation_action, self.new_allocations = "replace", placement.allocations

    @property
    def changed(self) -> bool:
        return (
            bool(self.steps)
            or self.allocation_action != "keep"
            or (self.reason != self.original.state_reason)
        )


@dataclass(frozen=True, slots=True)
class Changes:
    evictions: Sequence[EvictionWrite] = ()
    state_changes: Sequence[StateWrite] = ()
    placements: Sequence[PlacementWrite] = ()
    pending_reasons: Mapping[str, str] = field(default_factory=dict)
    events: Sequence[NewEvent] = ()
    explanations: Mapping[str, bytes] = field(default_factory=dict)
    drain_waiting: Mapping[str, tuple[str, ...]] | None = None  # None: as stored
    tenant_id: str | None = None  # set: work of other tenants is "not found"
    source_event_id: str | None = None  # an agent event: applied at most once


async def _lock_work(
    connection: AsyncConnection, work_ids: Sequence[str], tenant_id: str | None
) -> dict[str, WorkRecord]:
    found: dict[str, WorkRecord] = {}
    for batch in chunks(sorted(work_ids)):
        query = (
            select(*WORK_RECORD_COLUMNS)
            .where(work.c.id.in_(batch))
            .order_by(work.c.id)
            .with_for_update()
        )
        for row in await connection.execute(query):
            record = work_from_row(row)
            if tenant_id is None or record.tenant_id == tenant_id:
                found[record.work_id] = record
    return found


async def _event_seen(connection: AsyncConnection, event_id: str) -> bool:
    query = select(events.c.seq).where(events.c.event_id == event_id)
    return (await connection.execute(query)).first() is not None


async def _allocated_nodes(connection: AsyncConnection, work_ids: Sequence[str]) -> set[str]:
    nodes: set[str] = set()
    for batch in chunks(sorted(work_ids)):
        query = select(allocations.c.node_id).where(allocations.c.work_id.in_(batch)).distinct()
        nodes.update((await connection.execute(query)).scalars())
    return nodes


def _allocation_row(work_id: str, allocation: NewAllocation, now: float) -> dict[str, Any]:
    return {
        "work_id": work_id,
        "member_index": allocation.member_index,
        "node_id": allocation.node_id,
        "accelerator_kind": allocation.accelerator_kind,
        "accelerators": allocation.accelerators,
        "accelerator_ids": encode_json(list(allocation.accelerator_ids)),
        "host_memory_bytes": allocation.host_memory_bytes,
        "started_at": now,
        "expected_end": allocation.expected_end,
        "borrowed": allocation.borrowed,
        "state": "assigned",
        "power_limit_w": allocation.power_limit_w,
        "cpu_cores": allocation.cpu_cores,
    }


async def apply_changes(
    connection: AsyncConnection, context: StoreContext, changes: Changes
) -> CommitResult:
    """Apply `changes` in the caller's transaction; raise (and write nothing) on any error."""
    now = context.clock()
    items: list[EvictionWrite | StateWrite | PlacementWrite] = [
        *changes.evictions,
        *changes.state_changes,
        *changes.placements,
    ]
    ordered_ids = list(dict.fromkeys(item.work_id for item in items))
    rows = await _lock_work(connection, ordered_ids, changes.tenant_id)
    if changes.source_event_id is not None and await _event_seen(
        connection, changes.source_event_id
    ):
        return CommitResult((), {}, duplicate=True)
    missing = [work_id for work_id in ordered_ids if work_id not in rows]
    if missing:
        raise WorkNotFoundError(missing[0])
    expected = {
        item.work_id: item.expected_version for item in items if item.expected_version is not None
    }
    conflicts = [wid for wid, version in expected.items() if rows[wid].version != version]
    if conflicts:
        raise VersionConflictError(conflicts)

    drafts = {
        wid: _Draft(
            rows[wid],
            rows[wid].state,
            rows[wid].state_reason,
            rows[wid].attempts,
            rows[wid].failures,
            rows[wid].not_before,
        )
        for wid in ordered_ids
    }
    for eviction in changes.evictions:
        draft = drafts[eviction.work_id]
        if draft.state not in PLACED_STATES:
            raise IllegalTransitionError(eviction.work_id, draft.state, "pending")
        if eviction.retry_not_before is not None:
            # The job's own failure, retried by its policy: not an infrastructure loss.
            draft.failures += 1
            draft.move("pending", eviction.reason)
            draft.not_before = eviction.retry_not_before
            continue
        # Placements its own failures ended do not count against infrastructure losses,
        # nor do those a person's requeue or suspend ended (cloud/store/job_control.py).
        lost = draft.attempts - draft.failures - draft.original.requeues
        outcome = requeue(lost, context.max_attempts, eviction.reason)
        draft.move(outcome.to_state, outcome.reason)
    for change in changes.state_changes:
        if change.to_state == "scheduled":
            raise InvalidPassWriteError(f"{change.work_id}: work is scheduled by a PlacementWrite")
        drafts[change.work_id].move(change.to_state, change.reason)
    for placement in changes.placements:
        drafts[placement.work_id].place(placement)

    changed = [draft for draft in drafts.values() if draft.changed]
    reallocated = [d.original.work_id for d in changed if d.allocation_action != "keep"]
    touched_nodes = await _allocated_nodes(connection, reallocated)
    for batch in chunks(reallocated):
        await connection.execute(delete(allocations).where(allocations.c.work_id.in_(batch)))
    new_rows = [
        _allocation_row(draft.original.work_id, allocation, now)
        for draft in changed
        if draft.allocation_action == "replace"
        for allocation in draft.new_allocations
    ]
    touched_nodes.update(row["node_id"] for row in new_rows)
    for row_batch in chunks(new_rows):
        await connection.execute(insert(allocations), list(row_batch))

    records: list[WorkRecord] = []
    for draft in changed:
        records.append(
            replace(
                draft.original,
                state=draft.state,
                state_reason=draft.reason,
                attempts=draft.attempts,
                updated_at=now,
                version=draft.original.version + 1,
                failures=draft.failures,
                not_before=draft.not_before,
            )
        )
    if records:
        await connection.execute(
            update(work)
            .where(work.c.id == bindparam("b_id"))
            .values(
                state=bindparam("b_state"),
                state_reason=bindparam("b_reason"),
                attempts=bindparam("b_attempts"),
                failures=bindparam("b_failures"),
                not_before=bindparam("b_not_before"),
                updated_at=bindparam("b_updated_at"),
                version=bindparam("b_version"),
            ),
            [
                {
                    "b_id": record.work_id,
                    "b_state": record.state,
                    "b_reason": record.state_reason,
                    "b_attempts": record.attempts,
                    "b_failures": record.failures,
                    "b_not_before": record.not_before,
                    "b_updated_at": now,
                    "b_version": record.version,
                }
                for record in records
            ],
        )
    await _store_pending_reasons(connection, changes.pending_reasons, set(drafts))
    await _store_explanations(connection, changes.explanations, now)
    if changes.drain_waiting is not None:
        await replace_drain_waiting(connection, changes.drain_waiting)
    generations = await bump_generations(connection, context, touched_nodes)

    actors = {change.work_id: change.actor for change in changes.state_changes if change.actor}
    event_rows: list[dict[str, Any]] = []
    for draft, record in zip(changed, records, strict=True):
        for previous, to_state, reason in draft.steps:
            step = replace(record, state=to_state, state_reason=reason)
            event_rows.append(state_event_row(step, previous, now, actors.get(record.work_id)))
    event_rows.extend(event_row(event, now) for event in changes.events)
    if changes.source_event_id is not None and event_rows:
        # The agent's event id marks the first change it caused: a resend finds it.
        event_rows[0]["event_id"] = changes.source_event_id
    await append_events(connection, context, event_rows, returning=False)
    return CommitResult(tuple(records), generations)


async def _store_pending_reasons(
    connection: AsyncConnection, reasons: Mapping[str, str], skip: set[str]
) -> None:
    params = [
        {"b_id": work_id, "b_reason": reason}
        for work_id, reason in reasons.items()
        if work_id not in skip
    ]
    if not params:
        return
    await connection.execute(
        update(work)
        .where(
            work.c.id == bindparam("b_id"),
            work.c.state == "pending",
            # A pass planned before a hold does not overwrite its reason ("held by ...").
            work.c.hold.is_(None),
            work.c.state_reason.is_distinct_from(bindparam("b_reason")),
        )
        .values(state_reason=bindparam("b_reason")),
        params,
    )


async def _store_explanations(
    connection: AsyncConnection, explanations: Mapping[str, bytes], now: float
) -> None:
    """Replace each work's explanation; work that no longer exists is skipped silently
    (an explanation is advice, never a reason to fail a plan)."""
    params = []
    for work_id, document in explanations.items():
        check_json_object(document, f"explanation of {work_id}")
        params.append({"b_id": work_id, "b_explanation": document, "b_at": now})
    if not params:
        return
    await connection.execute(
        update(work)
        .where(work.c.id == bindparam("b_id"))
        .values(explanation=bindparam("b_explanation"), explained_at=bindparam("b_at")),
        params,
    )
