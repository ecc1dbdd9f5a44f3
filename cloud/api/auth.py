"""Bearer tokens to tenants: every route is for a valid token unless declared public.

`Authorization: Bearer gf_<id>_<secret>` is checked by `Store.check_token` (hashed
tokens, a short cache). A missing or unknown token is a 401 with `WWW-Authenticate:
Bearer`; a revoked token, or one rotated out (its overlap over), is a 401 that says
so (naming no other token); a secret left unchecked because its token id had a flood
of guesses is a 429 to retry; an admin-only route asked by another tenant is a 403.
The tenant is then available to handlers as `request[TENANT]`, and every handler
scopes what it reads and writes to it; the token it was accepted with as
`request[CALLER_TOKEN]` (its record as verified, perhaps `store.token_cache_s` old: what
must know its state now reads it afresh, as managing tokens does).
"""

from __future__ import annotations

import math

from aiohttp import web

from cloud.api.problems import Problem
from cloud.api.query import UNDECODABLE_REASON, is_clean_text
from cloud.api.routes import ROUTE_ACCESS, Handler
from cloud.app_keys import STORE, TENANT
from cloud.store import (
    Authenticated,
    StoreUnavailableError,
    TenantRecord,
    TokenRecord,
    TokenRefused,
)
from cloud.store.tenant_tokens import TokenThrottled
from shared.clock import utc_from_epoch
from shared.problems import InvalidParam

_REALM = 'Bearer realm="greenfed"'

# The bearer token a request was accepted with (set by the auth middleware with TENANT).
CALLER_TOKEN = web.RequestKey("caller_token", TokenRecord)


def bearer_token(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    match_info = request.match_info
    if match_info.http_exception is not None:
        return await handler(request)  # unknown route or method: its own 404/405
    for name, value in match_info.items():
        if not is_clean_text(value):  # no id has control characters (nor a store, a NUL)
            raise Problem(
                404,
                "not-found",
                "Not Found",
                f"{name}: {UNDECODABLE_REASON}",
                (InvalidParam(name, UNDECODABLE_REASON),),
            )
    access = request.app[ROUTE_ACCESS].get(match_info.handler, "tenant")
    if access in ("public", "scrape") or (access == "signed" and "sig" in request.query):
        # "signed": the handler checks the signature; "scrape": any token it gets
        return await handler(request)
    token = bearer_token(request)
    if token is None:
        raise Problem(
            401,
            "unauthenticated",
            "Authentication required",
            "send the header Authorization: Bearer <token>",
            headers={"WWW-Authenticate": _REALM},
        )
    caller = await authenticated(request, token)
    if access == "admin" and not caller.tenant.admin:
        raise Problem(403, "admin-only", "Forbidden", "this operation needs an admin token")
    request[TENANT] = caller.tenant
    request[CALLER_TOKEN] = caller.token
    return await handler(request)


async def authenticated(request: web.Request, token: str) -> Authenticated:
    """The tenant and record of a bearer token; a 401 problem for a token that is not (or
    no longer) valid."""
    verdict = await request.app[STORE].check_token(token)
    if isinstance(verdict, TokenRefused):
        raise _refused(verdict)
    if isinstance(verdict, TokenThrottled):
        raise _throttled(verdict)
    if not isinstance(verdict, Authenticated):
        raise invalid_token()
    return verdict


async def authenticated_tenant(request: web.Request, token: str) -> TenantRecord:
    """The tenant of a bearer token; a 401 problem for a token that is not (or no
    longer) valid."""
    return (await authenticated(request, token)).tenant


async def still_authorised(request: web.Request) -> bool:
    """The request's token still works for the tenant it was accepted for: a stream
    (events, followed logs) asks again as it goes, so that revoking a leaked token ends
    the streams it opened (in this process at once; in others within
    `store.token_cache_s`)."""
    token = bearer_token(request)
    if token is None:
        return False
    verdict = await request.app[STORE].check_token(token)
    return (
        isinstance(verdict, Authenticated)
        and verdict.tenant.tenant_id == tenant_of(request).tenant_id
    )


def invalid_token(detail: str = "the bearer token is unknown or malformed") -> Problem:
    return Problem(
        401,
        "invalid-token",
        "Invalid token",
        detail,
        headers={"WWW-Authenticate": f'{_REALM}, error="invalid_token"'},
    )


def _refused(verdict: TokenRefused) -> Problem:
    """A token of ours that no longer works: revoked, or rotated and past its overlap."""
    token = verdict.token
    if token.revoked_at is not None:
        why = f"was revoked at {utc_from_epoch(token.revoked_at).isoformat()}"
    else:
        # Not its replacement's id: whoever still holds a rotated-out token may be the
        # one it was rotated away from, and needs no id to aim guesses at.
        ended = utc_from_epoch(token.expires_at or 0.0).isoformat()
        why = f"was rotated and revoked when its overlap ended at {ended}"
    return Problem(
        401,
        "token-revoked",
        "Token revoked",
        f"the bearer token {token.token_id} ({token.name!r}) {why}; use another token",
        headers={
            "WWW-Authenticate": (
                f'{_REALM}, error="invalid_token", error_description="the token was revoked"'
            )
        },
    )


def _throttled(verdict: TokenThrottled) -> Problem:
    """A secret not checked: its token id had too many lately (a flood of guesses, or a
    secret new to this replica during one). Not a refusal: the right secret is accepted
    when asked again."""
    retry_after_s = max(1, math.ceil(verdict.retry_after_s))
    return Problem(
        429,
        "too-many-attempts",
        "Too many attempts",
        f"too many secrets for this token's id lately; retry in {retry_after_s} s",
        headers={"Retry-After": str(retry_after_s)},
    )


@web.middleware
async def store_errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A database that is briefly unreachable is a 503 to retry, not a 500."""
    try:
        return await handler(request)
    except StoreUnavailableError as error:
        raise Problem(
            503, "store-unavailable", "Store unavailable", str(error), headers={"Retry-After": "1"}
        ) from None


def tenant_of(request: web.Request) -> TenantRecord:
    return request[TENANT]


def caller_token_of(request: web.Request) -> TokenRecord:
    return request[CALLER_TOKEN]
