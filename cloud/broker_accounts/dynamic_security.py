"""Node accounts through the broker's dynamic-security control topic.

Mosquitto 2.0's `mosquitto_dynamic_security.so` and greenfed's embedded broker both
take JSON commands on `$CONTROL/dynamic-security/v1` and answer on `.../response`
(wire types in `dynsec_protocol.py`). This module holds one admin MQTT connection
(the control plane's own `[mqtt]` account, which the broker's bootstrap gave the
dynamic-security `admin` role), sends each change as one batch of commands, and waits
for the reply that carries the batch's correlation id. Every control-plane replica
subscribes to the same response topic, so replies to others are ignored by id.

Provisioning is idempotent: a node's role and client are created if missing, then
set to their wanted state (ACLs, role, client id, new password, enabled) whatever they
were, but only once the account of that name, if there is one, proved to be this fleet's
(`ownership.py`). Role names carry the topic root (`dynsec_protocol.role_for_root`),
so that fleets sharing a broker keep to their own.
"""

from __future__ import annotations

import asyncio
import secrets
import uuid

import aiomqtt
import msgspec
import structlog

from cloud.broker_accounts.accounts import (
    BrokerAccountError,
    BrokerAccounts,
    ForeignAccountError,
    InvalidAccountNameError,
    NodeCredentials,
)
from cloud.broker_accounts.dynsec_protocol import (
    ALREADY_EXISTS_ERRORS,
    COMMANDS_ENCODER,
    CONTROL_TOPIC,
    NOT_FOUND_CLIENT_ERROR,
    RESPONSE_TOPIC,
    RESPONSES_DECODER,
    Command,
    CommandBatch,
    Response,
    RoleRef,
    node_role_acls,
    reader_role_acls,
)
from cloud.broker_accounts.ownership import (
    OwnAccount,
    foreign_reason,
    own_node_account,
    own_reader_account,
)
from shared.errors import MSGSPEC_DECODE_ERRORS
from shared.mqtt import MqttSession, instance_client_id
from shared.settings import MqttSettings, parse_mqtt_url
from shared.tasks import cancel_and_wait
from shared.topics import Topics, is_valid_node_id

# Connecting (when not yet connected) plus the broker's answer, for one change.
DEFAULT_TIMEOUT_S = 10.0
# 32 random bytes, URL-safe: fine in a TOML file, a URL and a shell.
PASSWORD_BYTES = 32
# Below aiomqtt's warning threshold of 10 unacknowledged publishes per client.
MAX_BATCHES_IN_FLIGHT = 8

_log = structlog.get_logger("greenfed.broker_accounts")


