"""`/v1/tokens`: a tenant's bearer tokens. A tenant creates, lists, rotates and revokes
its own; the admin anyone's (`?tenant=NAME`, or `*` to list every tenant's).

A token's secret is shown once, when it is made (created, or made by a rotation);
lists never show it. Rotating makes a new token under the same name while the old
one keeps working for an overlap (default an hour), after which it is refused as
revoked; revoking refuses it at once. Every change is in the audit log. Another
tenant's token is not found (404), like one that does not exist.

Only an `active` token manages tokens: one rotated out still works for everything else
during its overlap, but may only revoke itself (a 403 otherwise). Rotating a leaked token
is meant to shut its holder out; were it allowed to make a token with no end, or to
revoke its replacement, the rotation would protect nothing. The same rule keeps it from
minting any other credential (cloud/api/credential_minting.py).
"""

from __future__ import annotations

import time
from typing import Final

import msgspec
from aiohttp import web

from cloud.access.views import (
    TokenCreate,
    TokenCreated,
    TokenList,
    TokenRotate,
    TokenRotated,
    TokenView,
    token_view,
)
from cloud.api.audit import audit_entry
from cloud.api.auth import caller_token_of, tenant_of
from cloud.api.bodies import decode_body, json_response, read_body
from cloud.api.credential_minting import CALLER_NOT_ACTIVE_DOC, refuse_unless_caller_active
from cloud.api.problems import Problem, problem_reply
from cloud.api.query import parse_query
from cloud.api.routes import Reply, Route
from cloud.api.scope import TenantParameter, scoped_tenant, tenant_names
from cloud.app_keys import STORE
from cloud.store import (
    LastAdminTokenError,
    TenantRecord,
    TokenNotActiveError,
    TokenNotFoundError,
    TokenRecord,
)

_CREATE: Final = msgspec.json.Decoder(TokenCreate)
_ROTATE: Final = msgspec.json.Decoder(TokenRotate)


