"""Where telemetry is sampled and sent: host and accelerator readings, taken off the
event loop, every interval (with jitter, so a fleet does not sample in step), and
dropped rather than sent when over the broker's payload limit."""

from __future__ import annotations

import asyncio
import random

import aiomqtt

from edge.agent.context import AgentContext
from edge.agent.device_health import DeviceHealth
from edge.agent.inference_server import InferenceServer
from edge.agent.module import AgentModule
from edge.discovery import DiscoveryResult, device_faults, sample_all
from edge.probes import DeviceProbes
from shared.messages import Telemetry, encode
from shared.topics import Channel


class TelemetrySampler(AgentModule):
    name = "telemetry"

    def __init__(
        self,
        context: AgentContext,
        probes: DeviceProbes,
        discovery: DiscoveryResult,
        inference: InferenceServer,
        *,
        interval_s: float,
        jitter_ratio: float,
        rng: random.Random,
        max_payload_bytes: int,
        health: DeviceHealth | None = None,
        health_changed: asyncio.Event | None = None,
    ) -> None:
        """Each round's readings go to `health`, which sets `health_changed` (the birth
        is published again) when a GPU fails or recovers."""
        self._context = context
        self._health = health
        self._health_changed = health_changed
        self._probes = probes
        failed = {name for name, _ in discovery.failed_probes}
        # A probe that failed discovery is not sampled again.
        self._working = frozenset(p.name for p in probes.accelerator_probes) - failed
        self._inference = inference
        self._interval_s = interval_s
        self._jitter_ratio = jitter_ratio
        self._rng = rng
        self._max_payload_bytes = max_payload_bytes
        self._seq = 0  # counts on across reconnections

    def _next_interval_s(self) -> float:
        jitter = self._rng.uniform(-self._jitter_ratio, self._jitter_ratio)
        return self._interval_s * (1.0 + jitter)

    async def run(self, client: aiomqtt.Client) -> None:
        context = self._context
        while True:
            host, samples, failures = await asyncio.to_thread(
                sample_all, self._probes, self._working
            )
            faults = (
                await asyncio.to_thread(device_faults, self._probes, self._working)
                if self._health is not None
                else {}
            )
            for probe_name, error in failures:
                context.log.warning("probe sample failed", probe=probe_name, error=error)
            if self._health is not None and self._health.observe({s.id for s in samples}, faults):
                context.log.warning("device health changed", unhealthy=self._health.unhealthy)
                if self._health_changed is not None:
                    self._health_changed.set()
            self._seq += 1
            payload = encode(
                Telemetry(
                    node_id=context.identity.node_id,
                    instance_id=context.instance_id,
                    seq=self._seq,
                    sampled_at=context.wall_clock(),
                    interval_s=self._interval_s,
                    cpu_utilization_pct=host.cpu_utilization_pct,
                    memory_used_bytes=host.memory_used_bytes,
                    memory_total_bytes=host.memory_total_bytes,
                    accelerators=tuple(samples),
                    deployments=self._inference.samples(),
                )
            )
            if len(payload) > self._max_payload_bytes:
                context.counters.telemetry_skipped_oversized += 1
                context.log.warning(
                    "telemetry over the payload limit, skipped",
                    payload_bytes=len(payload),
                    limit_bytes=self._max_payload_bytes,
                )
            else:
                try:
                    await context.publish(client, Channel.TELEMETRY, payload)
                except aiomqtt.MqttCodeError:
                    raise  # refused by the client: never handed over, not sent
                except BaseException:
                    # aiomqtt hands the message to the connection first, then waits for
                    # it to be written. Stopped in that wait, it is still written (before
                    # the goodbye); timed out, it may be, or go with the connection.
                    # Counted either way, what arrives never exceeds the count: uncounted,
                    # a stopping fleet's brokers delivered more than it said it sent
                    # (benchmarks/RESULTS.md, issue 28).
                    context.counters.telemetry_sent += 1
                    raise
                context.counters.telemetry_sent += 1
                if _stop_swallowed():
                    raise asyncio.CancelledError
            await asyncio.sleep(self._next_interval_s())


def _stop_swallowed() -> bool:
    """Whether this task was cancelled and carried on: aiomqtt's publish waits in
    `asyncio.wait_for`, which on Python 3.11 drops a cancellation that arrives as the
    write completes (shared/tasks.py). Its owner's task group cancels it only once, so
    the loop would go on sampling and sending while its agent stops, uncounted once the
    count is taken (2,000 simulated agents stopping on a busy machine: 1,683 samples
    sent by loops cancelled in this way)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
