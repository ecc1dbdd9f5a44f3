"""`GET /v1/audit` (admin): the audit log, newest first; and `audit_entry`, with which
handlers describe what they do so that the store records it with the action itself.

Recorded: tenants created and changed, bearer tokens created, rotated and revoked
(by their owner or the admin), work cancelled and deployments changed by the admin,
and node operations (cordon, uncordon, drain, taints and labels, revocation, join
tokens); and bulk destructive actions refused for want of a confirmation
(cloud/api/bulk_actions.py).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Final

import msgspec
from aiohttp import web

from cloud.access.views import AUDIT_ACTIONS, AuditAction, AuditList, audit_entry_view
from cloud.api.auth import tenant_of
from cloud.api.bodies import json_response
from cloud.api.query import comma_list, comma_list_pattern, parse_query
from cloud.api.routes import Reply, Route
from cloud.app_keys import BULK_CONFIRMED, BULK_UNCONFIRMED, STORE
from cloud.store import Actor, AuditQuery, NewAudit
from cloud.store.audit import MAX_PAGE
from shared.errors import worded_pattern

_DETAIL: Final = msgspec.json.Encoder()


class UnconfirmedAction(Exception):
    """A destructive action an admin past the limit did not confirm, stopped where it
    would be recorded, done (cloud/api/bulk_actions.py answers the 428)."""

    def __init__(self, target: str) -> None:
        super().__init__(target)
        self.target = target


def audit_entry(
    request: web.Request, action: AuditAction, target: str, **detail: object
) -> NewAudit:
    """What the caller is about to do, for the store to record with it. An empty
    `target`: the id of what the action creates (the store fills it in)."""
    if request.get(BULK_UNCONFIRMED) == action:  # past the limit unconfirmed: not done
        raise UnconfirmedAction(target)
    caller = tenant_of(request)
    if request.get(BULK_CONFIRMED):  # past the limit on purpose (cloud/api/bulk_actions.py)
        detail = {**detail, "confirmed": "bulk"}
    return NewAudit(
        actor=Actor(caller.tenant_id, caller.name),
        action=action,
        target=target,
        detail=_DETAIL.encode(detail),
    )


class AuditListQuery(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    since: (
        Annotated[
            datetime,
            msgspec.Meta(tz=True, description="Entries at or after this time (with an offset)."),
        ]
        | None
    ) = None
    actor: (
        Annotated[str, msgspec.Meta(max_length=64, description="The acting tenant's name.")] | None
    ) = None
    action: (
        Annotated[
            str,
            msgspec.Meta(
                description="Comma-separated actions, e.g. token.revoke,work.cancel.",
                extra_json_schema={"pattern": comma_list_pattern(AUDIT_ACTIONS)},
            ),
        ]
        | None
    ) = None
    limit: Annotated[int, msgspec.Meta(ge=1, le=MAX_PAGE)] = 50
    cursor: (
        Annotated[
            str,
            msgspec.Meta(
                pattern=worded_pattern(
                    r"^[0-9]{1,18}$", "must be a page's next_cursor: 1 to 18 digits"
                ),
                description="The previous page's next_cursor.",
            ),
        ]
        | None
    ) = None


async def list_audit(request: web.Request) -> web.Response:
    query = parse_query(request, AuditListQuery)
    page = await request.app[STORE].list_audit(
        AuditQuery(
            since=None if query.since is None else query.since.timestamp(),
            actor=query.actor,
            actions=comma_list("action", query.action, AUDIT_ACTIONS),
            limit=query.limit,
            cursor=None if query.cursor is None else int(query.cursor),
        )
    )
    items = tuple(audit_entry_view(record) for record in page.items)
    cursor = None if page.next_cursor is None else str(page.next_cursor)
    return json_response(AuditList(items=items, count=len(items), next_cursor=cursor))


ROUTES: Final = (
    Route(
        "GET",
        "/v1/audit",
        list_audit,
        "The audit log of admin actions, newest first (admin)",
        "admin",
        "audit",
        query=AuditListQuery,
        replies=(Reply(200, "A page of audit entries", AuditList),),
    ),
)
