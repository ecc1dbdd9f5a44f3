"""`Agent`: one node. Discovers, builds the modules, keeps one MQTT session alive and
drives every module's hooks (edge/agent/module.py) over the agent's lifetime.

The agent's own job is only ordering and ownership: the modules' long-lived
tasks belong to the agent's task group (they outlive connections); each
connection's loops belong to a task group of that connection.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import aiomqtt

from edge.agent.birth import ExecutionFacts
from edge.agent.context import AgentContext, AgentCounters, NodeIdentity
from edge.agent.module import GOODBYE_TIMEOUT_S, AgentModule
from edge.agent.modules import AgentModules, build_agent_modules
from edge.agent.outbox import Outbox
from edge.agent.spool import DiskSpool, MemorySpool, Spool
from edge.agent.state_files import AgentStateFiles
from edge.agent.upgrades import UpgradeOptions
from edge.discovery import DiscoveryResult, discover_all
from edge.inference.options import InferenceOptions
from edge.probes import DeviceProbes
from edge.training.reconcile import TrainingReconciler
from edge.training.runs import LauncherFactory
from shared import __version__
from shared.desired_signature import PublicKeyError, load_public_key
from shared.lean_logs import get_logger
from shared.messages import EventKind
from shared.mqtt import MqttSession
from shared.settings import OUTBOX_MAX_AGE_S, OUTBOX_MAX_BYTES, ConfigError, MqttSettings
from shared.topics import Topics

if TYPE_CHECKING:
    from edge.inference.runtime import InferenceRuntime
    from shared.ed25519 import VerifyKey

PUBLIC_KEY_SETTING = "agent.control_plane_public_key"


def _public_key(text: str) -> VerifyKey | None:
    if not text:
        return None
    try:
        return load_public_key(text)
    except PublicKeyError as error:
        raise ConfigError(f"{PUBLIC_KEY_SETTING}: {error}", key=PUBLIC_KEY_SETTING) from None


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
        training_launcher: LauncherFactory | None = None,
        inference: InferenceOptions | None = None,
        control_plane_public_key: str = "",
        state_dir: Path | None = None,
        outbox_max_bytes: int = OUTBOX_MAX_BYTES,
        outbox_max_age_s: float = OUTBOX_MAX_AGE_S,
        execution: ExecutionFacts | None = None,
        reload_mqtt_settings: Callable[[], MqttSettings] | None = None,
        upgrades: UpgradeOptions | None = None,
    ) -> None:
        """`training_launcher` None: this node runs no training (edge devices), else
        it makes the node's launcher once its accelerators are known; `execution`: how
        it isolates training, what limits and runtimes it has, its sealing key (birth);
        `control_plane_public_key`: base64 of the key `desired` documents must be signed
        with (`agent.control_plane_public_key`); empty: none is applied; `state_dir`:
        where the applied desired state, the reported state and the outbox are kept
        (edge/agent/state_files.py); None: in memory only, nothing survives a restart;
        `reload_mqtt_settings`: reads the broker settings again (the settings file) when the
        broker refuses the credentials, so that a node enrolled again goes on with its new
        password and its work (shared/mqtt.py); None: a refusal stops the agent;
        `upgrades`: how this agent, run by the upgrade supervisor, upgrades itself
        (edge/agent/upgrades.py); None: it does not."""
        self.identity = identity
        self._probes = probes
        self._mqtt_settings = mqtt_settings
        self._reload_mqtt_settings = reload_mqtt_settings
        self._upgrades = upgrades
        self._telemetry_interval_s = telemetry_interval_s
        self._telemetry_jitter_ratio = telemetry_jitter_ratio
        self._rng = rng or random.Random()
        self._training_launcher = training_launcher
        self._execution = execution or ExecutionFacts()
        self._inference_options = inference or InferenceOptions()
        self._control_plane_public_key = _public_key(control_plane_public_key)
        self._context = AgentContext(
            identity=identity,
            instance_id=uuid.uuid4().hex,
            topics=Topics(mqtt_settings.topic_root),
            counters=AgentCounters(),
            wall_clock=wall_clock,
            log=get_logger("greenfed.agent").bind(node_id=identity.node_id),
        )
        self._state = AgentStateFiles(state_dir) if state_dir is not None else None
        spool: Spool
        if self._state is not None:
            spool = DiskSpool(
                self._state.outbox_dir,
                max_bytes=outbox_max_bytes,
                max_age_s=outbox_max_age_s,
                clock=wall_clock,
            )
        else:
            spool = MemorySpool(
                max_bytes=outbox_max_bytes, max_age_s=outbox_max_age_s, clock=wall_clock
            )
        self._spool = spool
        self._outbox = Outbox(self._context, spool)
        self._modules: AgentModules | None = None  # built once discovery is done
        self.discovery: DiscoveryResult | None = None
        self.session: MqttSession | None = None
        # Set once the first birth has been published (and stays set).
        self.announced = asyncio.Event()

    @property
    def instance_id(self) -> str:
        return self._context.instance_id

    @property
    def counters(self) -> AgentCounters:
        return self._context.counters

    @property
    def observed_generation(self) -> int:
        return self._modules.reported.observed_generation if self._modules else 0

    @property
    def training(self) -> TrainingReconciler | None:
        return self._modules.training.reconciler if self._modules else None

    @property
    def inference(self) -> InferenceRuntime | None:
        """None until the first inference deployment arrives."""
        return self._modules.inference.runtime if self._modules else None

    @property
    def inference_port(self) -> int | None:
        return self._modules.inference.port if self._modules else None

    def raise_event(self, kind: EventKind, subject: str | None = None, detail: str = "") -> None:
        """Queue an event; it is published now if connected, else on the next connect."""
        self._outbox.raise_event(kind, subject, detail)

    async def run(self) -> None:
        """Discover, then keep the node connected until cancelled."""
        log = self._context.log
        # Both clocks: a birth's `started_at` follows the wall clock if it is stepped.
        started_at = self._context.wall_clock()
        started_monotonic_s = time.monotonic()
        discovery = await asyncio.to_thread(discover_all, self._probes)
        self.discovery = discovery
        for probe_name, error in discovery.failed_probes:
            self._outbox.raise_event("probe-failed", subject=probe_name, detail=error)
        self._outbox.raise_event("agent-started", detail=f"agent {__version__}")
        log.info(
            "agent discovered",
            accelerators=[f"{a.kind}:{a.model}" for a in discovery.accelerators],
            failed_probes=[name for name, _ in discovery.failed_probes],
        )
        modules = build_agent_modules(
            self._context,
            self._probes,
            discovery,
            self._outbox,
            telemetry_interval_s=self._telemetry_interval_s,
            telemetry_jitter_ratio=self._telemetry_jitter_ratio,
            rng=self._rng,
            max_payload_bytes=self._mqtt_settings.max_payload_bytes,
            training_launcher=self._training_launcher,
            inference_options=self._inference_options,
            started_at=started_at,
            started_monotonic_s=started_monotonic_s,
            announced=self.announced,
            control_plane_public_key=self._control_plane_public_key,
            state=self._state,
            execution=self._execution,
            upgrade_options=self._upgrades,
        )
        self._modules = modules
        self.session = MqttSession(
            self._mqtt_settings,
            client_id=Topics(self._mqtt_settings.topic_root).agent_client_id(self.identity.node_id),
            will=modules.birth.will(),
            logger=log,
        )
        self.session.reload_settings = self._reload_mqtt_settings
        ordered = modules.in_order()
        try:
            # Work that outlives MQTT connections (workers, replicas) lives in this group.
            async with asyncio.TaskGroup() as work:
                try:
                    for module in ordered:
                        await module.start(work)
                    # What this node ran before it stopped, without waiting for the broker.
                    await modules.desired.restore()
                    await self.session.run(self._connected)
                except asyncio.CancelledError:
                    for module in reversed(ordered):
                        await module.stop()
                    raise
        except BaseExceptionGroup as group:
            # One failure (say, refused credentials) should reach the caller as itself.
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise
        finally:
            self._spool.close()
            await asyncio.to_thread(self._close_probes)

    def _close_probes(self) -> None:
        for probe in self._probes.accelerator_probes:
            try:
                probe.close()
            except Exception as error:  # a driver failing at shutdown must not mask the real exit
                self._context.log.warning("probe close failed", probe=probe.name, error=str(error))
        if self._probes.gpu_power is not None:
            try:
                self._probes.gpu_power.close()
            except Exception as error:
                self._context.log.warning("GPU power control close failed", error=str(error))

    async def _connected(self, client: aiomqtt.Client) -> None:
        assert self._modules is not None
        ordered = self._modules.in_order()
        # A stop while the modules are still connecting (the birth may be out already)
        # says goodbye too: the session then disconnects cleanly, and the broker keeps
        # the will to itself, so without it the node would stay online.
        try:
            for module in ordered:
                await module.on_connect(client)
            await self._run_modules(client, ordered)
        except asyncio.CancelledError:
            await self._say_goodbye(client, ordered)
            raise

    async def _run_modules(self, client: aiomqtt.Client, ordered: tuple[AgentModule, ...]) -> None:
        try:
            async with asyncio.TaskGroup() as connection:
                for module in ordered:
                    connection.create_task(module.run(client), name=module.name)
        except* aiomqtt.MqttError as group:
            # Re-raise the first MQTT error alone so the session's reconnect loop sees it.
            raise group.exceptions[0] from None

    async def _say_goodbye(self, client: aiomqtt.Client, ordered: tuple[AgentModule, ...]) -> None:
        try:
            async with asyncio.timeout(GOODBYE_TIMEOUT_S):
                for module in reversed(ordered):
                    await module.goodbye(client)
        except (TimeoutError, aiomqtt.MqttError) as error:
            self._context.log.warning(
                "goodbye not delivered; the broker will publish the will", error=str(error)
            )
