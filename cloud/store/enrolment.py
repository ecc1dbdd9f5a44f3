"""Node enrolment: join tokens and the node identities enrolled with them.

A join token is `gfj_<43 random characters>`, shown once; the store keeps its SHA-256
only (256 random bits need no slow hash) and finds it by that hash. Redeeming counts a
use under the write lock (SQLite's `BEGIN IMMEDIATE`, PostgreSQL's `SELECT ... FOR
UPDATE` on the token's row), so N concurrent redemptions of a one-use token give
exactly one enrolment. A revoked node keeps its row with `revoked_at` set: it is
refused until it enrols again with a new token.

What a node is approved as (cloud/store/node_admin.py) belongs to the device that
earned it: revoking an id, or enrolling a device under an id that is revoked or was
never enrolled, clears it in the same transaction (`without_approval`), so a new device
is held to its own join token and its own first birth.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import msgspec
from sqlalchemy import Row, delete, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from cloud.fleet.envelope import ENVELOPE_DECODER, NodeEnvelope
from cloud.store.engine import Backend
from cloud.store.errors import (
    JoinTokenExpiredError,
    JoinTokenRevokedError,
    JoinTokenUnknownError,
    JoinTokenUsedUpError,
    NodeAlreadyEnrolledError,
)
from cloud.store.node_admin import ApprovalReset, reset_approval, restore_approval
from cloud.store.schema import enrolled_nodes, join_tokens
from cloud.store.sql import insert_ignoring

JOIN_TOKEN_PREFIX: Final = "gfj_"
_LABELS: Final = msgspec.json.Decoder(dict[str, str])

JoinTokenState = Literal["active", "expired", "used-up", "revoked"]


@dataclass(frozen=True, slots=True)
class NodeDefaults:
    """Where a node enrolled with a token sits, unless the node says otherwise."""

    site: str | None = None
    zone: str | None = None
    region: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class NewJoinToken:
    ttl_s: float
    max_uses: int = 1
    defaults: NodeDefaults = NodeDefaults()
    created_by: str | None = None  # the admin tenant's id
    # What nodes enrolled with it may be beyond site, zone and region (work kinds, an
    # inventory ceiling; cloud/fleet/envelope.py); None: nothing more.
    limits: NodeEnvelope | None = None


@dataclass(frozen=True, slots=True)
class JoinTokenRecord:
    token_id: str
    created_at: float
    expires_at: float
    max_uses: int
    uses: int
    revoked_at: float | None
    defaults: NodeDefaults
    created_by: str | None
    limits: NodeEnvelope | None = None

    def state(self, now: float) -> JoinTokenState:
        if self.revoked_at is not None:
            return "revoked"
        if self.uses >= self.max_uses:
            return "used-up"
        if now >= self.expires_at:
            return "expired"
        return "active"


@dataclass(frozen=True, slots=True)
class CreatedJoinToken:
    record: JoinTokenRecord
    token: str  # shown to the admin once, never stored


@dataclass(frozen=True, slots=True)
class EnrolledNodeRecord:
    node_id: str
    enrolled_at: float
    join_token_id: str | None
    revoked_at: float | None
    username: str | None  # the broker account the node was given, once provisioned
    # Base64 of the X25519 key the node enrolled with (secrets are sealed to it); None:
    # none pinned, the key its birth announces is trusted.
    sealing_public_key: str | None = None
    # What it may be (cloud/fleet/envelope.py); None: not held (enrolled before v0013).
    envelope: NodeEnvelope | None = None

    @property
    def active(self) -> bool:
        return self.revoked_at is None


@dataclass(frozen=True, slots=True)
class Redemption:
    """A token redeemed for a node: the token as it is now (its use counted) and the
    node's enrolment, together with what the node replaced (to undo it, `release`)."""

    token: JoinTokenRecord
    node: EnrolledNodeRecord
    previous: EnrolledNodeRecord | None  # the node's revoked row it replaced, if any
    # What the node is approved as, before and after the enrolment cleared it.
    approval: ApprovalReset


