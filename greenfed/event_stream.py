"""The control plane's event stream (`GET /v1/events`, server-sent events) as typed
events: what `greenfed events` prints and what `--watch` redraws on."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Final

import msgspec

from cloud.work.views import EventView

if TYPE_CHECKING:
    from greenfed.api_client import ApiClient

_DECODER: Final = msgspec.json.Decoder(EventView)
# The kinds of event the control plane records (a state change; a hold, a change of spec,
# scaling, a canary rollout, final usage), and `work` for all of them: what
# `greenfed events --kind` takes (tests/cli/test_cli_review5_events_cancel.py keeps it
# the server's).
EVENT_KINDS: Final = (
    "work.state",
    "work.hold",
    "work.updated",
    "work.scaled",
    "work.rollout",
    "work.usage",
)
EVENT_FAMILIES: Final = ("work",)


def _message(block: bytes) -> EventView | None:
    """One SSE message (the lines between blank lines); None for a comment or `retry`."""
    data = [line[5:].removeprefix(b" ") for line in block.split(b"\n") if line.startswith(b"data:")]
    return _DECODER.decode(b"\n".join(data)) if data else None


async def events(client: ApiClient, params: Mapping[str, str]) -> AsyncIterator[EventView]:
    """Each event of the stream, in order, until the server ends it."""
    pending = b""
    async for chunk in client.stream("/v1/events", params, heartbeats=True):
        pending += chunk.replace(b"\r\n", b"\n")
        *blocks, pending = pending.split(b"\n\n")
        for block in blocks:
            event = _message(block)
            if event is not None:
                yield event


def matches(event: EventView, kinds: tuple[str, ...]) -> bool:
    """`kinds` empty, or naming the event's kind or a family of it (`work` for work.*)."""
    return not kinds or any(
        event.kind == kind or event.kind.startswith(kind + ".") for kind in kinds
    )
