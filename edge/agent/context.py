"""What every agent module shares: who the node is, what the agent has done, and how a
module publishes on one of the node's channels."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import aiomqtt

from shared.lean_logs import EventLogger
from shared.messages import NodeTaint, Site
from shared.settings import AgentSettings
from shared.topics import CHANNEL_SPECS, Channel, Topics


@dataclass(frozen=True, slots=True)
class NodeIdentity:
    node_id: str
    site: Site
    zone: str
    region: str
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[NodeTaint, ...] = ()

    @classmethod
    def from_settings(cls, settings: AgentSettings) -> NodeIdentity:
        return cls(
            node_id=settings.resolved_node_id(),
            site=settings.site,
            zone=settings.zone,
            region=settings.region,
            labels=dict(settings.labels),
            taints=settings.node_taints(),
        )


@dataclass(slots=True)
class AgentCounters:
    """What the agent has done; read by tests, benchmarks and the agent's metrics."""

    telemetry_sent: int = 0
    telemetry_skipped_oversized: int = 0
    births: int = 0  # published on connecting, and again when a device's health changed
    # Messages on the node's own `status` that this instance did not publish: another
    # instance's birth (copied or forged), an offline status of ours while connected, a
    # cleared topic (edge/agent/birth.py). Each is answered by announcing ourselves again.
    births_superseded: int = 0
    births_repeated: int = 0  # births published again because ours was superseded or unanswered
    desired_received: int = 0  # verified documents (applied, or older and ignored)
    # Verified documents issued for another agent instance, ignored because this one has
    # applied nothing yet (edge/agent/desired.py): a replay, or sent before our birth.
    desired_not_for_this_instance: int = 0
    # Unsigned, forged, malformed or misaddressed documents, and any while no public
    # key is configured: none of them applied (edge/agent/desired.py).
    desired_rejected: int = 0
    desired_restored: int = 0  # applied from the state directory at start
    # Events and log chunks (edge/agent/outbox.py): published, dropped to stay within
    # agent.outbox_max_bytes, or older than agent.outbox_max_age_s when their turn came.
    outbox_sent: int = 0
    outbox_dropped: int = 0
    outbox_expired: int = 0


@dataclass(frozen=True, slots=True)
class AgentContext:
    """One per agent, handed to every module it builds."""

    identity: NodeIdentity
    instance_id: str  # new on every start: tells a restarted agent from a reconnected one
    topics: Topics
    counters: AgentCounters
    wall_clock: Callable[[], float]
    log: EventLogger

    def topic(self, channel: Channel) -> str:
        return self.topics.node(self.identity.node_id, channel)

    async def publish(self, client: aiomqtt.Client, channel: Channel, payload: bytes) -> None:
        """Publish with the channel's contracted QoS and retain flag (shared/topics.py)."""
        spec = CHANNEL_SPECS[channel]
        await client.publish(self.topic(channel), payload, qos=spec.qos, retain=spec.retained)