def token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _token_from_row(row: Row[Any]) -> JoinTokenRecord:
    return JoinTokenRecord(
        token_id=row.id,
        created_at=float(row.created_at),
        expires_at=float(row.expires_at),
        max_uses=int(row.max_uses),
        uses=int(row.uses),
        revoked_at=None if row.revoked_at is None else float(row.revoked_at),
        defaults=NodeDefaults(
            site=row.site, zone=row.zone, region=row.region, labels=_LABELS.decode(row.labels)
        ),
        created_by=row.created_by,
        limits=None if row.envelope is None else ENVELOPE_DECODER.decode(row.envelope),
    )


def _node_from_row(row: Row[Any]) -> EnrolledNodeRecord:
    return EnrolledNodeRecord(
        node_id=row.node_id,
        enrolled_at=float(row.enrolled_at),
        join_token_id=row.join_token_id,
        revoked_at=None if row.revoked_at is None else float(row.revoked_at),
        username=row.username,
        sealing_public_key=row.sealing_public_key,
        envelope=None if row.envelope is None else ENVELOPE_DECODER.decode(row.envelope),
    )


async def insert_join_token(
    connection: AsyncConnection, token_id: str, new: NewJoinToken, now: float
) -> CreatedJoinToken:
    if new.max_uses < 1:
        raise ValueError("uses must be at least 1")
    if new.ttl_s <= 0:
        raise ValueError("ttl_s must be positive")
    token = JOIN_TOKEN_PREFIX + secrets.token_urlsafe(32)
    record = JoinTokenRecord(
        token_id=token_id,
        created_at=now,
        expires_at=now + new.ttl_s,
        max_uses=new.max_uses,
        uses=0,
        revoked_at=None,
        defaults=new.defaults,
        created_by=new.created_by,
        limits=new.limits,
    )
    await connection.execute(
        insert(join_tokens).values(
            id=token_id,
            token_sha256=token_sha256(token),
            created_at=record.created_at,
            expires_at=record.expires_at,
            max_uses=record.max_uses,
            uses=0,
            revoked_at=None,
            site=new.defaults.site,
            zone=new.defaults.zone,
            region=new.defaults.region,
            labels=msgspec.json.encode(dict(new.defaults.labels)),
            created_by=new.created_by,
            envelope=None if new.limits is None else msgspec.json.encode(new.limits),
        )
    )
    return CreatedJoinToken(record, token)


async def select_redeemable(connection: AsyncConnection, token: str, now: float) -> bool:
    """Whether `token` is one that `redeem` would accept now (read only: no lock)."""
    query = select(join_tokens).where(join_tokens.c.token_sha256 == token_sha256(token))
    row = (await connection.execute(query)).first()
    return row is not None and _token_from_row(row).state(now) == "active"


async def select_join_tokens(connection: AsyncConnection) -> tuple[JoinTokenRecord, ...]:
    rows = await connection.execute(select(join_tokens).order_by(join_tokens.c.id))
    return tuple(_token_from_row(row) for row in rows)


async def mark_join_token_revoked(
    connection: AsyncConnection, token_id: str, now: float
) -> JoinTokenRecord:
    """Revoke (idempotently: a second revocation keeps the first time)."""
    await connection.execute(
        update(join_tokens)
        .where(join_tokens.c.id == token_id, join_tokens.c.revoked_at.is_(None))
        .values(revoked_at=now)
    )
    row = (
        await connection.execute(select(join_tokens).where(join_tokens.c.id == token_id))
    ).first()
    if row is None:
        raise JoinTokenUnknownError(token_id)
    return _token_from_row(row)


def node_envelope(token: JoinTokenRecord, requested: NodeDefaults) -> NodeEnvelope:
    """What a node enrolled with `token` may be: the token's site, zone and region, else
    what the node asked for (neither: not fixed here; its first birth's count then,
    cloud/fleet/envelope.py); the token's labels (the node's own are its births' to
    declare) and limits."""
    defaults = token.defaults
    return msgspec.structs.replace(
        token.limits or NodeEnvelope(),
        site=defaults.site or requested.site,
        zone=defaults.zone or requested.zone,
        region=defaults.region or requested.region,
        labels=dict(defaults.labels),
    )


