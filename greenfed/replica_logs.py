"""`greenfed logs DEPLOYMENT [--replica N] [-f]`: what happened to a deployment's replicas.

A replica runs inside its node's agent (an ONNX Runtime session, no process of its own
with output), so its log is its lifecycle as the control plane knows it: the
deployment's events (`GET /v1/events?work_id=`: placed, scaled, updated, rolled out, ended), then
each replica as its node reports it (node, state, execution provider, why it failed or
fell back). `-f` keeps printing: new events as they come, and a replica's line again
whenever its node reports a change, until the deployment has ended. `--replica N`:
that replica's lines only.

`greenfed logs ID` is a training job's output when ID names a job (greenfed/work_commands.py);
a deployment's name or id gets this.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections import deque
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Final, TextIO

import msgspec

from cloud.work.views import DeploymentView, EventView, ReplicaView
from greenfed.arguments import EXIT_OK
from shared.printable import printable

if TYPE_CHECKING:
    from greenfed.api_client import ApiClient

POLL_S: Final = 2.0
_ENDED: Final = frozenset({"succeeded", "failed", "cancelled"})


class _Work(msgspec.Struct, frozen=True):
    """The id of the work a reference (an id, a name, an id prefix) names."""

    id: str


def _at(moment: datetime) -> str:
    return f"{moment.astimezone(UTC):%Y-%m-%dT%H:%M:%S}Z"


def event_line(event: EventView) -> str:
    from greenfed.declarative_commands import event_detail

    return f"{_at(event.at)}  {event.kind}  {event_detail(event)}\n"


def replica_line(replica: ReplicaView, at: datetime) -> str:
    """One line; the provider and the reason are the node's words, made printable."""
    provider = f" on {printable(replica.provider)}" if replica.provider else ""
    reason = f": {printable(replica.reason)}" if replica.reason else ""
    return (
        f"{_at(at)}  [{replica.node_id}] replica {replica.replica}: {replica.state}{provider}"
        f"{reason}\n"
    )


def _replica_key(replica: ReplicaView) -> tuple[object, ...]:
    return (replica.node_id, replica.state, replica.provider, replica.reason)


async def deployment_logs(
    client: ApiClient,
    reference: str,
    *,
    follow: bool,
    tail: int | None,
    replica: int | None,
    out: TextIO = sys.stdout,
) -> int:
    from greenfed.api_client import path_segment
    from greenfed.event_stream import events

    view = await client.get(f"/v1/deployments/{path_segment(reference)}", DeploymentView)
    lines: deque[str] = deque(maxlen=tail if tail is not None else None)
    last_seq = 0
    if replica is None:
        history = {"after": "0", "follow": "false", "work_id": view.id}
        async for event in events(client, history):
            last_seq = event.seq
            lines.append(event_line(event))
    now = datetime.now(UTC)
    shown: dict[int, tuple[object, ...]] = {}
    for each in view.replica_states:
        if replica is None or each.replica == replica:
            shown[each.replica] = _replica_key(each)
            lines.append(replica_line(each, now))
    out.write("".join(lines))
    out.flush()
    if not follow or view.state in _ENDED:
        return EXIT_OK

    async def new_events(params: dict[str, str]) -> None:
        nonlocal last_seq
        async for event in events(client, {"after": str(last_seq), "work_id": view.id, **params}):
            last_seq = event.seq
            out.write(event_line(event))
            out.flush()

    async with asyncio.TaskGroup() as tasks:
        listener = tasks.create_task(new_events({})) if replica is None else None
        try:
            while True:
                await asyncio.sleep(POLL_S)  # a node's report is not an event: polled
                current = await client.get(
                    f"/v1/deployments/{path_segment(view.id)}", DeploymentView
                )
                at = datetime.now(UTC)
                for each in current.replica_states:
                    key = _replica_key(each)
                    if (replica is None or each.replica == replica) and shown.get(
                        each.replica
                    ) != key:
                        shown[each.replica] = key
                        out.write(replica_line(each, at))
                        out.flush()
                if current.state in _ENDED:
                    break
        finally:
            if listener is not None:
                listener.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await listener
    if replica is None:  # the events up to the end, whatever the stream had sent yet
        await new_events({"follow": "false"})
    return EXIT_OK


async def logs(
    client: ApiClient,
    reference: str,
    *,
    follow: bool,
    tail: int | None,
    attempt: int | None,
    node: str | None,
    replica: int | None,
) -> int:
    """A job's output, or (the reference names no job, or `--replica` is given) a
    deployment's replica log."""
    from greenfed import work_commands
    from greenfed.api_client import CliError, path_segment

    if replica is None:
        try:
            job = await client.get(f"/v1/jobs/{path_segment(reference)}", _Work)
        except CliError as error:
            if error.status != 404:
                raise
        else:
            # The job the reference named, by its own id: the one just found.
            return await work_commands.logs(
                client, job.id, follow=follow, tail=tail, attempt=attempt, node=node
            )
    try:
        return await deployment_logs(client, reference, follow=follow, tail=tail, replica=replica)
    except CliError as error:
        if error.status == 404 and replica is None:
            raise CliError(f"job or deployment {reference!r} not found", status=404) from None
        raise
