"""The subset of Mosquitto's dynamic-security control API that greenfed speaks.

The control plane publishes a `CommandBatch` as JSON to `CONTROL_TOPIC`; the broker
answers with a `ResponseBatch` on `RESPONSE_TOPIC`, one response per command, in
order, each echoing the command's `correlationData`. Mosquitto's plugin
(plugins/dynamic-security/README.md in eclipse/mosquitto) and the embedded broker
(greenfed/embedded_accounts.py) both read these types, so the control plane has one
code path for either broker.

What a node's role allows is decided here (`node_role_acls`), once for both brokers.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from shared.topics import CHANNEL_SPECS, DEFAULT_TOPIC_ROOT, Channel, Topics

CONTROL_TOPIC = "$CONTROL/dynamic-security/v1"
RESPONSE_TOPIC = f"{CONTROL_TOPIC}/response"

AclType = Literal[
    "publishClientSend",
    "publishClientReceive",
    "subscribeLiteral",
    "subscribePattern",
    "unsubscribeLiteral",
    "unsubscribePattern",
]

# The commands the embedded broker implements; Mosquitto knows many more.
SUPPORTED_COMMANDS = frozenset(
    {
        "createClient",
        "deleteClient",
        "setClientPassword",
        "enableClient",
        "disableClient",
        "modifyClient",
        "addClientRole",
        "removeClientRole",
        "getClient",
        "createRole",
        "modifyRole",
        "deleteRole",
        "addRoleACL",
    }
)

# Mosquitto's answers that mean "it is there already": re-provisioning tolerates them.
ALREADY_EXISTS_ERRORS = frozenset({"Client already exists", "Role already exists"})
NOT_FOUND_CLIENT_ERROR = "Client not found"
NOT_FOUND_ROLE_ERROR = "Role not found"


class Acl(msgspec.Struct, frozen=True, omit_defaults=True):
    acltype: AclType
    topic: str
    allow: bool
    # Higher first, as in Mosquitto.
    priority: int = 0


class RoleRef(msgspec.Struct, frozen=True, omit_defaults=True):
    rolename: str
    priority: int = -1


class Command(
    msgspec.Struct,
    frozen=True,
    omit_defaults=True,
    rename={"correlation_data": "correlationData"},
):
    """One command; which fields it needs depends on `command` (see the README above)."""

    command: str
    username: str | None = None
    password: str | None = None
    # createClient, modifyClient: the only client id the account may connect with
    # ("" in modifyClient: any).
    clientid: str | None = None
    rolename: str | None = None
    roles: tuple[RoleRef, ...] | None = None
    acls: tuple[Acl, ...] | None = None
    # addRoleACL carries one ACL inline.
    acltype: AclType | None = None
    topic: str | None = None
    allow: bool | None = None
    priority: int | None = None
    correlation_data: str | None = None


class CommandBatch(msgspec.Struct, frozen=True):
    commands: tuple[Command, ...]


class GroupRef(msgspec.Struct, frozen=True, omit_defaults=True):
    groupname: str
    priority: int = -1


class ClientInfo(msgspec.Struct, frozen=True, omit_defaults=True):
    username: str
    clientid: str | None = None
    roles: tuple[RoleRef, ...] = ()
    # Mosquitto's groups, whose roles apply to the client without being in `roles`;
    # the embedded broker has none.
    groups: tuple[GroupRef, ...] = ()
    disabled: bool = False


class ClientData(msgspec.Struct, frozen=True):
    client: ClientInfo


class Response(
    msgspec.Struct,
    frozen=True,
    omit_defaults=True,
    rename={"correlation_data": "correlationData"},
):
    command: str
    error: str | None = None
    data: ClientData | None = None
    correlation_data: str | None = None


class ResponseBatch(msgspec.Struct, frozen=True):
    responses: tuple[Response, ...]


COMMANDS_ENCODER = msgspec.json.Encoder()
COMMANDS_DECODER = msgspec.json.Decoder(CommandBatch)
RESPONSES_DECODER = msgspec.json.Decoder(ResponseBatch)


def role_for_root(topics: Topics, unscoped_name: str) -> str:
    """A role's name under `topics.root`: the default root keeps the names of releases
    that had one role of each name for every root; any other root's carry it after an
    '@' (as client ids do, and never part of a node id or a root), so that two fleets on
    one broker neither share a role nor rewrite each other's."""
    if topics.root == DEFAULT_TOPIC_ROOT:
        return unscoped_name
    return f"{unscoped_name}@{topics.root}"


