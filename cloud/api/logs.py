"""`GET /v1/jobs/{id}/logs`: a training job's recent output, as text, optionally followed
(the caller's job; the admin's: any tenant's).

Output comes from the in-memory `JobLogStore` (fed by the `logs` MQTT channel). By
default the latest attempt that has output, all its workers; a gang's lines are
prefixed with their node (`[gpu-3] epoch 1 ...`), a progress bar's redraws (carriage
returns) each a line of its own. With `follow=true` the response stays open (chunked
`text/plain`) and new output is written as it arrives, including later attempts (after
a `[greenfed: attempt N]` line), until the job has ended and its last output had time
to arrive, the client goes away, or the server stops. Output trimmed before the
follower read it is marked as the plain read marks it.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Final

import msgspec
from aiohttp import web

from cloud.api.auth import still_authorised, tenant_of
from cloud.api.query import parse_query
from cloud.api.routes import Reply, Route
from cloud.api.streams import STREAM_REFUSALS
from cloud.api.work import JOBS, _spec, find
from cloud.app_keys import JOB_LOGS, STOPPING, STORE, STREAMS, TUNING
from cloud.store import TERMINAL_STATES
from cloud.streams.logs import JobLogStore, LogSnapshot, render_tail

TEXT: Final = "text/plain; charset=utf-8"


class LogQuery(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    tail: Annotated[int, msgspec.Meta(ge=0, description="Only the last N lines.")] | None = None
    follow: Annotated[bool, msgspec.Meta(description="Keep streaming new output.")] = False
    attempt: (
        Annotated[int, msgspec.Meta(ge=0, description="This attempt only (default: latest).")]
        | None
    ) = None
    node: Annotated[str, msgspec.Meta(description="This node's worker only.")] | None = None


def _selection(
    logs: JobLogStore, job_id: str, query: LogQuery
) -> tuple[int | None, int | None, LogSnapshot]:
    """(exact attempt, first attempt when following, what is kept of it now)."""
    if query.attempt is not None:
        return query.attempt, None, logs.snapshot(job_id, attempt=query.attempt, node_id=query.node)
    attempts = logs.snapshot(job_id).attempts
    latest = attempts[-1] if attempts else None
    if query.follow:
        return None, latest, logs.snapshot(job_id, min_attempt=latest, node_id=query.node)
    return latest, None, logs.snapshot(job_id, attempt=latest, node_id=query.node)


async def job_logs(request: web.Request) -> web.StreamResponse:
    query = parse_query(request, LogQuery)
    caller = tenant_of(request)
    # The admin reads any tenant's job; its streams count against its own slots.
    tenant, record = await find(request, JOBS, request.match_info["id"], any_tenant=True)
    # Tolerant: a spec a newer greenfed wrote (a rolling upgrade) still has its workers.
    spec = _spec(JOBS, record)
    logs = request.app[JOB_LOGS]
    prefix = spec.workers > 1 and query.node is None
    attempt, min_attempt, snapshot = _selection(logs, record.work_id, query)
    headers = {"X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"}
    if attempt is not None:
        headers["X-Greenfed-Attempt"] = str(attempt)
    if not query.follow:
        text, _ = render_tail(snapshot, prefix=prefix, tail_lines=query.tail)
        return web.Response(text=text, content_type="text/plain", headers=headers)

    tuning = request.app[TUNING]
    with request.app[STREAMS].slot(caller.tenant_id):
        response = web.StreamResponse(headers={**headers, "Content-Type": TEXT})
        response.enable_chunked_encoding()
        await response.prepare(request)
        text, renderer = render_tail(snapshot, prefix=prefix, tail_lines=query.tail, finish=False)
        loop = asyncio.get_running_loop()
        stopping = request.app[STOPPING]
        cursor = snapshot.last_seq
        ended_at: float | None = None
        next_state_check = 0.0
        try:
            await response.write(text.encode())
            while not stopping.is_set():
                transport = request.transport
                if transport is None or transport.is_closing():
                    return response  # the client went away
                got = await logs.wait_for_output(record.work_id, cursor, tuning.log_state_poll_s)
                # Its token asked again before anything is sent (a cached verdict: a
                # hash): a revoked token's stream ends, and sends nothing after it.
                if not await still_authorised(request):
                    await response.write_eof()
                    return response
                if got:
                    new = logs.snapshot(
                        record.work_id,
                        attempt=attempt,
                        min_attempt=min_attempt,
                        node_id=query.node,
                        after_seq=cursor,
                    )
                    cursor = max(cursor, new.last_seq)
                    chunk = renderer.feed(new.pieces)
                    if chunk:
                        await response.write(chunk.encode())
                now = loop.time()
                if ended_at is None and now >= next_state_check:
                    next_state_check = now + tuning.log_state_poll_s
                    current = await request.app[STORE].get_work(tenant.tenant_id, record.work_id)
                    if current is None or current.state in TERMINAL_STATES:
                        ended_at = now
                if ended_at is not None and not got and now - ended_at >= tuning.log_drain_s:
                    break
            await response.write(renderer.flush().encode())
            await response.write_eof()
        except ConnectionResetError:  # the client went away mid-write
            pass
        return response


ROUTES: Final = (
    Route(
        "GET",
        "/v1/jobs/{id}/logs",
        job_logs,
        "A training job's recent output (follow=true streams it; the admin: any tenant's)",
        "tenant",
        "jobs",
        query=LogQuery,
        replies=(
            Reply(
                200,
                "The output as text; chunked while following",
                str,
                "text/plain",
                headers=("X-Greenfed-Attempt",),
            ),
            *STREAM_REFUSALS,
        ),
        head=False,
    ),
)
