"""The embedded MQTT broker (amqtt, MQTT 3.1.1) for single-machine use.

Production fleets use Mosquitto, EMQX or HiveMQ (deploy/mosquitto/); this exists
so `greenfed up` works on a laptop with nothing installed.

With `accounts_file` (what `greenfed up` uses) it requires a login and enforces
per-node ACLs, and speaks the dynamic-security control API of Mosquitto
(greenfed/embedded_accounts.py). Without it, it is anonymous: in-process tests only.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import math
from pathlib import Path
from types import TracebackType
from typing import Any

import structlog
from amqtt.broker import Broker
from amqtt.contexts import Action
from amqtt.errors import AMQTTError, MQTTError, NoDataError
from amqtt.mqtt.disconnect import DisconnectPacket
from amqtt.utils import gen_client_id

from cloud.broker_accounts.dynsec_protocol import CONTROL_TOPIC, RESPONSE_TOPIC
from greenfed.broker_connections import (
    MAX_QUEUED_MESSAGES,
    ClientConnection,
    DeliveryLimit,
    DeliveryTasks,
    abort_connection,
)
from greenfed.embedded_accounts import AccountsAuthPlugin, EmbeddedAccounts
from greenfed.ports import PortInUse, free_tcp_port, port_is_free

SHUTDOWN_TIMEOUT_S = 3.0
# The control plane's account on an embedded broker with accounts.
DEFAULT_ADMIN_USERNAME = "greenfed-cloud"

_log = structlog.get_logger("greenfed.broker")


class BrokerPortInUse(PortInUse):
    pass


# The QoS of the publish being handled (a client's, in its connection's task).
_publish_qos: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "greenfed_publish_qos", default=None
)


def _is_publish_topic(topic: str | None) -> bool:
    """The rules amqtt applies to a PUBLISH's topic before the ACLs: not empty, no
    wildcard, no `$` topic (those are the broker's own)."""
    if not topic:
        return False
    return "+" not in topic and "#" not in topic and not topic.startswith("$")


class _Amqtt(Broker):  # type: ignore[misc]
    """amqtt's broker with its retained-message replay fixed, our ACLs, and the
    dynamic-security control topic.

    On every connect, amqtt 0.12 replays the retained messages matching *every*
    subscription in the broker, other clients' included, to the new client, while
    iterating the live subscription dict across awaits ("dictionary changed size
    during iteration" when clients come and go). A client must only get retained
    messages for its own subscriptions; skipping the others also means no await
    happens inside that loop for a clean session.

    Topic checks run for every publish, every will and every delivery. amqtt's plugin manager
    would spawn a task and a gather per check; `_topic_filtering` asks the accounts
    table directly instead (a cached dictionary lookup).

    Each connection is a `ClientConnection` (keep-alive, a bound on what waits for one
    client), and a new connection with a client id ends the old one.
    """

    def __init__(
        self,
        config: dict[str, Any],
        accounts: EmbeddedAccounts | None,
        delivery_limit: DeliveryLimit,
    ) -> None:
        super().__init__(config)
        self._accounts = accounts
        self._delivery_limit = delivery_limit
        # amqtt's own keeps every finished delivery behind one stuck on a slow client.
        self._tasks_queue = DeliveryTasks()

    async def shutdown(self) -> None:
        """amqtt's shutdown drops each client's connection, then stops listening: a client
        that reconnects in between (the control plane's session retries within 30 ms)
        stays connected to a broker that no longer routes anything, and never learns it
        stopped; and dropping a connection first drains what is queued to it, which waits
        for ever on a client that does not read. So: stop listening first, then let amqtt
        shut down, then abort every connection still open (those made meanwhile too)."""
        for server in self._servers.values():
            if server.instance is not None:
                server.instance.close()
        handlers = [handler for _, handler in self._sessions.values()]
        try:
            await super().shutdown()
        finally:
            for handler in (*handlers, *(h for _, h in self._sessions.values())):
                abort_connection(handler)

    async def _initialize_client_session(
        self, reader: Any, writer: Any, remote_address: str, remote_port: int
    ) -> tuple[Any, Any]:
        """amqtt 0.12's own, but with accounts the login is checked as soon as the CONNECT
        is read. amqtt acts on a CONNECT before it checks the login: a clean session
        deleted the live session of the same client id (an agent stopped getting its
        `desired` documents, still connected), a persistent one took over the live
        session's username and will, and either took the connection over, whoever sent
        it, refused or anonymous. A refused login now touches no session."""
        try:
            handler, session = await ClientConnection.init_from_connect(
                reader, writer, self.plugins_manager
            )
        except AMQTTError as error:
            raise AMQTTError(error) from error
        except MQTTError as error:
            await writer.close()
            raise MQTTError(error) from error
        except NoDataError as error:
            raise AMQTTError(error) from error
        if self._accounts is not None and not await self._accounts.authenticate(
            session.username, session.password, session.client_id
        ):
            _log.warning("embedded broker refused a login", username=session.username)
            handler.attach(session, reader, writer)
            with contextlib.suppress(MQTTError, ConnectionError):
                await handler.mqtt_connack_authorize(False)
            await writer.close()
            raise MQTTError("not authorized")
        handler.delivery_limit = self._delivery_limit
        if session.clean_session:
            if session.client_id:
                await self._end_connection_taken_over(session.client_id)
                await self._delete_session(session.client_id)
            else:
                session.client_id = gen_client_id()
            session.parent = 0
        elif session.client_id in self._sessions:
            # A new connection brings its own will, keep-alive and credentials.
            existing, _ = self._sessions[session.client_id]
            existing.will_flag = session.will_flag
            existing.will_message = session.will_message
            existing.will_topic = session.will_topic
            existing.will_qos = session.will_qos
            existing.keep_alive = session.keep_alive
            existing.username = session.username
            existing.password = session.password
            session = existing
            session.parent = 1
        else:
            session.parent = 0
        # amqtt's reader waits `keep_alive` seconds for each packet; MQTT 3.1.1 (3.1.2.10)
        # drops a client after one and a half keep-alive periods of silence, not one.
        if session.keep_alive > 0:
            session.keep_alive = math.ceil(session.keep_alive * 1.5)
        return handler, session

    async def _end_connection_taken_over(self, client_id: str) -> None:
        """A client id has one connection. amqtt deleted the live session of a clean-session
        CONNECT's client id but left its connection open, still publishing, and published
        its will whenever that connection ended: after the new connection's birth, so a
        connected node looked offline. As Mosquitto does: the old connection's will now (it
        ended without DISCONNECT), before the new CONNACK and so before the new birth; then
        the old connection is closed."""
        previous = self._sessions.get(client_id)
        if previous is None:
            return
        session, handler = previous
        if not session.transitions.is_connected():
            return
        await self._publish_will(session)
        abort_connection(handler)
        await handler.stop()

    async def _handle_disconnect(
        self, client_session: Any, handler: Any, disconnect_waiter: asyncio.Future[Any]
    ) -> None:
        # amqtt's own publishes the will of a connection that ended without DISCONNECT
        # unchecked: send it here, checked, and leave amqtt none to send.
        if not isinstance(disconnect_waiter.result(), DisconnectPacket):
            await self._publish_will(client_session)
        await super()._handle_disconnect(client_session, handler, disconnect_waiter)

    async def _publish_will(self, session: Any) -> None:
        """Every will goes out here, at most once, and only where its client may publish:
        the ACLs a PUBLISH gets. Unchecked, any account (a node's, a reader's) could
        register a retained will on another node's status or desired topic and drop its
        connection, or connect again with its client id to end the old one at once: a
        publish anywhere. As Mosquitto 2.0 does (context__send_will): the CONNECT is
        accepted and the will checked when it is due, so rights changed since count."""
        if not session.will_flag:
            return
        session.will_flag = False
        topic, message, qos = session.will_topic, session.will_message, session.will_qos
        if not _is_publish_topic(topic) or not await self._topic_filtering(
            session, topic, Action.PUBLISH
        ):
            _log.warning(
                "embedded broker dropped a will its client may not publish",
                username=session.username,
                topic=topic,
            )
            return
        await self._broadcast_message(session, topic, message, qos)
        if session.will_retain:
            await self.retain_message(session, topic, message, qos)

    async def _topic_filtering(self, session: Any, topic: str, action: Action) -> bool:
        if self._accounts is None:
            return True
        return self._accounts.allows(session.username, topic, action)

    async def _handle_message_delivery(
        self, client_session: Any, handler: Any, wait_deliver: asyncio.Future[Any]
    ) -> bool:
        message = wait_deliver.result()
        # amqtt refuses (and disconnects) any publish to a `$` topic: answer ours first.
        if self._accounts is not None and message is not None and message.topic == CONTROL_TOPIC:
            await self._control(client_session, message.data)
            return True
        # amqtt forwards a publish at each subscription's QoS, forgetting the publisher's:
        # MQTT delivers at the lower of the two. Its broadcast is queued from within the
        # call below (this task), where `_broadcast_message` reads what it was sent at.
        _publish_qos.set(getattr(message, "qos", None))
        try:
            return bool(
                await super()._handle_message_delivery(client_session, handler, wait_deliver)
            )
        finally:
            _publish_qos.set(None)

    async def _broadcast_message(
        self,
        session: Any,
        topic: str | None,
        data: bytes | bytearray | None,
        force_qos: int | None = None,
    ) -> None:
        # A QoS 0 publish goes out at QoS 0 to every subscriber (the lower of the two);
        # QoS 1 goes out at each subscription's (0 or 1: greenfed's brokers grant no 2).
        if force_qos is None and session is not None and _publish_qos.get() == 0:
            force_qos = 0
        await super()._broadcast_message(session, topic, data, force_qos)

    async def _control(self, session: Any, payload: bytes | bytearray | None) -> None:
        assert self._accounts is not None
        if session.username != self._accounts.admin_username:
            # As Mosquitto does for a client without the admin role: no answer at all.
            _log.warning("dynamic-security command refused", username=session.username)
            return
        outcome = await self._accounts.handle_commands(payload or b"")
        await self._broadcast_message(None, RESPONSE_TOPIC, outcome.reply)
        for username in outcome.disabled_usernames:
            await self._disconnect_user(username)

    async def _disconnect_user(self, username: str) -> None:
        """Drop every connection of a disabled account, as Mosquitto does."""
        for session, handler in list(self._sessions.values()):
            if session.username == username and session.transitions.is_connected():
                await handler.handle_connection_closed()

    async def _publish_retained_messages_for_subscription(
        self, subscription: tuple[str, int], session: Any
    ) -> None:
        subscribers = self._subscriptions.get(subscription[0], ())
        if any(subscriber is session for subscriber, _ in subscribers):
            await super()._publish_retained_messages_for_subscription(subscription, session)


class EmbeddedBroker:
    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 1883,
        max_connections: int = -1,
        *,
        accounts_file: Path | None = None,
        admin_username: str = DEFAULT_ADMIN_USERNAME,
        admin_password: str | None = None,
        max_queued_messages: int = MAX_QUEUED_MESSAGES,
    ) -> None:
        """`port=0` picks a free port. With `accounts_file` every client must log in;
        `admin_username`/`admin_password` is the control plane's account, which may do
        everything (`admin_password` is required then). A client that does not keep up
        has at most `max_queued_messages` waiting for it; QoS 0 ones past that are
        dropped (`dropped_messages`)."""
        self.host = host
        self.port = port or free_tcp_port(host)
        self.accounts: EmbeddedAccounts | None = None
        self._accounts_file = accounts_file
        self._admin = (admin_username, admin_password)
        self._delivery_limit = DeliveryLimit(max_queued_messages)
        if accounts_file is not None and not admin_password:
            raise ValueError("an embedded broker with accounts needs an admin_password")
        self._config: dict[str, Any] = {
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

    @property
    def dropped_messages(self) -> int:
        """QoS 0 messages not delivered to a client that did not keep up, since creation."""
        return self._delivery_limit.dropped_messages

    async def start(self) -> None:
        if not port_is_free(self.host, self.port):
            raise BrokerPortInUse(
                f"cannot start the embedded MQTT broker: {self.host}:{self.port} "
                "is in use (another broker? use --mqtt-url to connect to it instead)",
            )
        # amqtt logs every connection at INFO; keep only its warnings.
        logging.getLogger("amqtt").setLevel(logging.WARNING)
        config = self._config
        if self._accounts_file is not None:
            username, password = self._admin
            assert password is not None
            # Read again at every start: a restarted broker keeps every node's account.
            self.accounts = EmbeddedAccounts(
                self._accounts_file, admin_username=username, admin_password=password
            )
            plugin = f"{AccountsAuthPlugin.__module__}.{AccountsAuthPlugin.__qualname__}"
            config = {**config, "plugins": {plugin: {"accounts": self.accounts}}}
        self._broker = _Amqtt(config, self.accounts, self._delivery_limit)
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
