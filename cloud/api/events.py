"""`GET /v1/events`: the caller's tenant's events as server-sent events, resumable;
the admin's stream carries every tenant's (or one tenant's, `?tenant=NAME`).

Each event's SSE `id` is its sequence number in the store's event log; a client that
reconnects with `Last-Event-ID: <id>` (browsers' EventSource does so by itself), or
`?after=<id>`, receives everything after it, in order, without loss or duplicates.
Without either, the stream starts with the next event. Comments (`: keep-alive`) are
sent every `heartbeat_s` so that idle connections survive proxies.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Annotated, Final

import msgspec
from aiohttp import web

from cloud.api.auth import still_authorised, tenant_of
from cloud.api.problems import Problem
from cloud.api.query import parse_query
from cloud.api.routes import Reply, RequestHeader, Route
from cloud.api.scope import TenantParameter, scoped_tenant, tenant_names
from cloud.api.streams import STREAM_REFUSALS
from cloud.app_keys import EVENT_HUB, STORE, STREAMS, TUNING
from cloud.store import EventRecord
from cloud.work.views import EventView
from shared.clock import utc_from_epoch
from shared.problems import InvalidParam

_ENCODER: Final = msgspec.json.Encoder()
RETRY_MS: Final = 2000
# Event ids are the store's 64-bit sequence: a larger cursor names no event (and would
# overflow the database's BIGINT), so it is refused as the bad input it is.
MAX_EVENT_ID: Final = 2**63 - 1
_DIGITS: Final = re.compile("[0-9]{1,19}")


class EventsQuery(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    after: (
        Annotated[
            int,
            msgspec.Meta(
                ge=0,
                le=MAX_EVENT_ID,
                description="Resume after this event id (like Last-Event-ID).",
            ),
        ]
        | None
    ) = None
    tenant: TenantParameter = None  # the admin sees every tenant's without it
    since: (
        Annotated[
            datetime,
            msgspec.Meta(
                tz=True,
                description="Start with the events recorded at or after this time (RFC 3339), "
                "instead of the next one; `after` and Last-Event-ID take precedence.",
            ),
        ]
        | None
    ) = None
    work_id: (
        Annotated[
            str,
            msgspec.Meta(
                max_length=64, description="Only the events of this job or deployment (its id)."
            ),
        ]
        | None
    ) = None
    follow: Annotated[
        bool,
        msgspec.Meta(
            description="false: end the stream once the stored events are sent "
            "(with after=0: the whole log, as `greenfed events` lists it)."
        ),
    ] = True


def sse_message(event: EventRecord, names: Mapping[str, str]) -> bytes:
    data = _ENCODER.encode(
        EventView(
            seq=event.seq,
            kind=event.kind,
            work_id=event.work_id,
            at=utc_from_epoch(event.at),
            payload=msgspec.Raw(event.payload),
            tenant=None if event.tenant_id is None else names.get(event.tenant_id),
        )
    )
    lines = [f"id: {event.seq}".encode(), f"event: {event.kind}".encode()]
    # A stored payload might be pretty-printed: every line of it is a `data:` line.
    lines.extend(b"data: " + line for line in data.split(b"\n"))
    return b"\n".join(lines) + b"\n\n"


def _last_event_id(request: web.Request, query: EventsQuery) -> int | None:
    header = request.headers.get("Last-Event-ID")
    if header is None:
        return query.after
    value = int(header) if _DIGITS.fullmatch(header) else -1
    if not 0 <= value <= MAX_EVENT_ID:
        raise Problem(
            400,
            "invalid-header",
            "Invalid Last-Event-ID",
            "Last-Event-ID must be the id of an event received earlier (an integer >= 0)",
            (InvalidParam("Last-Event-ID", "an integer >= 0"),),
        )
    return value


class _Names:
    """Tenant names for the events sent; a tenant created while an admin's stream of
    every tenant is open is looked up when its first event comes."""

    def __init__(self, request: web.Request, names: dict[str, str], every: bool) -> None:
        self._request = request
        self.names = names
        self._every = every

    async def messages(self, events: Sequence[EventRecord]) -> bytes:
        if self._every and any(e.tenant_id not in self.names for e in events if e.tenant_id):
            self.names = await tenant_names(self._request, None)
        return b"".join(sse_message(event, self.names) for event in events)


async def _catch_up(
    request: web.Request,
    tenant_id: str | None,
    after: int,
    response: web.StreamResponse,
    names: _Names,
    work_id: str | None = None,
) -> int | None:
    """Send the tenant's (every tenant's, for None) stored events after `after` (of
    `work_id` only, if given); the last id sent, or None once the stream has ended
    because its token was revoked meanwhile."""
    store = request.app[STORE]
    page_size = request.app[TUNING].event_page_size
    first_page = True
    while True:
        # A long backlog takes as long as its reader does: its token is asked again
        # before each further page, so that a revoked token's stream ends here too and
        # sends nothing after it (not only in the follow loop).
        if not first_page and not await still_authorised(request):
            await response.write_eof()
            return None
        first_page = False
        page = await store.list_events(
            tenant_id=tenant_id, after_seq=after, limit=page_size, work_id=work_id
        )
        if page:
            await response.write(await names.messages(page))
            after = page[-1].seq
        if len(page) < page_size:
            return after


async def stream_events(request: web.Request) -> web.StreamResponse:
    tenant = tenant_of(request)
    query = parse_query(request, EventsQuery)
    after = _last_event_id(request, query)
    scope = await scoped_tenant(request, query.tenant, admin_sees_all=True)
    scope_id = None if scope is None else scope.tenant_id
    names = _Names(request, await tenant_names(request, scope), every=scope is None)
    store = request.app[STORE]
    hub = request.app[EVENT_HUB]
    tuning = request.app[TUNING]
    if after is None:
        before = None if query.since is None else query.since.timestamp()
        after = await store.last_event_seq(before=before)
    with request.app[STREAMS].slot(tenant.tenant_id), hub.subscribe(scope_id) as feed:
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-store",
                "X-Accel-Buffering": "no",  # nginx: do not buffer the stream
            }
        )
        await response.prepare(request)
        try:
            await response.write(f"retry: {RETRY_MS}\n\n".encode())
            # Subscribed first, then caught up: what commits meanwhile is queued, and
            # what the catch-up also read is skipped below by its sequence number.
            caught_up = await _catch_up(request, scope_id, after, response, names, query.work_id)
            if caught_up is None:  # the token was revoked: the stream has ended
                return response
            last = caught_up
            if not query.follow:
                await response.write_eof()
                return response
            # When something was last sent: a stream of one work's events (`work_id`) among
            # other work's hears nothing for as long as that work is quiet, and a client
            # takes a stream silent for a few heartbeats for dead (greenfed/api_client.py).
            loop = asyncio.get_running_loop()
            sent_at = loop.time()
            while not feed.closed:
                batch = await feed.take(tuning.heartbeat_s)
                # Its token asked again before anything is sent (a cached verdict: a
                # hash): a revoked token's stream ends, and sends nothing after it.
                if not await still_authorised(request):
                    await response.write_eof()
                    break
                if batch is None:
                    await response.write(b": keep-alive\n\n")
                    sent_at = loop.time()
                    continue
                if feed.overflowed:
                    feed.reset()
                    caught_up = await _catch_up(
                        request, scope_id, last, response, names, query.work_id
                    )
                    if caught_up is None:  # the token was revoked: the stream has ended
                        break
                    last = caught_up
                    continue
                fresh = [
                    event
                    for event in batch
                    if event.seq > last and query.work_id in (None, event.work_id)
                ]
                if fresh:
                    await response.write(await names.messages(fresh))
                    last = fresh[-1].seq
                    sent_at = loop.time()
                elif loop.time() - sent_at >= tuning.heartbeat_s:
                    await response.write(b": keep-alive\n\n")
                    sent_at = loop.time()
        except ConnectionResetError:  # the client went away
            pass
        return response


ROUTES: Final = (
    Route(
        "GET",
        "/v1/events",
        stream_events,
        "The tenant's work state changes (the admin: every tenant's) as server-sent events",
        "tenant",
        "events",
        query=EventsQuery,
        headers=(
            RequestHeader(
                "Last-Event-ID",
                "Resume after this event id (sent by EventSource).",
                {"type": "integer", "minimum": 0, "maximum": MAX_EVENT_ID},
            ),
        ),
        description=(
            "Each message has `id` (the event's sequence number), `event` (its kind, e.g. "
            "`work.state`) and `data` (an EventView as JSON). The admin's stream carries "
            "every tenant's events, or one tenant's with `?tenant=NAME`."
        ),
        replies=(
            Reply(200, "An endless text/event-stream", EventView, "text/event-stream"),
            *STREAM_REFUSALS,
        ),
        head=False,
    ),
)