class DynamicSecurityAccounts(BrokerAccounts):
    def __init__(self, settings: MqttSettings, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self._settings = settings
        self._topics = Topics(settings.topic_root)
        self._timeout_s = timeout_s
        self._session = MqttSession(
            settings, client_id=instance_client_id("greenfed-cloud-accounts"), logger=_log
        )
        self._client: aiomqtt.Client | None = None
        self._ready = asyncio.Event()
        self._connection: asyncio.Task[None] | None = None
        # Batches waiting for their reply, by correlation id.
        self._pending: dict[str, asyncio.Future[tuple[Response, ...]]] = {}
        # Command batches in flight to the broker at once: many enrolments together (a
        # fleet enrolling, `greenfed up` starting) queue here rather than piling up
        # unacknowledged publishes (aiomqtt warns past 10).
        self._in_flight = asyncio.Semaphore(MAX_BATCHES_IN_FLIGHT)

    async def _refuse_foreign_account(self, name: str, purpose: str, own: OwnAccount) -> None:
        """Raise `ForeignAccountError` unless the account `name` is missing or proves to
        be `own` (ownership.py): a join token must never reach another's account."""
        if name == self._username():
            raise ForeignAccountError(f"{purpose}: {name!r} is the control plane's account")
        (found,) = await self._run(
            purpose,
            (Command(command="getClient", username=name),),
            tolerated=frozenset({NOT_FOUND_CLIENT_ERROR}),
        )
        if found.data is None:
            return
        reason = foreign_reason(found.data.client, own)
        if reason is not None:
            raise ForeignAccountError(
                f"{purpose}: the broker's account {name!r} is not {own.whose} of topic root "
                f"{self._topics.root!r}: {reason}"
            )

    async def provision_reader(self, name: str) -> NodeCredentials:
        _check_node_id(name)
        purpose = f"provisioning reader {name!r}"
        own = own_reader_account(self._topics, name)
        await self._refuse_foreign_account(name, purpose, own)
        password = secrets.token_urlsafe(PASSWORD_BYTES)
        # This root's role: a reader made by a release that shared one role between
        # roots moves to it here (modifyClient), and the shared one is left alone.
        role_ref = (RoleRef(rolename=own.role),)
        acls = reader_role_acls(self._topics)
        # Bound to a client id of its own, as a node's account is: unbound, a reader
        # could log in with an agent's client id and so disconnect that agent.
        client_id = own.client_id
        await self._run(
            purpose,
            (
                Command(command="createRole", rolename=own.role, acls=acls),
                Command(command="modifyRole", rolename=own.role, acls=acls),
                Command(
                    command="createClient",
                    username=name,
                    password=password,
                    clientid=client_id,
                    roles=role_ref,
                ),
                Command(command="setClientPassword", username=name, password=password),
                # The client may exist from a release that bound no client id.
                Command(command="modifyClient", username=name, clientid=client_id, roles=role_ref),
                Command(command="enableClient", username=name),
            ),
            tolerated=ALREADY_EXISTS_ERRORS,
        )
        _log.info("broker reader account provisioned", username=name, client_id=client_id)
        return NodeCredentials(username=name, password=password, client_id=client_id)

    async def revoke_reader(self, name: str) -> None:
        _check_node_id(name)
        purpose = f"revoking reader {name!r}"
        await self._refuse_foreign_account(name, purpose, own_reader_account(self._topics, name))
        await self._run(
            purpose,
            (Command(command="disableClient", username=name),),
            tolerated=frozenset({NOT_FOUND_CLIENT_ERROR}),
        )
        _log.info("broker reader account disabled", username=name)

    async def provision(self, node_id: str) -> NodeCredentials:
        _check_node_id(node_id)
        purpose = f"provisioning node {node_id!r}"
        own = own_node_account(self._topics, node_id)
        await self._refuse_foreign_account(node_id, purpose, own)
        role = own.role
        password = secrets.token_urlsafe(PASSWORD_BYTES)
        role_ref = (RoleRef(rolename=role),)
        acls = node_role_acls(self._topics, node_id)
        # Only the node's agent's client id: no other account can log in with it and so
        # disconnect the agent (and publish its will).
        client_id = own.client_id
        await self._run(
            purpose,
            (
                Command(command="createRole", rolename=role, acls=acls),
                # The role may exist from an older release: set its ACLs.
                Command(command="modifyRole", rolename=role, acls=acls),
                Command(
                    command="createClient",
                    username=node_id,
                    password=password,
                    clientid=client_id,
                    roles=role_ref,
                ),
                Command(command="setClientPassword", username=node_id, password=password),
                # The client may exist from a release that bound no client id.
                Command(
                    command="modifyClient", username=node_id, clientid=client_id, roles=role_ref
                ),
                Command(command="enableClient", username=node_id),
            ),
            tolerated=ALREADY_EXISTS_ERRORS,
        )
        _log.info("broker account provisioned", node_id=node_id, role=role)
        return NodeCredentials(username=node_id, password=password, client_id=client_id)

    async def revoke(self, node_id: str) -> None:
        _check_node_id(node_id)
        purpose = f"revoking node {node_id!r}"
        await self._refuse_foreign_account(
            node_id, purpose, own_node_account(self._topics, node_id)
        )
        # The broker drops the node's connections at once and refuses its next login.
        await self._run(
            purpose,
            (Command(command="disableClient", username=node_id),),
            tolerated=frozenset({NOT_FOUND_CLIENT_ERROR}),
        )
        _log.info("broker account disabled", node_id=node_id)

    async def close(self) -> None:
        if self._connection is not None:
            connection, self._connection = self._connection, None
            # A refused login already reached the caller of provision/revoke as its error.
            await cancel_and_wait([connection])
            if connection.done() and not connection.cancelled():
                connection.exception()
        self._fail_pending("the control plane is shutting down")

    # -- one batch, one reply ----------------------------------------------------------

    async def _run(
        self, purpose: str, commands: tuple[Command, ...], *, tolerated: frozenset[str]
    ) -> tuple[Response, ...]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout_s
        client = await self._connected_client(purpose, deadline)
        correlation = uuid.uuid4().hex
        batch = CommandBatch(
            tuple(
                msgspec.structs.replace(command, correlation_data=f"{correlation}:{index}")
                for index, command in enumerate(commands)
            )
        )
        reply: asyncio.Future[tuple[Response, ...]] = loop.create_future()
        self._pending[correlation] = reply
        try:
            async with asyncio.timeout_at(deadline), self._in_flight:
                await client.publish(CONTROL_TOPIC, COMMANDS_ENCODER.encode(batch), qos=1)
                responses = await reply
        except TimeoutError:
            raise BrokerAccountError(
                f"{purpose}: the MQTT broker at {self._session.url} did not answer "
                f"{_names(commands)} on {CONTROL_TOPIC} within {self._timeout_s:g} s "
                "(is the dynamic security plugin loaded, and does the control plane's "
                f"account {self._username()!r} have its admin role?)"
            ) from None
        except aiomqtt.MqttError as error:
            raise BrokerAccountError(f"{purpose}: lost the MQTT broker: {error}") from error
        except BrokerAccountError as error:  # the connection dropped while we waited
            raise BrokerAccountError(f"{purpose}: {error}") from None
        finally:
            self._pending.pop(correlation, None)
        for command, response in zip(commands, responses, strict=False):
            if response.error is not None and response.error not in tolerated:
                raise BrokerAccountError(
                    f"{purpose}: the MQTT broker refused {command.command}: {response.error}"
                )
        if len(responses) != len(commands):
            raise BrokerAccountError(
                f"{purpose}: the MQTT broker answered {len(responses)} of {len(commands)} commands"
            )
        return responses

    async def _connected_client(self, purpose: str, deadline: float) -> aiomqtt.Client:
        if self._connection is None or self._connection.done():
            # After a refused login (or at first use): try again, the operator may have fixed it.
            self._connection = asyncio.create_task(
                self._session.run(self._serve), name="broker-accounts"
            )
        connection = self._connection
        ready = asyncio.ensure_future(self._ready.wait())
        try:
            loop = asyncio.get_running_loop()
            done, _ = await asyncio.wait(
                {ready, connection},
                timeout=max(0.0, deadline - loop.time()),
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            ready.cancel()
        if connection in done:
            error = connection.exception()
            raise BrokerAccountError(f"{purpose}: {error}") from error
        if self._client is None:
            raise BrokerAccountError(
                f"{purpose}: could not connect to the MQTT broker at {self._session.url} "
                f"within {self._timeout_s:g} s"
            )
        return self._client

    async def _serve(self, client: aiomqtt.Client) -> None:
        """One connection's life: subscribe to the replies, then route them by id."""
        try:
            await client.subscribe(RESPONSE_TOPIC, qos=1)
            self._client = client
            self._ready.set()
            async for message in client.messages:
                self._on_reply(message.payload)
        finally:
            self._client = None
            self._ready.clear()
            # A reply cannot arrive on a connection that is gone: fail now, not at the timeout.
            self._fail_pending("the connection to the MQTT broker was lost")

    def _on_reply(self, payload: object) -> None:
        if not isinstance(payload, bytes | bytearray):
            return
        try:
            batch = RESPONSES_DECODER.decode(payload)
        except MSGSPEC_DECODE_ERRORS:  # nested too deeply included: it would end _serve
            _log.warning("undecodable dynamic-security reply", bytes=len(payload))
            return
        if not batch.responses or batch.responses[0].correlation_data is None:
            return  # mosquitto_ctrl's, or another tool's: not ours
        correlation = batch.responses[0].correlation_data.partition(":")[0]
        reply = self._pending.get(correlation)
        if reply is not None and not reply.done():
            reply.set_result(batch.responses)

    def _fail_pending(self, reason: str) -> None:
        for reply in self._pending.values():
            if not reply.done():
                reply.set_exception(BrokerAccountError(reason))

    def _username(self) -> str | None:
        return self._settings.username or parse_mqtt_url(self._settings.url).username


def _check_node_id(node_id: str) -> None:
    # A wildcard or a slash in a username would become a wildcard in its ACLs.
    if not is_valid_node_id(node_id):
        raise InvalidAccountNameError(node_id)


def _names(commands: tuple[Command, ...]) -> str:
    return ", ".join(dict.fromkeys(command.command for command in commands))
