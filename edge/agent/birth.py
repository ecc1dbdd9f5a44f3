"""Where the birth is published: the node's retained `status`.

Online with the full inventory on every connection; offline/shutdown as the
last word of a clean stop; offline/connection-lost as the will the broker
publishes when the connection drops without a goodbye.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import aiomqtt

from edge.agent.context import AgentContext
from edge.agent.device_health import DeviceHealth
from edge.agent.module import AgentModule
from edge.discovery import DiscoveryResult
from shared import __version__
from shared.messages import IsolationLevel, NodeStatus, OfflineReason, ResourceLimit, encode
from shared.topics import Channel


@dataclass(frozen=True, slots=True)
class ExecutionFacts:
    """What the birth says of how this node runs work (edge/sandbox/probe.py); a node
    that runs no training says nothing of isolation."""

    isolation: IsolationLevel | None = None
    isolation_note: str = ""
    resource_limits: tuple[ResourceLimit, ...] = ()
    container_runtimes: tuple[str, ...] = ()
    sealing_public_key: str | None = None


class Birth(AgentModule):
    name = "birth"

    def __init__(
        self,
        context: AgentContext,
        discovery: DiscoveryResult,
        *,
        telemetry_interval_s: float,
        started_at: float,
        announced: asyncio.Event,
        runs_training: bool,
        health: DeviceHealth | None = None,
        health_changed: asyncio.Event | None = None,
        execution: ExecutionFacts | None = None,
    ) -> None:
        """`announced` is set once the first birth has been published (and stays set);
        `runs_training` is advertised so the scheduler never sends training here in vain;
        the inventory carries `health`, and a new birth goes out when `health_changed`."""
        self._context = context
        self._health = health or DeviceHealth(())
        self._health_changed = health_changed or asyncio.Event()
        self._runs_training = runs_training
        self._execution = execution or ExecutionFacts()
        self._discovery = discovery
        self._telemetry_interval_s = telemetry_interval_s
        self._started_at = started_at
        self._announced = announced

    def will(self) -> aiomqtt.Will:
        return aiomqtt.Will(
            self._context.topic(Channel.STATUS),
            self._status(offline_reason="connection-lost"),
            qos=1,
            retain=True,
        )

    async def on_connect(self, client: aiomqtt.Client) -> None:
        await self._context.publish(client, Channel.STATUS, self._status(offline_reason=None))
        self._context.counters.births += 1
        self._announced.set()

    async def run(self, client: aiomqtt.Client) -> None:
        while True:
            await self._health_changed.wait()
            self._health_changed.clear()
            await self._context.publish(client, Channel.STATUS, self._status(offline_reason=None))
            self._context.counters.births += 1

    async def goodbye(self, client: aiomqtt.Client) -> None:
        """A clean stop publishes offline/shutdown itself; the will is only for crashes."""
        await self._context.publish(client, Channel.STATUS, self._status(offline_reason="shutdown"))

    def _status(self, *, offline_reason: OfflineReason | None) -> bytes:
        identity = self._context.identity
        return encode(
            NodeStatus(
                node_id=identity.node_id,
                state="offline" if offline_reason else "online",
                offline_reason=offline_reason,
                instance_id=self._context.instance_id,
                agent_version=__version__,
                site=identity.site,
                zone=identity.zone,
                region=identity.region,
                labels=identity.labels,
                host=self._discovery.host,
                accelerators=self._health.inventory(self._discovery.accelerators),
                telemetry_interval_s=self._telemetry_interval_s,
                started_at=self._started_at,
                sent_at=self._context.wall_clock(),
                runs_training=self._runs_training,
                taints=identity.taints,
                isolation=self._execution.isolation,
                isolation_note=self._execution.isolation_note[:1024],
                resource_limits=self._execution.resource_limits,
                container_runtimes=self._execution.container_runtimes,
                sealing_public_key=self._execution.sealing_public_key,
            )
        )
