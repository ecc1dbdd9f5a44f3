"""The edge agent: announces its node, streams telemetry, answers desired state.

One `Agent` is one node. It runs the same code on real hardware (probes from
edge/discovery/) and in simulations (probes from sim_devices/), so everything
tested against simulated fleets is the code that ships.

On every connection the agent publishes its birth (retained `status`), subscribes
to its `desired` topic (which replays the retained desired state), publishes its
`reported` state and flushes queued events; the broker publishes the will
(retained offline `status`) if the connection drops without a goodbye.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import aiomqtt
import msgspec
import structlog

if TYPE_CHECKING:  # imported when the first deployment arrives (aiohttp, numpy, ORT)
    from aiohttp import web

    from edge.inference.runtime import InferenceRuntime

from edge.discovery import DiscoveryResult, discover_all, sample_all
from edge.inference.options import InferenceOptions
from edge.probes import DeviceProbes
from edge.training.reconcile import TrainingReconciler
from edge.training.runs import TrainingLauncher
from shared import __version__
from shared.messages import (
    DESIRED_DECODER,
    DesiredState,
    EventKind,
    JobLogChunk,
    NodeEvent,
    NodeStatus,
    OfflineReason,
    ReportedState,
    Site,
    Telemetry,
    encode,
)
from shared.mqtt import MqttSession
from shared.settings import AgentSettings, MqttSettings
from shared.topics import CHANNEL_SPECS, Channel, Topics

# Events raised while the broker is unreachable wait here, oldest dropped first.
EVENT_OUTBOX_CAPACITY = 1000
# Workers' output is shipped at most this often (per worker, SHIP_MAX_BYTES a round).
LOG_SHIP_INTERVAL_S = 1.0
# How long a stopping agent waits for the broker to take its goodbye.
GOODBYE_TIMEOUT_S = 1.0


@dataclass(frozen=True, slots=True)
class NodeIdentity:
    node_id: str
    site: Site
    zone: str
    region: str
    labels: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, settings: AgentSettings) -> NodeIdentity:
        return cls(
            node_id=settings.resolved_node_id(),
            site=settings.site,
            zone=settings.zone,
            region=settings.region,
            labels=dict(settings.labels),
        )


@dataclass(slots=True)
class AgentCounters:
    """What the agent has done; read by tests, benchmarks and the agent's metrics."""

    telemetry_sent: int = 0
    telemetry_skipped_oversized: int = 0
    births: int = 0
    desired_received: int = 0
    desired_rejected: int = 0
    events_dropped: int = 0