def _same_key(node: EnrolledNodeRecord, sealing_public_key: str | None) -> bool:
    return sealing_public_key is not None and node.sealing_public_key == sealing_public_key


async def redeem(
    connection: AsyncConnection,
    token: str,
    node_id: str,
    now: float,
    sealing_public_key: str | None = None,
    requested: NodeDefaults = NodeDefaults(),
    *,
    key_proven: bool = False,
) -> Redemption:
    """Count one use of `token` and enrol `node_id` with it (pinning its sealing key, if
    given, and fixing what it may be: `node_envelope`), or raise (nothing changed):
    `JoinTokenUnknownError`, `...ExpiredError`, `...UsedUpError`, `...RevokedError`,
    `NodeAlreadyEnrolledError` (the node id is enrolled, and this is not that node
    enrolling again with the sealing key it enrolled with, proven: `key_proven`). What
    the node is approved as is cleared with it (cloud/store/node_admin.py
    `without_approval`). Call inside a write transaction."""
    query = (
        select(join_tokens)
        .where(join_tokens.c.token_sha256 == token_sha256(token))
        .with_for_update()
    )
    row = (await connection.execute(query)).first()
    if row is None:
        raise JoinTokenUnknownError(None)
    record = _token_from_row(row)
    state = record.state(now)
    if state == "revoked":
        raise JoinTokenRevokedError(record.token_id)
    if state == "used-up":
        raise JoinTokenUsedUpError(record.token_id)
    if state == "expired":
        raise JoinTokenExpiredError(record.token_id)
    node_query = select(enrolled_nodes).where(enrolled_nodes.c.node_id == node_id).with_for_update()
    node_row = (await connection.execute(node_query)).first()
    previous = None if node_row is None else _node_from_row(node_row)
    if (
        previous is not None
        and previous.active
        and not (key_proven and _same_key(previous, sealing_public_key))
    ):
        # Enrolling again is for the node itself: it proves it holds the sealing key it
        # enrolled with (its credentials are rotated, its work goes on). The key alone is
        # public: every birth announces it.
        raise NodeAlreadyEnrolledError(node_id)
    envelope = node_envelope(record, requested)
    node = EnrolledNodeRecord(
        node_id, now, record.token_id, None, None, sealing_public_key, envelope
    )
    values = {
        "enrolled_at": now,
        "join_token_id": record.token_id,
        "revoked_at": None,
        "username": None,
        "sealing_public_key": sealing_public_key,
        "envelope": msgspec.json.encode(envelope),
    }
    if previous is None:
        try:
            await connection.execute(insert(enrolled_nodes).values(node_id=node_id, **values))
        except IntegrityError:  # a concurrent enrolment of the same id won
            raise NodeAlreadyEnrolledError(node_id) from None
    else:
        await connection.execute(
            update(enrolled_nodes).where(enrolled_nodes.c.node_id == node_id).values(**values)
        )
    # Enrolled and unrevoked, past the check above: the same device, its key proven.
    same_device = previous is not None and previous.active
    approval = await reset_approval(connection, node_id, now, same_device=same_device)
    # The guard repeats the check in SQL: a use is never counted past max_uses.
    await connection.execute(
        update(join_tokens)
        .where(join_tokens.c.id == record.token_id, join_tokens.c.uses < join_tokens.c.max_uses)
        .values(uses=join_tokens.c.uses + 1)
    )
    used = JoinTokenRecord(
        token_id=record.token_id,
        created_at=record.created_at,
        expires_at=record.expires_at,
        max_uses=record.max_uses,
        uses=record.uses + 1,
        revoked_at=record.revoked_at,
        defaults=record.defaults,
        created_by=record.created_by,
        limits=record.limits,
    )
    return Redemption(used, node, previous, approval)


