"""The audit log (table `audit_log`): who did what to which tenant, token, work or node.

Entries are written in the same transaction as the action they record, so an action
that committed is always in the log and one that failed never is. The log is
append-only; it is read newest first, a page at a time, keyed by sequence number.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from sqlalchemy import Row, and_, insert, select
from sqlalchemy.ext.asyncio import AsyncConnection

from cloud.store.rows import check_json_object
from cloud.store.schema import audit_log

MAX_PAGE: Final = 1000


@dataclass(frozen=True, slots=True)
class Actor:
    """Who acts: a tenant (an admin, or a tenant managing its own tokens)."""

    tenant_id: str
    name: str


@dataclass(frozen=True, slots=True, kw_only=True)
class NewAudit:
    actor: Actor
    action: str  # e.g. "tenant.update", "token.revoke", "work.cancel", "node.drain"
    target: str  # what it was done to: a tenant's name, a token, work or node id
    detail: bytes = b"{}"  # a JSON object: what changed, and how

    def created(self, created_id: str) -> NewAudit:
        """This entry about what the action created: an empty target becomes its id,
        known only once the store made it (a token's, a join token's)."""
        return self if self.target else replace(self, target=created_id)


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditRecord:
    seq: int  # grows with every entry: the page cursor
    at: float  # UTC epoch seconds
    actor_id: str
    actor: str
    action: str
    target: str
    detail: bytes


@dataclass(frozen=True, slots=True)
class AuditPage:
    items: tuple[AuditRecord, ...]
    next_cursor: int | None  # pass as `cursor` for the next (older) page; None: the last


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditQuery:
    since: float | None = None  # entries at or after this time
    actor: str | None = None  # by the actor's name
    actions: Sequence[str] = ()  # any of these; empty: every action
    limit: int = 50
    cursor: int | None = None  # entries before this sequence number


async def insert_audit(connection: AsyncConnection, entry: NewAudit, now: float) -> None:
    await insert_audits(connection, [entry], now)


async def insert_audits(
    connection: AsyncConnection, entries: Sequence[NewAudit], now: float
) -> None:
    """Several entries in one statement (a bulk action audits each thing it did)."""
    for entry in entries:
        check_json_object(entry.detail, f"detail of audit entry {entry.action!r}")
    if not entries:
        return
    await connection.execute(
        insert(audit_log),
        [
            {
                "at": now,
                "actor_id": entry.actor.tenant_id,
                "actor": entry.actor.name,
                "action": entry.action,
                "target": entry.target,
                "detail": entry.detail,
            }
            for entry in entries
        ],
    )


def _record(row: Row[Any]) -> AuditRecord:
    return AuditRecord(
        seq=int(row.seq),
        at=float(row.at),
        actor_id=row.actor_id,
        actor=row.actor,
        action=row.action,
        target=row.target,
        detail=row.detail,
    )


async def select_audit_page(connection: AsyncConnection, query: AuditQuery) -> AuditPage:
    """Newest first. Sequence numbers only grow, so entries written meanwhile land
    before the first page and never shift later ones."""
    if not 1 <= query.limit <= MAX_PAGE:
        raise ValueError(f"limit must be within 1..{MAX_PAGE}")
    conditions = []
    if query.since is not None:
        conditions.append(audit_log.c.at >= query.since)
    if query.actor is not None:
        conditions.append(audit_log.c.actor == query.actor)
    if query.actions:
        conditions.append(audit_log.c.action.in_(list(query.actions)))
    if query.cursor is not None:
        conditions.append(audit_log.c.seq < query.cursor)
    statement = (
        select(audit_log)
        .where(and_(True, *conditions))
        .order_by(audit_log.c.seq.desc())
        .limit(query.limit + 1)
    )
    rows = (await connection.execute(statement)).all()
    items = tuple(_record(row) for row in rows[: query.limit])
    return AuditPage(items, items[-1].seq if len(rows) > query.limit else None)
