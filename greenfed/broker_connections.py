"""Clients' connections to the embedded broker (amqtt 0.12): what amqtt leaves out.

- Keep-alive: amqtt times a read out after a client's keep-alive and then does nothing,
  so a silent (half-open) client stayed connected for ever and its will never went out.
- A bound on what waits for one client: amqtt starts a task per message per subscriber,
  each holding its message until the client has read it, so a subscriber that stopped
  reading made the broker (in the control plane's process) grow without limit. As
  Mosquitto's `max_queued_messages` (deploy/mosquitto/), QoS 0 messages past the bound
  are dropped and counted; QoS 1 ones are still sent. And amqtt's list of those tasks
  kept every finished one behind one stuck on such a client (`DeliveryTasks`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import structlog
from amqtt.errors import AMQTTError, ProtocolHandlerError
from amqtt.mqtt.constants import QOS_0
from amqtt.mqtt.protocol.broker_handler import BrokerProtocolHandler
from amqtt.session import OutgoingApplicationMessage

# What deploy/mosquitto/*.conf sets for Mosquitto.
MAX_QUEUED_MESSAGES = 10_000

_log = structlog.get_logger("greenfed.broker")

# How a delivery fails when its client has gone (amqtt turns a cancelled write into
# ProtocolHandlerError) or does not acknowledge in time.
_CLIENT_GONE = (ProtocolHandlerError, AMQTTError, OSError, TimeoutError)


def abort_connection(handler: Any) -> None:
    """Close a client's TCP connection at once (amqtt's stream adapter; others are left to
    amqtt)."""
    stream = getattr(getattr(handler, "writer", None), "_writer", None)
    transport = getattr(stream, "transport", None)
    if transport is not None and not transport.is_closing():
        transport.abort()


@dataclass(slots=True)
class DeliveryLimit:
    """The most deliveries one client may have waiting, and how many messages went past it
    (all clients of a broker together)."""

    max_queued_messages: int = MAX_QUEUED_MESSAGES
    dropped_messages: int = 0


class ClientConnection(BrokerProtocolHandler):  # type: ignore[misc]
    """amqtt's handler of one client's connection, with keep-alive enforced and the
    deliveries waiting for the client bounded."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Replaced, once the CONNECT is read, by the broker's, which its connections share.
        self.delivery_limit = DeliveryLimit()
        self._waiting_deliveries = 0
        self._dropping_reported = False

    def handle_read_timeout(self) -> None:
        # Nothing came for `session.keep_alive` seconds (the broker makes that 1.5 keep-alive
        # periods). Ending the input ends amqtt's reader loop as a closed socket does, and
        # its disconnect path then publishes the will: the client sent no DISCONNECT.
        abort_connection(self)
        if self.reader is not None:
            self.reader.feed_eof()

    async def mqtt_publish(
        self,
        topic: str,
        data: bytes | bytearray,
        qos: int | None,
        retain: bool,
        ack_timeout: int | None = None,
    ) -> OutgoingApplicationMessage:
        limit = self.delivery_limit
        # A client that does not keep up loses QoS 0 messages; the broker does not hold them.
        if qos == QOS_0 and self._waiting_deliveries >= limit.max_queued_messages:
            limit.dropped_messages += 1
            if not self._dropping_reported:
                self._dropping_reported = True
                _log.warning(
                    "embedded broker drops QoS 0 messages to a client that does not keep up",
                    client_id=getattr(self.session, "client_id", None),
                    max_queued_messages=limit.max_queued_messages,
                )
            return OutgoingApplicationMessage(None, topic, qos, data, retain)
        self._waiting_deliveries += 1
        try:
            return await super().mqtt_publish(topic, data, qos, retain, ack_timeout)
        finally:
            self._waiting_deliveries -= 1


class DeliveryTasks:
    """Where amqtt's broadcast loop keeps the delivery tasks it starts. amqtt's deque lets a
    finished task go only from its front, so one delivery stuck behind a client that does
    not read kept every later delivery, to every client, message included, for as long as
    that client stayed. Here a task leaves as soon as it finishes.

    Only what amqtt's loop uses: append, len, [0], popleft, iteration."""

    def __init__(self) -> None:
        # A dict for its order (oldest first) and O(1) removal.
        self._running: dict[asyncio.Task[Any], None] = {}

    def append(self, task: asyncio.Task[Any]) -> None:
        self._running[task] = None
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[Any]) -> None:
        if task not in self._running:
            return  # amqtt's loop took it from the front, and read its outcome
        del self._running[task]
        error = None if task.cancelled() else task.exception()
        # A delivery fails when its client goes away or stops acknowledging, which amqtt's
        # disconnect path handles (thousands at once, for a client that stopped reading).
        if error is not None and not isinstance(error, _CLIENT_GONE):
            _log.warning("a delivery to a client failed", error=repr(error))

    def popleft(self) -> asyncio.Task[Any]:
        task = self[0]
        del self._running[task]
        return task

    def __getitem__(self, index: int) -> asyncio.Task[Any]:
        if index == 0:
            for task in self._running:
                return task
        raise IndexError(index)

    def __len__(self) -> int:
        return len(self._running)

    def __iter__(self) -> Iterator[asyncio.Task[Any]]:
        return iter(list(self._running))
