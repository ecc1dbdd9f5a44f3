"""`--watch` on `greenfed jobs`, `job`, `deployments`, `deployment` and `nodes`: draw, then
draw again each time something changes, until Ctrl-C (exit status 130) or, for one job
or deployment, until it has ended.

Changes are learnt from the event stream (`GET /v1/events`): any event of the tenant's
work (the admin's: anyone's) redraws. The stream is opened before the first drawing, so
nothing that happens while drawing is missed. Whatever the stream says (or when it cannot
be read, and for nodes, whose changes it does not carry), the command draws again every
`POLL_S` seconds. A terminal is cleared before each drawing; into a file or pipe the
drawings follow one another.

One job or deployment is watched by its id: a name or an id prefix is resolved once,
before the first drawing, so the watch stays with that work when another of the name is
submitted meanwhile (the name would then be ambiguous, or mean the new one).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import msgspec

if TYPE_CHECKING:
    from greenfed.api_client import ApiClient

POLL_S: Final = 5.0
# Events come in bursts (a pass places many): one drawing for what arrives this close.
_SETTLE_S: Final = 0.2
_CLEAR: Final = "\x1b[H\x1b[2J"
_ENDED: Final = frozenset({"succeeded", "failed", "cancelled"})
Handler = Callable[[argparse.Namespace], int]


def add_watch(
    parser: argparse.ArgumentParser,
    *,
    events: bool = True,
    ended: WatchedWork | None = None,
) -> None:
    """`-w/--watch` on a command whose handler draws once (set before this is called)."""
    draw_once: Handler = parser.get_default("handler")
    parser.add_argument(
        "-w",
        "--watch",
        action="store_true",
        help="draw again on every change until Ctrl-C"
        + (" or it has ended" if ended is not None else ""),
    )

    def command(args: argparse.Namespace) -> int:
        if not args.watch:
            return draw_once(args)
        from greenfed.work_cli import run_client

        return run_client(
            args,
            lambda client: watch(client, args, draw_once, events=events, ended=ended),
            timeout_s=None,
        )

    parser.set_defaults(handler=command)


async def watch(
    client: ApiClient,
    args: argparse.Namespace,
    draw_once: Handler,
    *,
    events: bool,
    ended: WatchedWork | None,
) -> int:
    import sys

    if ended is not None:
        args = await ended.pinned(client, args)
    changed = asyncio.Event()

    async def listen() -> None:
        from greenfed.api_client import CliError
        from greenfed.event_stream import events as event_stream

        # A stream that cannot be read leaves the poll to redraw.
        with contextlib.suppress(CliError):
            async for _ in event_stream(client, {}):
                changed.set()

    async with asyncio.TaskGroup() as tasks:
        listener = tasks.create_task(listen()) if events else None
        try:
            while True:
                changed.clear()
                # Asked before drawing: the last drawing shows the job as it ended.
                finished = ended is not None and await ended.has_ended(client, args)
                if sys.stdout.isatty():
                    sys.stdout.write(_CLEAR)
                # The command's own drawing, with its own client, off this loop.
                status = await asyncio.to_thread(draw_once, args)
                sys.stdout.flush()
                if status != 0 or finished:
                    return status
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), POLL_S)
                    await asyncio.sleep(_SETTLE_S)
        finally:
            if listener is not None:
                listener.cancel()


@dataclass(frozen=True, slots=True)
class WatchedWork:
    """One job (`collection` "jobs") or deployment ("deployments") watched until it has
    ended (succeeded, failed or cancelled)."""

    collection: str

    def _path(self, args: argparse.Namespace) -> str:
        from greenfed.api_client import path_segment

        return f"/v1/{self.collection}/{path_segment(args.id)}"

    async def pinned(self, client: ApiClient, args: argparse.Namespace) -> argparse.Namespace:
        """`args` with `id` the work's own id, whatever named it (a name, a prefix)."""
        view = await client.get(self._path(args), _StateOnly)
        return argparse.Namespace(**{**vars(args), "id": view.id})

    async def has_ended(self, client: ApiClient, args: argparse.Namespace) -> bool:
        view = await client.get(self._path(args), _StateOnly)
        return view.state in _ENDED


def work_ended(collection: str) -> WatchedWork:
    """`--watch` on `greenfed job ID` ("jobs") or `greenfed deployment ID` ("deployments")."""
    return WatchedWork(collection)


class _StateOnly(msgspec.Struct, frozen=True):
    """A job's or deployment's view (or a job array's summary), read for its id and state."""

    id: str
    state: str
