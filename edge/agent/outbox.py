"""Where events are queued (the outbox) until the broker has them.

`raise_event` may be called at any time, connected or not. Events raised while
the broker is unreachable wait here, oldest dropped first when it is full, and
are published once connected. Held in memory for now; a disk outbox replaces
the deque without changing this interface.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import deque

import aiomqtt

from edge.agent.context import AgentContext
from edge.agent.module import AgentModule
from shared.messages import EventKind, NodeEvent, encode
from shared.topics import Channel

EVENT_OUTBOX_CAPACITY = 1000


class Outbox(AgentModule):
    name = "outbox"

    def __init__(self, context: AgentContext) -> None:
        self._context = context
        self._events: deque[NodeEvent] = deque(maxlen=EVENT_OUTBOX_CAPACITY)
        self._filled = asyncio.Event()

    def raise_event(self, kind: EventKind, subject: str | None = None, detail: str = "") -> None:
        """Queue an event; it is published now if connected, else on the next connect."""
        if len(self._events) == self._events.maxlen:
            self._context.counters.events_dropped += 1
        self._events.append(
            NodeEvent(
                node_id=self._context.identity.node_id,
                event_id=uuid.uuid4().hex,
                kind=kind,
                subject=subject,
                detail=detail,
                occurred_at=self._context.wall_clock(),
            )
        )
        self._filled.set()

    async def run(self, client: aiomqtt.Client) -> None:
        while True:
            await self._filled.wait()
            self._filled.clear()
            await self._flush(client)

    async def goodbye(self, client: aiomqtt.Client) -> None:
        self.raise_event("agent-stopping")
        await self._flush(client)

    async def _flush(self, client: aiomqtt.Client) -> None:
        while self._events:
            # Publish before removing: an event leaves the outbox only once the broker has it.
            await self._context.publish(client, Channel.EVENTS, encode(self._events[0]))
            self._events.popleft()
