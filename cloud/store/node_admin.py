"""What an admin set on nodes: cordoned, extra taints and labels, and what a node is
approved as (table `node_admin`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec
from sqlalchemy import Row, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from cloud.fleet.envelope import CLAIM_DECODER, NodeClaim
from cloud.store.engine import Backend
from cloud.store.records import KEEP, Keep
from cloud.store.schema import node_admin
from cloud.store.sql import dialect_insert, insert_ignoring, upsert

_TAINTS = msgspec.json.Decoder(tuple[str, ...])
_LABELS = msgspec.json.Decoder(dict[str, str])
_TIME_STEP_S = 1e-6  # a change's time is at least this after the one it follows


@dataclass(frozen=True, slots=True)
class NodeAdminRecord:
    node_id: str
    cordoned: bool = False
    draining: bool = False  # cordoned, and its work moved elsewhere (cloud/loop/drain.py)
    taints: tuple[str, ...] = ()  # `key=value:Effect` (shared/taints.py)
    labels: Mapping[str, str] = field(default_factory=dict)
    updated_at: float = 0.0
    # What the node is approved as (an admin's approval, or its first birth where its
    # envelope sets no ceiling; cloud/fleet/envelope.py), and whether its own speed and
    # power figures count instead of the model table's.
    approved: NodeClaim | None = None
    trust_figures: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeAdminChanges:
    """What one admin action changes on a node (`Store.change_node_admin`); `KEEP` leaves
    a field as it is stored, whatever another action changed since the caller looked."""

    cordoned: bool | Keep = KEEP
    draining: bool | Keep = KEEP
    taints: tuple[str, ...] | Keep = KEEP
    labels: Mapping[str, str] | Keep = KEEP
    approved: NodeClaim | Keep | None = KEEP
    trust_figures: bool | Keep = KEEP

    def applied_to(self, record: NodeAdminRecord) -> NodeAdminRecord:
        changed = {
            name: value
            for name in ("cordoned", "draining", "taints", "labels", "approved", "trust_figures")
            if (value := getattr(self, name)) is not KEEP
        }
        return replace(record, **changed)


def _row_values(record: NodeAdminRecord) -> dict[str, Any]:
    return {
        "node_id": record.node_id,
        "cordoned": record.cordoned,
        "draining": record.draining,
        "taints": msgspec.json.encode(record.taints),
        "labels": msgspec.json.encode(dict(record.labels)),
        "updated_at": record.updated_at,
        "approved": None if record.approved is None else msgspec.json.encode(record.approved),
        "trust_figures": record.trust_figures,
    }


async def put_node_admin(
    connection: AsyncConnection, backend: Backend, record: NodeAdminRecord
) -> None:
    await connection.execute(upsert(backend, node_admin, _row_values(record), ["node_id"]))


async def change_node_admin(
    connection: AsyncConnection,
    backend: Backend,
    node_id: str,
    changes: NodeAdminChanges,
    now: float,
) -> NodeAdminRecord:
    """Apply `changes` to the node's stored settings under its row lock (call inside a
    write transaction); the record as stored.

    The row is read here, locked, rather than taken from what the caller saw: two admin
    actions at once (a cordon and a PATCH of labels) each keep the other's change. A
    node with no row yet gets one with nothing set first, so that there is a row to
    lock (PostgreSQL; SQLite's writers are one at a time anyway)."""
    default = _row_values(NodeAdminRecord(node_id=node_id, updated_at=now))
    await connection.execute(insert_ignoring(backend, node_admin, ["node_id"]).values(default))
    query = select(node_admin).where(node_admin.c.node_id == node_id).with_for_update()
    row = (await connection.execute(query)).one()
    before = _record_from_row(row)
    # Never before the stored time (a clock stepped back): the newest write is the
    # newest record wherever records are compared by time (cloud/api/nodes.py).
    # Strictly after the change it follows (the clock was read before the row's lock): the
    # registry keeps the newest of concurrent answers by this time, and a tie let the
    # older one win.
    after = replace(
        changes.applied_to(before), updated_at=max(now, before.updated_at + _TIME_STEP_S)
    )
    values = _row_values(after)
    del values["node_id"]
    await connection.execute(
        update(node_admin).where(node_admin.c.node_id == node_id).values(values)
    )
    return after


def _record_from_row(row: Row[Any]) -> NodeAdminRecord:
    return NodeAdminRecord(
        node_id=row.node_id,
        cordoned=bool(row.cordoned),
        draining=bool(row.draining),
        taints=_TAINTS.decode(row.taints),
        labels=_LABELS.decode(row.labels),
        updated_at=float(row.updated_at),
        approved=None if row.approved is None else CLAIM_DECODER.decode(row.approved),
        trust_figures=bool(row.trust_figures),
    )


async def select_node_admin(connection: AsyncConnection) -> dict[str, NodeAdminRecord]:
    rows = await connection.execute(select(node_admin))
    return {row.node_id: _record_from_row(row) for row in rows}


async def set_first_claims(
    connection: AsyncConnection, backend: Backend, claims: Mapping[str, NodeClaim], now: float
) -> None:
    """Make each claim its node's approved claim where none is approved yet (its first
    birth, cloud/fleet/envelope.py); an approval already there stays."""
    for node_id, claim in sorted(claims.items()):  # one lock order: no deadlocks
        encoded = msgspec.json.encode(claim)
        insert = dialect_insert(backend, node_admin)
        statement = insert.values(
            node_id=node_id,
            cordoned=False,
            draining=False,
            taints=msgspec.json.encode(()),
            labels=msgspec.json.encode({}),
            updated_at=now,
            approved=encoded,
            trust_figures=False,
        ).on_conflict_do_update(
            index_elements=["node_id"],
            set_={"approved": encoded, "updated_at": now},
            where=node_admin.c.approved.is_(None),
        )
        await connection.execute(statement)


def without_approval(record: NodeAdminRecord, *, same_device: bool) -> NodeAdminRecord:
    """What is left of a node's approval once its id is revoked or enrolled again.

    An approval was earned by a device: another device under the id (a revoked id or one
    never enrolled, enrolled now) keeps neither the approved claim nor trusted figures,
    else it would inherit what an admin approved of the old one, past its own join
    token. The same device enrolling again (its sealing key proven) keeps an admin's
    approval and trusted figures; a claim its first birth set is recorded anew from its
    next birth, against the new token's envelope (which may move it)."""
    if not same_device:
        return replace(record, approved=None, trust_figures=False)
    if record.approved is None or record.approved.by_admin:
        return record
    return replace(record, approved=None)


@dataclass(frozen=True, slots=True)
class ApprovalReset:
    """A node's settings before and after `reset_approval` (None: it had none)."""

    before: NodeAdminRecord | None
    after: NodeAdminRecord | None

    @property
    def changed(self) -> bool:
        return self.before != self.after


async def reset_approval(
    connection: AsyncConnection, node_id: str, now: float, *, same_device: bool
) -> ApprovalReset:
    """Apply `without_approval` to the node's stored settings (call inside the write
    transaction that revokes or enrols the id); the rest of them stay."""
    query = select(node_admin).where(node_admin.c.node_id == node_id)
    row = (await connection.execute(query)).first()
    if row is None:
        return ApprovalReset(None, None)
    before = _record_from_row(row)
    after = without_approval(before, same_device=same_device)
    if after == before:
        return ApprovalReset(before, before)
    after = replace(after, updated_at=now)
    await _write_approval(connection, after)
    return ApprovalReset(before, after)


async def restore_approval(connection: AsyncConnection, reset: ApprovalReset) -> None:
    """Undo `reset_approval` (an enrolment undone): the approval as it was before."""
    if reset.changed and reset.before is not None:
        await _write_approval(connection, reset.before)


async def _write_approval(connection: AsyncConnection, record: NodeAdminRecord) -> None:
    await connection.execute(
        update(node_admin)
        .where(node_admin.c.node_id == record.node_id)
        .values(
            approved=None if record.approved is None else msgspec.json.encode(record.approved),
            trust_figures=record.trust_figures,
            updated_at=record.updated_at,
        )
    )
