"""Where events and job-log chunks wait (the outbox) until the broker has them.

`raise_event` and `ship_log` may be called at any time, connected or not. Each
message is spooled first (edge/agent/spool.py: on disk under the agent's state
directory, else in memory), then published in the order spooled, and leaves the
spool only once the broker has acknowledged it (QoS 1). Messages wait out an outage
or an agent restart; past the spool's bounds (`agent.outbox_max_bytes`,
`agent.outbox_max_age_s`) the oldest are dropped and counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import aiomqtt

from edge.agent.context import AgentContext
from edge.agent.module import GOODBYE_TIMEOUT_S, AgentModule
from edge.agent.spool import Spool
from shared.messages import EventKind, JobLogChunk, NodeEvent, encode
from shared.topics import Channel


class Outbox(AgentModule):
    name = "outbox"

    def __init__(self, context: AgentContext, spool: Spool) -> None:
        self._context = context
        self._spool = spool
        # Set when the spool may hold something the connection has not sent yet.
        self._filled = asyncio.Event()
        self._said_goodbye = False

    def raise_event(self, kind: EventKind, subject: str | None = None, detail: str = "") -> None:
        """Queue an event; it is published now if connected, else once connected."""
        event = NodeEvent(
            node_id=self._context.identity.node_id,
            event_id=uuid.uuid4().hex,
            kind=kind,
            subject=subject,
            detail=detail,
            occurred_at=self._context.wall_clock(),
        )
        self._append(Channel.EVENTS, encode(event))

    def ship_log(self, chunk: JobLogChunk) -> None:
        self._append(Channel.LOGS, encode(chunk))

    @property
    def pending_bytes(self) -> int:
        return self._spool.pending_bytes

    def _append(self, channel: Channel, payload: bytes) -> None:
        self._spool.append(channel, payload)
        self._context.counters.outbox_dropped = self._spool.dropped
        self._filled.set()

    async def on_connect(self, client: aiomqtt.Client) -> None:
        # What is spooled goes out on every new connection: what a previous agent left,
        # and what was in flight (never acknowledged) when the last connection dropped.
        self._filled.set()

    async def run(self, client: aiomqtt.Client) -> None:
        while True:
            await self._filled.wait()
            self._filled.clear()
            await self._flush(client)

    async def goodbye(self, client: aiomqtt.Client) -> None:
        self._said_goodbye = True
        self.raise_event("agent-stopping")
        # What is left stays spooled for the next start: the birth's own goodbye (after
        # this one) must get its share of the time, or the node would look crashed.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(GOODBYE_TIMEOUT_S / 2):
                await self._flush(client)

    async def stop(self) -> None:
        if not self._said_goodbye:  # stopped while the broker was unreachable
            self.raise_event("agent-stopping", detail="stopped while the broker was unreachable")
        self._spool.save()

    async def _flush(self, client: aiomqtt.Client) -> None:
        spool, counters = self._spool, self._context.counters
        try:
            while (record := spool.peek()) is not None:
                # Publish before taking: a record leaves the spool once the broker has it.
                await self._context.publish(client, record.channel, record.payload)
                spool.take(record)
                counters.outbox_sent += 1
        finally:
            spool.save()
            counters.outbox_expired = spool.expired
