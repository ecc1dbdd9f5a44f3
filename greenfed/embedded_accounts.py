"""Accounts, ACLs and the dynamic-security control topic of the embedded broker.

`greenfed up` runs an amqtt broker that must not be anonymous: any local process could
otherwise publish a node's `desired`. This module gives it what Mosquitto's dynamic
security plugin gives a production broker, with the same wire API, so the control plane
provisions nodes through one code path (cloud/broker_accounts/dynamic_security.py):

- accounts: username -> (salted password hash, enabled, roles, the one client id it may
  connect with if bound), kept in a JSON file (mode 0600) in the data directory, so a
  restarted broker keeps every node's account;
- roles: ordered ACLs evaluated as Mosquitto does (roles and ACLs by priority, first
  matching ACL decides, else the default: send no, receive yes, subscribe no);
- the broker's own admin account (the control plane's `[mqtt]` username) may do
  everything, and only it may send commands on `$CONTROL/dynamic-security/v1`.

Passwords are 256-bit random tokens made by the control plane, so a fast salted hash
(PBKDF2-SHA256) is enough to keep a read of the file from yielding a login; the
verification still runs off the event loop.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import structlog
from amqtt.contexts import Action
from amqtt.plugins.base import BaseAuthPlugin
from amqtt.session import Session

from cloud.broker_accounts.dynsec_protocol import (
    COMMANDS_DECODER,
    SUPPORTED_COMMANDS,
    Acl,
    ClientData,
    ClientInfo,
    Command,
    Response,
    ResponseBatch,
    RoleRef,
)
from shared.secret_hashes import hash_secret, verify_secret
from shared.token_files import write_secret

# ACL decisions remembered per (username, topic, action); forgotten on any change.
MAX_CACHED_DECISIONS = 100_000
# A batch longer than this is refused whole: commands come from one control plane.
MAX_COMMANDS_PER_BATCH = 100

_log = structlog.get_logger("greenfed.broker")
_RESPONSES_ENCODER = msgspec.json.Encoder()


class Account(msgspec.Struct, kw_only=True):
    password_hash: str
    enabled: bool = True
    roles: list[RoleRef] = msgspec.field(default_factory=list)
    # As Mosquitto's: set, a login with any other client id is refused.
    clientid: str | None = None


class Role(msgspec.Struct, kw_only=True):
    acls: list[Acl] = msgspec.field(default_factory=list)


class AccountsDocument(msgspec.Struct, kw_only=True):
    """The accounts file."""

    clients: dict[str, Account] = msgspec.field(default_factory=dict)
    roles: dict[str, Role] = msgspec.field(default_factory=dict)


_DOCUMENT_ENCODER = msgspec.json.Encoder()
_DOCUMENT_DECODER = msgspec.json.Decoder(AccountsDocument)


def topic_matches(topic_filter: str, topic: str) -> bool:
    """MQTT matching: `+` one level, `#` the rest; `$` topics only by a literal first level."""
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    filter_levels = topic_filter.split("/")
    topic_levels = topic.split("/")
    for index, level in enumerate(filter_levels):
        if level == "#":
            return True
        if index >= len(topic_levels) or (level != "+" and level != topic_levels[index]):
            return False
    return len(filter_levels) == len(topic_levels)


def filter_covers(pattern: str, topic_filter: str) -> bool:
    """Whether every topic `topic_filter` subscribes to is within `pattern`: a `+` in the
    filter needs `+` or `#` in the pattern there, a `#` needs `#`."""
    pattern_levels = pattern.split("/")
    filter_levels = topic_filter.split("/")
    for index, level in enumerate(pattern_levels):
        if level == "#":
            return True
        if index >= len(filter_levels):
            return False
        wanted = filter_levels[index]
        if wanted == "#" or (wanted == "+" and level != "+"):
            return False
        if level not in ("+", wanted):
            return False
    return len(pattern_levels) == len(filter_levels)


@dataclass(slots=True)
class CommandOutcome:
    """What one command batch did: the reply to publish, whose connections to drop."""

    reply: bytes
    disabled_usernames: list[str] = field(default_factory=list)
    changed: bool = False


class EmbeddedAccounts:
    """The broker's accounts table; `path` None keeps it in memory only (tests)."""

    def __init__(self, path: Path | None, *, admin_username: str, admin_password: str) -> None:
        self.path = path
        self.admin_username = admin_username
        self._admin_hash = hash_secret(admin_password)
        self._document = self._load()
        # The admin is not one of the document's clients: it is whoever started the broker.
        self._document.clients.pop(admin_username, None)
        self._decisions: dict[tuple[str, str, Action], bool] = {}

    def _load(self) -> AccountsDocument:
        if self.path is None or not self.path.exists():
            return AccountsDocument()
        try:
            return _DOCUMENT_DECODER.decode(self.path.read_bytes())
        except (msgspec.DecodeError, OSError) as error:
            raise RuntimeError(
                f"cannot read the embedded broker's accounts file {self.path}: {error} "
                "(move it away to start with no node accounts)"
            ) from error

    def save(self) -> None:
        """Write the file atomically, readable by this user only. Blocking: callers
        encode on the event loop (`_encoded`) and write off it."""
        self._write(self._encoded())

    def _encoded(self) -> str:
        return _DOCUMENT_ENCODER.encode(self._document).decode()

    def _write(self, document: str) -> None:
        if self.path is not None:
            write_secret(self.path, document)

    # -- who may connect -----------------------------------------------------------

    async def authenticate(
        self, username: str | None, password: str | None, client_id: str | None = None
    ) -> bool:
        if not username or password is None:
            return False
        if username == self.admin_username:
            stored = self._admin_hash
        else:
            account = self._document.clients.get(username)
            if account is None or not account.enabled:
                return False
            if account.clientid is not None and client_id != account.clientid:
                return False
            stored = account.password_hash
        return await asyncio.to_thread(verify_secret, password, stored)

    # -- what a connected client may do (runs per message: cached) -------------------

    def allows(self, username: str | None, topic: str, action: Action) -> bool:
        if username == self.admin_username:
            return True
        if username is None:
            return False
        key = (username, topic, action)
        decision = self._decisions.get(key)
        if decision is None:
            decision = self._decide(username, topic, action)
            if len(self._decisions) >= MAX_CACHED_DECISIONS:
                self._decisions.clear()
            self._decisions[key] = decision
        return decision

    def _decide(self, username: str, topic: str, action: Action) -> bool:
        account = self._document.clients.get(username)
        if account is None or not account.enabled:
            return False
        for role_ref in sorted(account.roles, key=lambda ref: -ref.priority):
            role = self._document.roles.get(role_ref.rolename)
            if role is None:
                continue
            for acl in sorted(role.acls, key=lambda acl: -acl.priority):
                if _acl_applies(acl, topic, action):
                    return acl.allow
        # Mosquitto's defaults: send and subscribe denied, receive allowed.
        return action is Action.RECEIVE

    # -- the $CONTROL/dynamic-security/v1 commands -----------------------------------

    async def handle_commands(self, payload: bytes | bytearray) -> CommandOutcome:
        """Apply one batch from the admin, in order, as Mosquitto does: each command
        succeeds or fails on its own, and the reply lists every result."""
        try:
            batch = COMMANDS_DECODER.decode(payload)
        except msgspec.DecodeError as invalid:
            reply = Response(command="unknown", error=f"Invalid JSON: {invalid}")
            return CommandOutcome(reply=_RESPONSES_ENCODER.encode(ResponseBatch((reply,))))
        if len(batch.commands) > MAX_COMMANDS_PER_BATCH:
            reply = Response(command="unknown", error="Too many commands")
            return CommandOutcome(reply=_RESPONSES_ENCODER.encode(ResponseBatch((reply,))))
        outcome = CommandOutcome(reply=b"")
        responses: list[Response] = []
        for command in batch.commands:
            # Hashing is the slow part; do it before touching the table.
            password_hash = (
                await asyncio.to_thread(hash_secret, command.password)
                if command.password is not None
                else None
            )
            refusal, data = self._apply(command, password_hash, outcome)
            responses.append(
                Response(
                    command=command.command,
                    error=refusal,
                    data=data,
                    correlation_data=command.correlation_data,
                )
            )
        if outcome.changed:
            self._decisions.clear()
            # Encoded here, on the loop: the document may change while the thread writes.
            await asyncio.to_thread(self._write, self._encoded())
        outcome.reply = _RESPONSES_ENCODER.encode(ResponseBatch(tuple(responses)))
        return outcome

    def _apply(
        self, command: Command, password_hash: str | None, outcome: CommandOutcome
    ) -> tuple[str | None, ClientData | None]:
        """One command; returns (Mosquitto's error text or None, getClient's data)."""
        clients, roles = self._document.clients, self._document.roles
        name = command.command
        if name not in SUPPORTED_COMMANDS:
            return "Unknown command", None
        if command.username == self.admin_username:
            return "The broker's admin account cannot be changed", None
        if name.endswith("Role") and name != "addClientRole" and name != "removeClientRole":
            rolename = command.rolename
            if not rolename:
                return "Invalid/missing rolename", None
            if name == "createRole":
                if rolename in roles:
                    return "Role already exists", None
                roles[rolename] = Role(acls=list(command.acls or ()))
            elif rolename not in roles:
                return "Role not found", None
            elif name == "modifyRole":
                if command.acls is not None:
                    roles[rolename].acls = list(command.acls)
            elif name == "deleteRole":
                del roles[rolename]
            outcome.changed = True
            return None, None
        if name == "addRoleACL":
            role = roles.get(command.rolename or "")
            if role is None:
                return "Role not found", None
            if command.acltype is None or command.topic is None or command.allow is None:
                return "Invalid/missing acltype, topic or allow", None
            role.acls.append(
                Acl(
                    acltype=command.acltype,
                    topic=command.topic,
                    allow=command.allow,
                    priority=command.priority or 0,
                )
            )
            outcome.changed = True
            return None, None
        username = command.username
        if not username:
            return "Invalid/missing username", None
        if name == "createClient":
            if username in clients:
                return "Client already exists", None
            if password_hash is None:
                return "Invalid/missing password", None
            missing = [ref.rolename for ref in command.roles or () if ref.rolename not in roles]
            if missing:
                return "Role not found", None
            clients[username] = Account(
                password_hash=password_hash,
                roles=list(command.roles or ()),
                clientid=command.clientid or None,
            )
            outcome.changed = True
            return None, None
        account = clients.get(username)
        if account is None:
            return "Client not found", None
        if name == "getClient":
            info = ClientInfo(
                username=username,
                clientid=account.clientid,
                roles=tuple(account.roles),
                disabled=not account.enabled,
            )
            return None, ClientData(client=info)
        if name == "setClientPassword":
            if password_hash is None:
                return "Invalid/missing password", None
            account.password_hash = password_hash
        elif name == "modifyClient":
            if password_hash is not None:
                account.password_hash = password_hash
            if command.roles is not None:
                if any(ref.rolename not in roles for ref in command.roles):
                    return "Role not found", None
                account.roles = list(command.roles)
            if command.clientid is not None:  # "": no longer bound
                account.clientid = command.clientid or None
        elif name == "addClientRole":
            if (command.rolename or "") not in roles:
                return "Role not found", None
            if all(ref.rolename != command.rolename for ref in account.roles):
                account.roles.append(RoleRef(rolename=command.rolename or ""))
        elif name == "removeClientRole":
            account.roles = [ref for ref in account.roles if ref.rolename != command.rolename]
        elif name == "enableClient":
            account.enabled = True
        elif name in ("disableClient", "deleteClient"):
            account.enabled = False
            outcome.disabled_usernames.append(username)
            if name == "deleteClient":
                del clients[username]
        outcome.changed = True
        return None, None


def _acl_applies(acl: Acl, topic: str, action: Action) -> bool:
    if action == Action.PUBLISH:
        return acl.acltype == "publishClientSend" and topic_matches(acl.topic, topic)
    if action == Action.RECEIVE:
        return acl.acltype == "publishClientReceive" and topic_matches(acl.topic, topic)
    if acl.acltype == "subscribeLiteral":
        return acl.topic == topic
    return acl.acltype == "subscribePattern" and filter_covers(acl.topic, topic)


class AccountsAuthPlugin(BaseAuthPlugin):  # type: ignore[misc]
    """amqtt's authentication hook: a login needs an enabled account, its password and,
    where the account is bound to one, its client id.
    (Topic checks bypass amqtt's plugin manager: see `greenfed.broker._Amqtt`.)"""

    @dataclass
    class Config:
        accounts: Any = None

    async def authenticate(self, *, session: Session) -> bool | None:
        accounts: EmbeddedAccounts = self.config.accounts
        allowed: bool = await accounts.authenticate(
            session.username, session.password, session.client_id
        )
        if not allowed:
            _log.warning("embedded broker refused a login", username=session.username)
        return allowed
