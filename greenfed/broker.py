"""The embedded MQTT broker (amqtt, MQTT 3.1.1) for single-machine use.

Production fleets use Mosquitto, EMQX or HiveMQ (deploy/mosquitto/); this exists
so `greenfed up` works on a laptop with nothing installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from types import TracebackType
from typing import Any

from amqtt.broker import Broker

from greenfed.ports import PortInUse, free_tcp_port, port_is_free

SHUTDOWN_TIMEOUT_S = 3.0


class BrokerPortInUse(PortInUse):
    pass


class _Amqtt(Broker):  # type: ignore[misc]
    """amqtt's broker with its retained-message replay fixed.

    On every connect, amqtt 0.12 replays the retained messages matching *every*
    subscription in the broker, other clients' included, to the new client, while
    iterating the live subscription dict across awaits ("dictionary changed size
    during iteration" when clients come and go). A client must only get retained
    messages for its own subscriptions; skipping the others also means no await
    happens inside that loop for a clean session.
    """

    async def _publish_retained_messages_for_subscription(
        self, subscription: tuple[str, int], session: Any
    ) -> None:
        subscribers = self._subscriptions.get(subscription[0], ())
        if any(subscriber is session for subscriber, _ in subscribers):
            await super()._publish_retained_messages_for_subscription(subscription, session)


class EmbeddedBroker:
    def __init__(
        self, host: str = "127.0.0.1", port: int = 1883, max_connections: int = -1
    ) -> None:
        """`port=0` picks a free port."""
        self.host = host
        self.port = port or free_tcp_port(host)
        self._config = {
            "listeners": {
                "default": {
                    "type": "tcp",
                    "bind": f"{host}:{self.port}",
                    "max_connections": max_connections,
                }
            },
            # Only anonymous auth: amqtt's default packet and $SYS plugins cost CPU per message.
            "plugins": {
                "amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}
            },
        }
        self._broker: _Amqtt | None = None

    @property
    def url(self) -> str:
        return f"mqtt://{self.host}:{self.port}"

    async def start(self) -> None:
        if not port_is_free(self.host, self.port):
            raise BrokerPortInUse(
                f"cannot start the embedded MQTT broker: {self.host}:{self.port} "
                "is in use (another broker? use --mqtt-url to connect to it instead)",
            )
        # amqtt logs every connection at INFO; keep only its warnings.
        logging.getLogger("amqtt").setLevel(logging.WARNING)
        self._broker = _Amqtt(self._config)
        await self._broker.start()

    async def stop(self) -> None:
        if self._broker is None:
            return
        broker, self._broker = self._broker, None
        # Messages still queued when the broker stops are dropped by design; amqtt warns
        # about each batch, which only alarms the person pressing Ctrl-C.
        logging.getLogger("amqtt").setLevel(logging.ERROR)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(SHUTDOWN_TIMEOUT_S):
                await broker.shutdown()

    async def __aenter__(self) -> EmbeddedBroker:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