def unscoped_node_role_name(node_id: str) -> str:
    return f"greenfed-node-{node_id}"


def node_role_name(topics: Topics, node_id: str) -> str:
    return role_for_root(topics, unscoped_node_role_name(node_id))


def node_client_id(topics: Topics, node_id: str) -> str:
    """The one client id a node's account may connect with: its agent's (edge/agent/core.py
    connects with exactly this). Bound to the account, so no other account can log in
    with it, which would make the broker drop the agent's connection and publish its
    will (the node going offline, its work moved)."""
    return topics.agent_client_id(node_id)


def reader_client_id(topics: Topics, name: str) -> str:
    """The one client id a telemetry reader's account may connect with (shown when it
    is made): no reader can then log in with an agent's."""
    return topics.reader_client_id(name)


# What an agent publishes: every channel but `desired`, which only the control plane writes.
NODE_CHANNELS = tuple(
    channel for channel, spec in CHANNEL_SPECS.items() if spec.direction == "agent to cloud"
)


def node_role_acls(topics: Topics, node_id: str) -> tuple[Acl, ...]:
    """A node publishes only on its own channels (never its own `desired`: only the
    control plane writes that; nor any other topic below its own, which the broker would
    keep if retained) and subscribes to and receives only its own `desired` and, to
    notice a birth that supersedes its own (edge/agent/birth.py), its own `status`."""
    own_desired = topics.node(node_id, Channel.DESIRED)
    own_status = topics.node(node_id, Channel.STATUS)
    return (
        *(
            Acl(
                acltype="publishClientSend",
                topic=topics.node(node_id, channel),
                allow=True,
                priority=0,
            )
            for channel in NODE_CHANNELS
        ),
        # Whatever the broker's default: nothing else.
        Acl(acltype="publishClientSend", topic="#", allow=False, priority=-10),
        Acl(acltype="subscribeLiteral", topic=own_desired, allow=True, priority=0),
        Acl(acltype="subscribeLiteral", topic=own_status, allow=True, priority=0),
        Acl(acltype="publishClientReceive", topic=own_desired, allow=True, priority=10),
        Acl(acltype="publishClientReceive", topic=own_status, allow=True, priority=10),
        # Mosquitto lets anyone receive by default; a node's role says no to the rest.
        Acl(acltype="publishClientReceive", topic="#", allow=False, priority=-10),
    )


# A third party's read-only account (`greenfed mqtt accounts create NAME`): every node's
# telemetry and births under its root, nothing else; it publishes nothing.
UNSCOPED_READER_ROLE = "greenfed-telemetry-reader"
READER_CHANNELS = (Channel.TELEMETRY, Channel.STATUS)


def reader_role_name(topics: Topics) -> str:
    return role_for_root(topics, UNSCOPED_READER_ROLE)


def reader_role_acls(topics: Topics) -> tuple[Acl, ...]:
    readable = [f"{topics.nodes_prefix}+/{channel.value}" for channel in READER_CHANNELS]
    return (
        *(
            Acl(acltype="subscribePattern", topic=topic, allow=True, priority=0)
            for topic in readable
        ),
        *(
            Acl(acltype="publishClientReceive", topic=topic, allow=True, priority=10)
            for topic in readable
        ),
        Acl(acltype="publishClientReceive", topic="#", allow=False, priority=-10),
        Acl(acltype="publishClientSend", topic="#", allow=False, priority=10),
    )
