"""Who may mint a credential: only a caller whose own bearer token is `active`.

A token rotated out still works for its overlap (cloud/api/tokens.py), so that its
holder can move to the replacement without a gap. Rotating a leaked token is meant to
shut its holder out when the overlap ends: were the old token allowed to mint a
credential that outlives the overlap, rotating it would protect nothing. So every route
that makes a credential asks `refuse_unless_caller_active` first:

- `POST /v1/tokens`, `POST /v1/tokens/{token_id}/rotate`: a bearer token (revoking
  another token is refused too: it could be the replacement);
- `POST /v1/tenants`: a tenant and its first bearer token (an admin's, perhaps);
- `POST /v1/mqtt/accounts`: a broker account and its password;
- `POST /v1/nodes/join-tokens`: a join token, which enrols nodes (each gets a broker
  account);
- `POST /v1/agent-packages`, `POST /v1/agent-rollouts`: code every node runs as its
  agent, which outlives the overlap as a credential does.

Everything else a rotated token may still do until its overlap ends.
"""

from __future__ import annotations

import time
from typing import Final

from aiohttp import web

from cloud.api.auth import caller_token_of
from cloud.api.problems import Problem, problem_reply
from cloud.app_keys import STORE

CALLER_NOT_ACTIVE_DOC: Final = "The caller's own token is not active (rotated out, in its overlap)"
# The 403 of an admin route that mints a credential: either reason.
ADMIN_MINTING_REFUSAL: Final = problem_reply(
    403,
    "Not an admin token; or the admin's own token is not active (rotated out, in its overlap)",
)


async def refuse_unless_caller_active(request: web.Request, minting: str) -> None:
    """A 403 `caller-token-not-active` unless the caller's own token is `active` now.
    `minting`: what only an active token may do, as the refusal says it ("create MQTT
    accounts")."""
    caller_token_id = caller_token_of(request).token_id
    # Read afresh: the verdict that let the request in may be store.token_cache_s old,
    # from before another replica rotated the token.
    current = await request.app[STORE].get_token(caller_token_id)
    state = "revoked" if current is None else current.state(time.time())
    if state != "active":
        raise Problem(
            403,
            "caller-token-not-active",
            "Forbidden",
            f"the bearer token {caller_token_id} is {state}: only an active token may "
            f"{minting}; use its replacement",
        )