async def release(connection: AsyncConnection, redemption: Redemption) -> None:
    """Undo a redemption whose credentials could not be provisioned: the use is given
    back and the node is as it was before, its approval included."""
    await restore_approval(connection, redemption.approval)
    await connection.execute(
        update(join_tokens)
        .where(join_tokens.c.id == redemption.token.token_id, join_tokens.c.uses > 0)
        .values(uses=join_tokens.c.uses - 1)
    )
    node_id = redemption.node.node_id
    previous = redemption.previous
    if previous is None:
        await connection.execute(delete(enrolled_nodes).where(enrolled_nodes.c.node_id == node_id))
        return
    await connection.execute(
        update(enrolled_nodes)
        .where(enrolled_nodes.c.node_id == node_id)
        .values(
            enrolled_at=previous.enrolled_at,
            join_token_id=previous.join_token_id,
            revoked_at=previous.revoked_at,
            username=previous.username,
            sealing_public_key=previous.sealing_public_key,
            envelope=None if previous.envelope is None else msgspec.json.encode(previous.envelope),
        )
    )


async def set_username(connection: AsyncConnection, node_id: str, username: str) -> None:
    await connection.execute(
        update(enrolled_nodes).where(enrolled_nodes.c.node_id == node_id).values(username=username)
    )


async def pin_sealing_key(
    connection: AsyncConnection, node_id: str, sealing_public_key: str | None
) -> bool:
    """Pin another sealing key on an enrolled, unrevoked node; False when there is none."""
    result = await connection.execute(
        update(enrolled_nodes)
        .where(enrolled_nodes.c.node_id == node_id, enrolled_nodes.c.revoked_at.is_(None))
        .values(sealing_public_key=sealing_public_key)
    )
    return bool(result.rowcount)


async def select_enrolled_nodes(connection: AsyncConnection) -> tuple[EnrolledNodeRecord, ...]:
    rows = await connection.execute(select(enrolled_nodes).order_by(enrolled_nodes.c.node_id))
    return tuple(_node_from_row(row) for row in rows)


async def select_enrolled_node(
    connection: AsyncConnection, node_id: str
) -> EnrolledNodeRecord | None:
    query = select(enrolled_nodes).where(enrolled_nodes.c.node_id == node_id)
    row = (await connection.execute(query)).first()
    return None if row is None else _node_from_row(row)


async def mark_node_revoked(
    connection: AsyncConnection, backend: Backend, node_id: str, now: float
) -> EnrolledNodeRecord:
    """Revoke the node's identity (idempotently: a second revocation keeps the first
    time), and what it is approved as with it. A node that never enrolled (enrolment
    off, or knocking after a store loss) gets a revoked row, so that it is refused too."""
    await connection.execute(
        insert_ignoring(backend, enrolled_nodes, ["node_id"]).values(
            node_id=node_id, enrolled_at=now, join_token_id=None, revoked_at=now, username=None
        )
    )
    await connection.execute(
        update(enrolled_nodes)
        .where(enrolled_nodes.c.node_id == node_id, enrolled_nodes.c.revoked_at.is_(None))
        .values(revoked_at=now)
    )
    await reset_approval(connection, node_id, now, same_device=False)
    revoked = await select_enrolled_node(connection, node_id)
    assert revoked is not None
    return revoked


# Rows per INSERT: well under SQLite's 32,766 bound parameters at 7 columns a row.
_READMIT_BATCH: Final = 1000


async def readmit(
    connection: AsyncConnection, backend: Backend, nodes: Sequence[EnrolledNodeRecord]
) -> list[EnrolledNodeRecord]:
    """Enrol `nodes` again as their certificates say they enrolled (cloud/fleet/
    certificates.py), except those whose id the store knows (enrolled, or revoked: a
    revocation outlives any certificate); the nodes enrolled."""
    inserted: set[str] = set()
    for start in range(0, len(nodes), _READMIT_BATCH):
        rows = [
            {
                "node_id": node.node_id,
                "enrolled_at": node.enrolled_at,
                "join_token_id": node.join_token_id,
                "revoked_at": None,
                "username": node.username,
                "sealing_public_key": node.sealing_public_key,
                "envelope": None if node.envelope is None else msgspec.json.encode(node.envelope),
            }
            for node in nodes[start : start + _READMIT_BATCH]
        ]
        statement = (
            insert_ignoring(backend, enrolled_nodes, ["node_id"])
            .values(rows)
            .returning(enrolled_nodes.c.node_id)
        )
        inserted.update((await connection.execute(statement)).scalars())
    return [node for node in nodes if node.node_id in inserted]
