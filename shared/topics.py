"""MQTT topic names of the v1 contract: `{root}/v1/nodes/{node_id}/{channel}`.

The root defaults to `greenfed`; a different root lets several independent
installations (or test runs) share one broker without seeing each other.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

TOPIC_VERSION = "v1"
DEFAULT_TOPIC_ROOT = "greenfed"

_NODE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# One topic level of safe characters: a topic root, or a shared-subscription group
# name (MQTT forbids '/', '+', '#' in it).
_LEVEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class Channel(StrEnum):
    STATUS = "status"
    TELEMETRY = "telemetry"
    DESIRED = "desired"
    REPORTED = "reported"
    EVENTS = "events"
    LOGS = "logs"


@dataclass(frozen=True, slots=True)
class ChannelSpec:
    """How a channel is published: the contract's QoS and retain flags."""

    qos: int
    retained: bool
    direction: str


CHANNEL_SPECS: dict[Channel, ChannelSpec] = {
    Channel.STATUS: ChannelSpec(qos=1, retained=True, direction="agent to cloud"),
    Channel.TELEMETRY: ChannelSpec(qos=0, retained=False, direction="agent to cloud"),
    Channel.DESIRED: ChannelSpec(qos=1, retained=True, direction="cloud to agent"),
    Channel.REPORTED: ChannelSpec(qos=1, retained=True, direction="agent to cloud"),
    Channel.EVENTS: ChannelSpec(qos=1, retained=False, direction="agent to cloud"),
    # QoS 1 (was 0): spooled chunks are resent until acknowledged, deduplicated by offset.
    Channel.LOGS: ChannelSpec(qos=1, retained=False, direction="agent to cloud"),
}


class TopicError(ValueError):
    """A topic or topic component that the v1 contract does not allow."""


def is_valid_node_id(node_id: str) -> bool:
    return bool(_NODE_ID.fullmatch(node_id))


def validate_root(root: str) -> str:
    if not _LEVEL.fullmatch(root):
        raise TopicError(
            f"topic root {root!r} must be one topic level of letters, digits, '.', '_' or '-'"
        )
    return root


def validate_share_group(group: str) -> str:
    """A shared-subscription group name ("" means none)."""
    if group and not _LEVEL.fullmatch(group):
        raise TopicError(
            f"shared group {group!r} must be one topic level of letters, digits, '.', '_' or '-'"
        )
    return group


@dataclass(frozen=True, slots=True)
class NodeTopic:
    node_id: str
    channel: Channel


@dataclass(frozen=True, slots=True)
class Topics:
    """Builds and parses the topics under one root."""

    root: str = DEFAULT_TOPIC_ROOT

    def __post_init__(self) -> None:
        validate_root(self.root)

    @property
    def nodes_prefix(self) -> str:
        return f"{self.root}/{TOPIC_VERSION}/nodes/"

    def node(self, node_id: str, channel: Channel) -> str:
        if not is_valid_node_id(node_id):
            raise TopicError(f"node id {node_id!r} is not a valid topic level")
        return f"{self.nodes_prefix}{node_id}/{channel.value}"

    def agent_client_id(self, node_id: str) -> str:
        """The client id a node's agent connects with, and the one its broker account is
        bound to (cloud/broker_accounts/): with the root, so two fleets on one broker
        whose node ids coincide do not take each other's sessions over."""
        return f"greenfed-agent-{node_id}@{self.root}"

    def reader_client_id(self, name: str) -> str:
        """The client id a telemetry reader's account (a third party's, `greenfed mqtt
        accounts create`) is bound to: its own, so that it can never log in with an
        agent's and take that agent's session over."""
        return f"greenfed-reader-{name}@{self.root}"

    def all_nodes(self, channel: Channel) -> str:
        """The subscription filter for one channel of every node."""
        return f"{self.nodes_prefix}+/{channel.value}"

    def shared(self, topic_filter: str, group: str) -> str:
        """`topic_filter` as a shared subscription of `group` (MQTT 5 `$share`, which
        Mosquitto also grants MQTT 3.1.1 clients): the broker hands each message to one
        subscriber of the group. An empty group: the filter itself."""
        return f"$share/{group}/{topic_filter}" if group else topic_filter

    @property
    def telemetry_digest(self) -> str:
        """Where control-plane replicas that share telemetry publish what they heard
        (cloud/fleet/digest.py): outside `nodes/`, so no node's account may write it."""
        return f"{self.root}/{TOPIC_VERSION}/cloud/telemetry-digest"

    def parse(self, topic: str) -> NodeTopic:
        """Split a node topic into node id and channel; raise TopicError otherwise."""
        if not topic.startswith(self.nodes_prefix):
            raise TopicError(f"topic {topic!r} is outside {self.nodes_prefix}")
        rest = topic[len(self.nodes_prefix) :]
        node_id, sep, channel_name = rest.partition("/")
        if not sep or not is_valid_node_id(node_id):
            raise TopicError(f"topic {topic!r} has no valid node id")
        try:
            channel = Channel(channel_name)
        except ValueError:
            raise TopicError(f"topic {topic!r} names an unknown channel") from None
        return NodeTopic(node_id=node_id, channel=channel)
