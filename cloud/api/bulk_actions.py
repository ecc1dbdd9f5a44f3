"""Bulk destructive admin actions need an explicit confirmation.

Revoking a node, draining a node and an admin's cancelling of work each undo what
cannot be redone at once; a script or a fuzzer following links can do all of them to
a whole fleet in seconds. An admin may do `cloud.destructive_actions_per_minute` of
them in any minute; past that, each one more is refused with a 428 problem that says
how to confirm (`Greenfed-Confirm: bulk`), and the refusal is audited (`bulk.refused`).
A confirmed action is recorded with `"confirmed": "bulk"` in its audit detail.

Only an action that would be done is held to it: past the limit the handler still
runs, so that what it cannot do is the 404 or 409 it is within the limit (a job that
does not exist or has ended, an ambiguous name), and it is stopped where it records
the action (`audit_entry`, cloud/api/audit.py), its target resolved and nothing done.

The count is read from the audit log, where each such action is recorded in the same
transaction as the action itself: every replica counts the same actions, and one that
failed never counts. Within one replica an admin's unconfirmed actions take turns (a
lock per admin held from the count to the action's commit), so parallel requests stop
at the limit as requests in turn do. Across replicas nothing is shared but the log:
requests racing on different replicas may each pass at the limit; the guard is for
runaway loops, not for a precise quota.

A handler opts in with `@destructive("node.revoke")`; the OpenAPI document reads the
mark (`destructive_action_of`) to document the header and the 428.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Final, Literal

from aiohttp import web

from cloud.api.audit import UnconfirmedAction, audit_entry
from cloud.api.auth import tenant_of
from cloud.api.problems import Problem
from cloud.api.routes import Handler
from cloud.app_keys import BULK_CONFIRMED, BULK_UNCONFIRMED, SETTINGS, STORE
from cloud.store import AuditQuery
from shared.problems import CONFIRM_HEADER, CONFIRM_VALUE, InvalidParam

DestructiveAction = Literal["node.revoke", "node.drain", "work.cancel"]
DESTRUCTIVE_ACTIONS: Final[tuple[DestructiveAction, ...]] = (
    "node.revoke",
    "node.drain",
    "work.cancel",
)
WINDOW_S: Final = 60.0
_MARK: Final = "__greenfed_destructive_action__"


# One lock per admin, for its unconfirmed destructive actions (the module doc), kept
# for the app's life: there are a few admins, not a growing set of names.
ActorLocks = defaultdict[str, asyncio.Lock]
DESTRUCTIVE_LOCKS = web.AppKey("destructive_locks", ActorLocks)


def destructive(action: DestructiveAction) -> Callable[[Handler], Handler]:
    """Guard a handler that does `action` (see the module doc)."""

    def decorate(handler: Handler) -> Handler:
        @functools.wraps(handler)
        async def guarded(request: web.Request) -> web.StreamResponse:
            # Held from the count to the commit: otherwise parallel requests all read
            # the same count below the limit and all pass.
            async with _counted_in_turn(request):
                done = await _done_past_limit(request)
                if done is None:
                    return await handler(request)
                request[BULK_UNCONFIRMED] = action
                try:
                    return await handler(request)
                except UnconfirmedAction as stopped:
                    raise await _confirmation_required(
                        request, action, stopped.target, done
                    ) from None

        setattr(guarded, _MARK, action)
        return guarded

    return decorate


def destructive_action_of(handler: Handler) -> DestructiveAction | None:
    action: DestructiveAction | None = getattr(handler, _MARK, None)
    return action


def _counted_in_turn(request: web.Request) -> contextlib.AbstractAsyncContextManager[None]:
    """The caller's lock where the limit may refuse it: an admin without the header.
    Confirmed actions and tenants' own cancellations are never counted against it."""
    caller = tenant_of(request)
    if not caller.admin or CONFIRM_HEADER in request.headers:
        return contextlib.nullcontext()
    return request.app[DESTRUCTIVE_LOCKS][caller.name]


def _confirmed(request: web.Request) -> bool:
    value = request.headers.get(CONFIRM_HEADER)
    if value is None:
        return False
    if value != CONFIRM_VALUE:
        raise Problem(
            400,
            "invalid-header",
            f"Invalid {CONFIRM_HEADER}",
            f"{CONFIRM_HEADER} must be {CONFIRM_VALUE!r}",
            (InvalidParam(CONFIRM_HEADER, f"only {CONFIRM_VALUE!r}"),),
        )
    return True


async def _done_past_limit(request: web.Request) -> int | None:
    """The caller's destructive actions in the last minute when it is an admin past the
    limit without the confirmation, else None (the action may go ahead). Tenants
    cancelling their own work are not held to it."""
    confirmed = _confirmed(request)  # a bad header is a 400 whoever sends it
    caller = tenant_of(request)
    if not caller.admin:
        return None
    if confirmed:
        request[BULK_CONFIRMED] = True  # audit_entry records it with the action
        return None
    limit = request.app[SETTINGS].cloud.destructive_actions_per_minute
    if limit <= 0:
        return 0  # every one needs the confirmation
    recent = await request.app[STORE].list_audit(
        AuditQuery(
            since=time.time() - WINDOW_S,
            actor=caller.name,
            actions=DESTRUCTIVE_ACTIONS,
            limit=limit,
        )
    )
    done = len(recent.items)
    return done if done >= limit else None


async def _confirmation_required(
    request: web.Request, action: DestructiveAction, target: str, done: int
) -> Problem:
    """The 428 for `action` on `target`, once its refusal is audited."""
    caller = tenant_of(request)
    limit = request.app[SETTINGS].cloud.destructive_actions_per_minute
    await request.app[STORE].record_audit(
        audit_entry(
            request, "bulk.refused", target, refused=action, in_last_minute=done, limit=limit
        )
    )
    return Problem(
        428,
        "confirmation-required",
        "Confirmation required",
        f"{caller.name} did {done} node revocations, drains and work cancellations in the "
        f"last minute (cloud.destructive_actions_per_minute = {limit}); to do more, send "
        f"the header {CONFIRM_HEADER}: {CONFIRM_VALUE}",
    )
