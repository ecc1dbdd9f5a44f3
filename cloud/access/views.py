"""REST representations of bearer tokens and of the audit log (`/v1/tokens`,
`/v1/audit`). The CLI decodes them too, so this module imports nothing of the
database stack."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Final, Literal

import msgspec

from shared.clock import utc_from_epoch
from shared.errors import worded_pattern

if TYPE_CHECKING:  # the CLI decodes these types without the database stack
    from cloud.store import AuditRecord, TokenRecord

TokenState = Literal["active", "rotated", "expired", "revoked"]
TokenName = Annotated[
    str,
    msgspec.Meta(
        pattern=worded_pattern(
            r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$(?!\n)",
            "must be letters, digits, '.', '_' and '-', starting with a letter or digit; at "
            "most 64 characters",
        ),
        description="A label: letters, digits, '.', '_' and '-' (e.g. ci, laptop).",
    ),
]
DAY_S: Final = 86_400.0


class TokenCreate(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: TokenName


class TokenRotate(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    overlap_s: Annotated[
        float,
        msgspec.Meta(
            ge=0,
            le=30 * DAY_S,
            description="How long the old token keeps working (0: refused at once).",
        ),
    ] = 3600.0


class TokenView(msgspec.Struct, frozen=True, kw_only=True):
    """A bearer token without its secret."""

    id: str  # the `<token id>` of `gf_<token id>_<secret>`: not secret
    tenant: str
    name: str
    # active; rotated (replaced, works until expires_at); expired; revoked
    state: TokenState
    created_at: datetime
    created_by: str | None  # the tenant who made it; null: made with its tenant
    last_used_at: datetime | None  # to within the store's token cache time
    rotated_at: datetime | None
    replaced_by: str | None  # the id of the token that replaced it
    expires_at: datetime | None  # a rotated token: the end of its overlap
    revoked_at: datetime | None


class TokenCreated(TokenView, frozen=True, kw_only=True):
    token: str  # shown once: greenfed keeps only its hash


class TokenRotated(msgspec.Struct, frozen=True, kw_only=True):
    token: TokenCreated  # the new one
    replaced: TokenView  # the old one, working until its expires_at


class TokenList(msgspec.Struct, frozen=True, kw_only=True):
    items: tuple[TokenView, ...]
    count: int


def _at(value: float | None) -> datetime | None:
    return None if value is None else utc_from_epoch(value)


def token_view(record: TokenRecord, tenant: str, now: float) -> TokenView:
    return TokenView(
        id=record.token_id,
        tenant=tenant,
        name=record.name,
        state=record.state(now),
        created_at=utc_from_epoch(record.created_at),
        created_by=record.created_by,
        last_used_at=_at(record.last_used_at),
        rotated_at=_at(record.rotated_at),
        replaced_by=record.replaced_by,
        expires_at=_at(record.expires_at),
        revoked_at=_at(record.revoked_at),
    )


# ---- the audit log ---------------------------------------------------------------------

AuditAction = Literal[
    "tenant.create",
    "tenant.update",
    "token.create",
    "token.rotate",
    "token.revoke",
    "work.cancel",
    "work.update",
    # Job control by a person (cloud/api/job_control.py).
    "work.hold",
    "work.release",
    "work.suspend",
    "work.resume",
    "work.requeue",
    "node.cordon",
    "node.uncordon",
    "node.drain",
    "node.update",
    "node.revoke",
    "node.approve",
    "node.readmit",
    "join-token.create",
    "join-token.revoke",
    "cluster.add",
    "cluster.remove",
    "mqtt_account.create",
    "mqtt_account.revoke",
    "agent_package.publish",
    "agent_rollout.create",
    "agent_rollout.cancel",
    # An admin's revocation, drain or cancellation refused for want of a confirmation
    # (cloud/api/bulk_actions.py).
    "bulk.refused",
]
AUDIT_ACTIONS: Final[tuple[AuditAction, ...]] = AuditAction.__args__  # type: ignore[attr-defined]


class AuditEntryView(msgspec.Struct, frozen=True, kw_only=True):
    seq: int  # grows with every entry
    at: datetime
    actor: str  # the tenant who acted, by name
    action: str  # one of the documented actions, e.g. tenant.update
    target: str  # a tenant's name, a token, job, deployment, node or join token id
    detail: msgspec.Raw  # a JSON object: what changed


class AuditList(msgspec.Struct, frozen=True, kw_only=True):
    items: tuple[AuditEntryView, ...]
    count: int
    next_cursor: str | None  # pass as ?cursor= for the next (older) page


def audit_entry_view(record: AuditRecord) -> AuditEntryView:
    return AuditEntryView(
        seq=record.seq,
        at=utc_from_epoch(record.at),
        actor=record.actor,
        action=record.action,
        target=record.target,
        detail=msgspec.Raw(record.detail),
    )