class TokenQuery(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    tenant: TenantParameter = None


# What only an active token may do here (cloud/api/credential_minting.py), as refused.
_MANAGING_TOKENS: Final = "create, rotate or revoke tokens (a rotated one may revoke only itself)"


def _not_found(token_id: str) -> Problem:
    return Problem(404, "token-not-found", "Token not found", f"no token {token_id[:32]!r}")


async def _refuse_unless_caller_active(request: web.Request, *, revoking: str = "") -> None:
    """A 403 unless the caller's own token is `active` now; a token revoking itself
    (`revoking` its id) may whatever its state."""
    if revoking == caller_token_of(request).token_id:
        return
    await refuse_unless_caller_active(request, _MANAGING_TOKENS)


async def _owned(request: web.Request) -> tuple[TenantRecord, TokenRecord]:
    """The token of the path and its tenant, if the caller may manage it (else 404)."""
    token_id = request.match_info["token_id"]
    caller = tenant_of(request)
    store = request.app[STORE]
    record = await store.get_token(token_id)
    if record is None or not (caller.admin or record.tenant_id == caller.tenant_id):
        raise _not_found(token_id)
    owner = caller if record.tenant_id == caller.tenant_id else None
    owner = owner or await store.get_tenant(record.tenant_id)
    if owner is None:
        raise _not_found(token_id)
    return owner, record


async def create_token(request: web.Request) -> web.Response:
    query = parse_query(request, TokenQuery)
    await _refuse_unless_caller_active(request)
    body = decode_body(await read_body(request), _CREATE)
    owner = await scoped_tenant(request, query.tenant, admin_sees_all=False)
    if owner is None:
        raise Problem(
            400, "invalid-query", "Invalid query parameters", "tenant: name one tenant, not *"
        )
    audit = audit_entry(request, "token.create", "", tenant=owner.name, name=body.name)
    created = await request.app[STORE].create_token(
        owner.tenant_id, body.name, created_by=tenant_of(request).name, audit=audit
    )
    view = token_view(created.record, owner.name, time.time())
    reply = TokenCreated(**msgspec.structs.asdict(view), token=created.token)
    return json_response(reply, status=201)


async def list_tokens(request: web.Request) -> web.Response:
    query = parse_query(request, TokenQuery)
    scope = await scoped_tenant(request, query.tenant, admin_sees_all=False)
    records = await request.app[STORE].list_tokens(None if scope is None else scope.tenant_id)
    names = await tenant_names(request, scope)
    now = time.time()
    items = tuple(token_view(r, names.get(r.tenant_id, r.tenant_id), now) for r in records)
    return json_response(TokenList(items=items, count=len(items)))


async def rotate_token(request: web.Request) -> web.Response:
    await _refuse_unless_caller_active(request)
    owner, record = await _owned(request)
    # The body is optional: without one, the default overlap.
    body = (
        decode_body(await read_body(request), _ROTATE) if request.can_read_body else TokenRotate()
    )
    audit = audit_entry(
        request, "token.rotate", record.token_id, tenant=owner.name, overlap_s=body.overlap_s
    )
    try:
        rotated = await request.app[STORE].rotate_token(
            record.token_id, body.overlap_s, created_by=tenant_of(request).name, audit=audit
        )
    except TokenNotFoundError:
        raise _not_found(record.token_id) from None
    except TokenNotActiveError as error:
        raise Problem(
            409,
            "token-not-active",
            "Token not active",
            f"token {record.token_id} is {error.state}: only an active token can be rotated",
        ) from None
    now = time.time()
    new = token_view(rotated.new.record, owner.name, now)
    reply = TokenRotated(
        token=TokenCreated(**msgspec.structs.asdict(new), token=rotated.new.token),
        replaced=token_view(rotated.old, owner.name, now),
    )
    return json_response(reply, status=201)


async def revoke_token(request: web.Request) -> web.Response:
    await _refuse_unless_caller_active(request, revoking=request.match_info["token_id"])
    owner, record = await _owned(request)
    audit = audit_entry(request, "token.revoke", record.token_id, tenant=owner.name)
    try:
        revoked = await request.app[STORE].revoke_token(record.token_id, audit=audit)
    except TokenNotFoundError:
        raise _not_found(record.token_id) from None
    except LastAdminTokenError:
        raise Problem(
            409,
            "last-admin-token",
            "Last admin token",
            f"token {record.token_id} is the admin's last working token (a rotated one "
            "works only until its overlap ends): rotate it, or create another first",
        ) from None
    return json_response(token_view(revoked, owner.name, time.time()))


_TENANT_DOC: Final = "The admin: `?tenant=NAME` acts on that tenant's tokens."

ROUTES: Final = (
    Route(
        "POST",
        "/v1/tokens",
        create_token,
        "Create another bearer token; the reply holds it, shown only this once",
        "tenant",
        "tokens",
        query=TokenQuery,
        body=TokenCreate,
        description=_TENANT_DOC,
        replies=(
            Reply(201, "The token and its secret", TokenCreated),
            problem_reply(
                403,
                "Another tenant's tokens, asked by a tenant that is not the admin. "
                + CALLER_NOT_ACTIVE_DOC,
            ),
        ),
    ),
    Route(
        "GET",
        "/v1/tokens",
        list_tokens,
        "List bearer tokens, oldest first, without their secrets",
        "tenant",
        "tokens",
        query=TokenQuery,
        description="The caller's own; the admin: `?tenant=NAME`, or `?tenant=*` for all.",
        replies=(Reply(200, "The tokens", TokenList),),
    ),
    Route(
        "POST",
        "/v1/tokens/{token_id}/rotate",
        rotate_token,
        "Replace a token: a new one now, the old one refused after the overlap",
        "tenant",
        "tokens",
        body=TokenRotate,
        body_required=False,  # without one, the default overlap
        replies=(
            Reply(201, "The new token (with its secret) and the old one", TokenRotated),
            problem_reply(403, CALLER_NOT_ACTIVE_DOC),
            problem_reply(409, "The token was already rotated or revoked"),
        ),
    ),
    Route(
        "DELETE",
        "/v1/tokens/{token_id}",
        revoke_token,
        "Revoke a token: refused from now on",
        "tenant",
        "tokens",
        replies=(
            Reply(200, "The revoked token", TokenView),
            problem_reply(403, CALLER_NOT_ACTIVE_DOC + ", and the token is not itself"),
            problem_reply(409, "The admin's last working token"),
        ),
    ),
)