class Agent:
    def __init__(
        self,
        identity: NodeIdentity,
        probes: DeviceProbes,
        mqtt_settings: MqttSettings,
        *,
        telemetry_interval_s: float = 5.0,
        telemetry_jitter_ratio: float = 0.1,
        rng: random.Random | None = None,
        wall_clock: Callable[[], float] = time.time,
        training_launcher: TrainingLauncher | None = None,
        inference: InferenceOptions | None = None,
    ) -> None:
        """`training_launcher` None: this node runs no training (edge devices)."""
        self.identity = identity
        self._training_launcher = training_launcher
        self.training: TrainingReconciler | None = None
        self._inference_options = inference or InferenceOptions()
        self.inference: InferenceRuntime | None = None
        self._inference_site: web.AppRunner | None = None
        self._work: asyncio.TaskGroup | None = None
        self.inference_port: int | None = None
        self._probes = probes
        self._mqtt_settings = mqtt_settings
        self._topics = Topics(mqtt_settings.topic_root)
        self._telemetry_interval_s = telemetry_interval_s
        self._jitter_ratio = telemetry_jitter_ratio
        self._rng = rng or random.Random()
        self._wall_clock = wall_clock
        self._log = structlog.get_logger("greenfed.agent").bind(node_id=identity.node_id)
        self.instance_id = uuid.uuid4().hex
        self.counters = AgentCounters()
        self.observed_generation = 0
        self.discovery: DiscoveryResult | None = None
        self.session: MqttSession | None = None
        self._seq = 0
        self._started_at = 0.0
        self._outbox: deque[NodeEvent] = deque(maxlen=EVENT_OUTBOX_CAPACITY)
        self._outbox_filled = asyncio.Event()
        # Set once the first birth has been published (and stays set).
        self.announced = asyncio.Event()
        self._reported_changed = asyncio.Event()
        self._output_waiting = asyncio.Event()

    # -- messages ---------------------------------------------------------------

    def _status(self, discovery: DiscoveryResult, *, offline_reason: OfflineReason | None) -> bytes:
        return encode(
            NodeStatus(
                node_id=self.identity.node_id,
                state="offline" if offline_reason else "online",
                offline_reason=offline_reason,
                instance_id=self.instance_id,
                agent_version=__version__,
                site=self.identity.site,
                zone=self.identity.zone,
                region=self.identity.region,
                labels=self.identity.labels,
                host=discovery.host,
                accelerators=discovery.accelerators,
                telemetry_interval_s=self._telemetry_interval_s,
                started_at=self._started_at,
                sent_at=self._wall_clock(),
            )
        )

    def raise_event(self, kind: EventKind, subject: str | None = None, detail: str = "") -> None:
        """Queue an event; it is published now if connected, else on the next connect."""
        if len(self._outbox) == self._outbox.maxlen:
            self.counters.events_dropped += 1
        self._outbox.append(
            NodeEvent(
                node_id=self.identity.node_id,
                event_id=uuid.uuid4().hex,
                kind=kind,
                subject=subject,
                detail=detail,
                occurred_at=self._wall_clock(),
            )
        )
        self._outbox_filled.set()

    def _topic(self, channel: Channel) -> str:
        return self._topics.node(self.identity.node_id, channel)

    async def _publish(self, client: aiomqtt.Client, channel: Channel, payload: bytes) -> None:
        spec = CHANNEL_SPECS[channel]
        await client.publish(self._topic(channel), payload, qos=spec.qos, retain=spec.retained)

    # -- lifecycle --------------------------------------------------------------

    async def run(self) -> None:
        """Discover, then keep the node connected until cancelled."""
        self._started_at = self._wall_clock()
        discovery = await asyncio.to_thread(discover_all, self._probes)
        self.discovery = discovery
        for probe_name, error in discovery.failed_probes:
            self.raise_event("probe-failed", subject=probe_name, detail=error)
        self.raise_event("agent-started", detail=f"agent {__version__}")
        self._log.info(
            "agent discovered",
            accelerators=[f"{a.kind}:{a.model}" for a in discovery.accelerators],
            failed_probes=[name for name, _ in discovery.failed_probes],
        )
        will = aiomqtt.Will(
            self._topic(Channel.STATUS),
            self._status(discovery, offline_reason="connection-lost"),
            qos=1,
            retain=True,
        )
        self.session = MqttSession(
            self._mqtt_settings,
            client_id=f"greenfed-agent-{self.identity.node_id}",
            will=will,
            logger=self._log,
        )
        self.training = TrainingReconciler(
            self._training_launcher,
            discovery.accelerators,
            on_change=self._reported_changed.set,
            on_event=self.raise_event,
            on_output=self._output_waiting.set,
        )
        try:
            # Training workers live in this task group: they outlive MQTT connections.
            async with asyncio.TaskGroup() as work:
                self.training.bind(work)
                self._work = work
                try:
                    await self.session.run(self._connected)
                except asyncio.CancelledError:
                    await self.training.stop_all("the agent is stopping")
                    await self._stop_inference()
                    raise
        except BaseExceptionGroup as group:
            # One failure (say, refused credentials) should reach the caller as itself.
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise
        finally:
            await asyncio.to_thread(self._close_probes)

    def _endpoint_base(self) -> str | None:
        if self.inference_port is None:
            return None
        return f"http://{self._inference_options.advertised()}:{self.inference_port}"

    async def _serve_inference(self) -> None:
        """Start the local inference endpoint the first time a deployment arrives (nodes
        that never serve never load aiohttp's server or ONNX Runtime)."""
        if self._inference_site is not None:
            return
        from aiohttp import web

        from edge.inference.cache import ModelCache
        from edge.inference.runtime import InferenceRuntime
        from edge.inference.server import inference_app

        options = self._inference_options
        assert self.discovery is not None
        assert self._work is not None
        self.inference = InferenceRuntime(
            self.discovery.accelerators,
            ModelCache(options.resolved_cache_dir(self.identity.node_id), options.cache_max_bytes),
            on_change=self._reported_changed.set,
            endpoint_base=self._endpoint_base,
            max_queue=options.max_queue,
            latency_scale=options.latency_scale,
            intra_op_threads=options.intra_op_threads,
        )
        self.inference.bind(self._work)
        runner = web.AppRunner(inference_app(self.inference), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self._inference_options.host, self._inference_options.port)
        await site.start()
        # The bound address says the port when 0 (any free port) was asked for.
        self.inference_port = int(runner.addresses[0][1])
        self._inference_site = runner
        self._log.info("inference endpoint listening", url=self._endpoint_base())

    async def _stop_inference(self) -> None:
        if self.inference is not None:
            await self.inference.close()
        if self._inference_site is not None:
            await self._inference_site.cleanup()
            self._inference_site = None

    def _close_probes(self) -> None:
        for probe in self._probes.accelerator_probes:
            try:
                probe.close()
            except Exception as error:  # a driver failing at shutdown must not mask the real exit
                self._log.warning("probe close failed", probe=probe.name, error=str(error))

    async def _connected(self, client: aiomqtt.Client) -> None:
        assert self.discovery is not None
        await self._publish(
            client, Channel.STATUS, self._status(self.discovery, offline_reason=None)
        )
        self.counters.births += 1
        self.announced.set()
        await client.subscribe(self._topic(Channel.DESIRED), qos=1)
        await self._publish_reported(client)
        try:
            await self._run_loops(client)
        except asyncio.CancelledError:
            await self._say_goodbye(client)
            raise

    async def _run_loops(self, client: aiomqtt.Client) -> None:
        try:
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(self._telemetry_loop(client))
                tasks.create_task(self._desired_loop(client))
                tasks.create_task(self._event_loop(client))
                tasks.create_task(self._reported_loop(client))
                tasks.create_task(self._logs_loop(client))
        except* aiomqtt.MqttError as group:
            # Re-raise the first MQTT error alone so the session's reconnect loop sees it.
            raise group.exceptions[0] from None

    async def _say_goodbye(self, client: aiomqtt.Client) -> None:
        """A clean stop publishes offline/shutdown itself; the will is only for crashes."""
        assert self.discovery is not None
        self.raise_event("agent-stopping")
        try:
            async with asyncio.timeout(GOODBYE_TIMEOUT_S):
                await self._flush_events(client)
                await self._publish(
                    client, Channel.STATUS, self._status(self.discovery, offline_reason="shutdown")
                )
        except (TimeoutError, aiomqtt.MqttError) as error:
            self._log.warning(
                "goodbye not delivered; the broker will publish the will", error=str(error)
            )

    # -- loops ------------------------------------------------------------------

    def _next_interval_s(self) -> float:
        jitter = self._rng.uniform(-self._jitter_ratio, self._jitter_ratio)
        return self._telemetry_interval_s * (1.0 + jitter)

    async def _telemetry_loop(self, client: aiomqtt.Client) -> None:
        assert self.discovery is not None
        failed = {name for name, _ in self.discovery.failed_probes}
        working = frozenset(p.name for p in self._probes.accelerator_probes) - failed
        max_payload = self._mqtt_settings.max_payload_bytes
        while True:
            host, samples, failures = await asyncio.to_thread(sample_all, self._probes, working)
            for probe_name, error in failures:
                self._log.warning("probe sample failed", probe=probe_name, error=error)
            self._seq += 1
            payload = encode(
                Telemetry(
                    node_id=self.identity.node_id,
                    instance_id=self.instance_id,
                    seq=self._seq,
                    sampled_at=self._wall_clock(),
                    interval_s=self._telemetry_interval_s,
                    cpu_utilization_pct=host.cpu_utilization_pct,
                    memory_used_bytes=host.memory_used_bytes,
                    memory_total_bytes=host.memory_total_bytes,
                    accelerators=tuple(samples),
                    deployments=self.inference.samples() if self.inference else (),
                )
            )
            if len(payload) > max_payload:
                self.counters.telemetry_skipped_oversized += 1
                self._log.warning(
                    "telemetry over the payload limit, skipped",
                    payload_bytes=len(payload),
                    limit_bytes=max_payload,
                )
            else:
                await self._publish(client, Channel.TELEMETRY, payload)
                self.counters.telemetry_sent += 1
            await asyncio.sleep(self._next_interval_s())

    async def _desired_loop(self, client: aiomqtt.Client) -> None:
        desired_topic = self._topic(Channel.DESIRED)
        async for message in client.messages:
            if message.topic.value != desired_topic:
                continue
            payload = message.payload
            if not isinstance(payload, bytes) or not payload:
                continue  # a cleared retained desired state: nothing to apply
            try:
                desired = DESIRED_DECODER.decode(payload)
            except msgspec.DecodeError as error:
                self.counters.desired_rejected += 1
                self._log.warning("desired state rejected", error=str(error))
                self.raise_event("desired-rejected", detail=str(error))
                continue
            await self._apply_desired(client, desired)

    async def _apply_desired(self, client: aiomqtt.Client, desired: DesiredState) -> None:
        self.counters.desired_received += 1
        if desired.node_id != self.identity.node_id:
            self.counters.desired_rejected += 1
            self.raise_event("desired-rejected", detail=f"addressed to {desired.node_id}")
            return
        if desired.generation < self.observed_generation:
            return  # an older document arriving late; the newer one already applied
        self.observed_generation = desired.generation
        assert self.training is not None
        self.training.apply(desired.training)
        if desired.deployments:
            await self._serve_inference()
        if self.inference is not None:
            self.inference.apply(desired.deployments)
        await self._publish_reported(client)

    async def _publish_reported(self, client: aiomqtt.Client) -> None:
        self._reported_changed.clear()
        training = self.training.reported() if self.training is not None else ()
        await self._publish(
            client,
            Channel.REPORTED,
            encode(
                ReportedState(
                    node_id=self.identity.node_id,
                    instance_id=self.instance_id,
                    observed_generation=self.observed_generation,
                    reported_at=self._wall_clock(),
                    training=training,
                    deployments=self.inference.reported() if self.inference else (),
                )
            ),
        )

    async def _reported_loop(self, client: aiomqtt.Client) -> None:
        """Publish the reported state whenever a worker changed state."""
        while True:
            await self._reported_changed.wait()
            await self._publish_reported(client)

    async def _logs_loop(self, client: aiomqtt.Client) -> None:
        """Ship workers' new output, one chunk per worker at most once a second."""
        assert self.training is not None
        while True:
            await self._output_waiting.wait()
            self._output_waiting.clear()
            for run in self.training.runs_with_output():
                chunk = run.output.take()
                if chunk is None:
                    continue
                offset, data, dropped = chunk
                message = JobLogChunk(
                    node_id=self.identity.node_id,
                    job_id=run.status.job_id,
                    attempt=run.status.attempt,
                    offset=offset,
                    text=data.decode("utf-8", errors="replace"),
                    dropped_bytes=dropped,
                    sent_at=self._wall_clock(),
                )
                await self._publish(client, Channel.LOGS, encode(message))
                if run.output.pending_bytes:
                    self._output_waiting.set()
            await asyncio.sleep(LOG_SHIP_INTERVAL_S)

    async def _event_loop(self, client: aiomqtt.Client) -> None:
        while True:
            await self._outbox_filled.wait()
            self._outbox_filled.clear()
            await self._flush_events(client)

    async def _flush_events(self, client: aiomqtt.Client) -> None:
        while self._outbox:
            # Publish before removing: an event leaves the outbox only once the broker has it.
            await self._publish(client, Channel.EVENTS, encode(self._outbox[0]))
            self._outbox.popleft()
