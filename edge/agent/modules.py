"""The one place that lists the agent's modules, builds them and wires them together.

Order matters and is the tuple in `AgentModules.in_order`: modules start and
connect in that order (the birth goes out before the `desired` subscription,
which comes before the first reported state) and say goodbye and stop in reverse
(queued events are flushed before the offline status; training workers stop
before the inference server). The inbox reads every incoming message and hands it
to the module that subscribed to its topic.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edge.agent.birth import Birth, ExecutionFacts
from edge.agent.context import AgentContext
from edge.agent.desired import DesiredStateApplier
from edge.agent.device_health import DeviceHealth
from edge.agent.inbox import Inbox
from edge.agent.inference_server import InferenceServer
from edge.agent.job_logs import JobLogShipper
from edge.agent.module import AgentModule
from edge.agent.outbox import Outbox
from edge.agent.reported import ReportedStatePublisher
from edge.agent.state_files import AgentStateFiles
from edge.agent.telemetry import TelemetrySampler
from edge.agent.training_workers import TrainingWorkers
from edge.agent.upgrades import AgentUpgrades, UpgradeOptions
from edge.discovery import DiscoveryResult
from edge.inference.options import InferenceOptions
from edge.probes import DeviceProbes
from edge.training.power_limits import PowerLimits
from edge.training.reconcile import TrainingReconciler
from edge.training.runs import LauncherFactory

if TYPE_CHECKING:
    from shared.ed25519 import VerifyKey


@dataclass(frozen=True, slots=True)
class AgentModules:
    birth: Birth
    desired: DesiredStateApplier
    reported: ReportedStatePublisher
    inference: InferenceServer
    training: TrainingWorkers
    telemetry: TelemetrySampler
    job_logs: JobLogShipper
    outbox: Outbox
    inbox: Inbox
    upgrades: AgentUpgrades

    def in_order(self) -> tuple[AgentModule, ...]:
        return (
            self.birth,
            self.desired,
            self.reported,
            self.inference,
            self.training,
            self.telemetry,
            self.job_logs,
            self.outbox,
            self.inbox,
            self.upgrades,
        )


def build_agent_modules(
    context: AgentContext,
    probes: DeviceProbes,
    discovery: DiscoveryResult,
    outbox: Outbox,
    *,
    telemetry_interval_s: float,
    telemetry_jitter_ratio: float,
    rng: random.Random,
    max_payload_bytes: int,
    training_launcher: LauncherFactory | None,
    inference_options: InferenceOptions,
    started_at: float,
    started_monotonic_s: float,
    announced: asyncio.Event,
    control_plane_public_key: VerifyKey | None,
    state: AgentStateFiles | None,
    execution: ExecutionFacts,
    upgrade_options: UpgradeOptions | None = None,
) -> AgentModules:
    """`outbox` is built before discovery (discovery raises events); the rest need it.
    `state` None: nothing is kept on disk (simulated fleets, tests)."""
    reported_changed = asyncio.Event()
    output_waiting = asyncio.Event()
    launcher = training_launcher(discovery.accelerators) if training_launcher else None
    reconciler = TrainingReconciler(
        launcher,
        discovery.accelerators,
        on_change=reported_changed.set,
        on_event=outbox.raise_event,
        on_output=output_waiting.set,
        power_limits=PowerLimits(
            probes.gpu_power,
            discovery.accelerators,
            state_path=state.power_limits_path if state is not None else None,
        ),
    )
    inference = InferenceServer(
        context, inference_options, discovery.accelerators, on_change=reported_changed.set
    )
    reported = ReportedStatePublisher(context, reconciler, inference, reported_changed, state)
    health = DeviceHealth(discovery.accelerators)
    health_changed = asyncio.Event()
    upgrades = AgentUpgrades(
        context,
        upgrade_options,
        public_key=control_plane_public_key,
        announced=announced,
        report_changed=health_changed,
    )
    birth = Birth(
        context,
        discovery,
        telemetry_interval_s=telemetry_interval_s,
        started_at=started_at,
        started_monotonic_s=started_monotonic_s,
        announced=announced,
        runs_training=launcher is not None,
        health=health,
        health_changed=health_changed,
        execution=execution,
        upgrades=upgrades,
    )
    desired = DesiredStateApplier(
        context,
        reconciler,
        inference,
        reported,
        outbox,
        public_key=control_plane_public_key,
        state=state,
        birth=birth,
        upgrades=upgrades,
    )
    return AgentModules(
        birth=birth,
        desired=desired,
        reported=reported,
        inference=inference,
        training=TrainingWorkers(reconciler),
        telemetry=TelemetrySampler(
            context,
            probes,
            discovery,
            inference,
            interval_s=telemetry_interval_s,
            jitter_ratio=telemetry_jitter_ratio,
            rng=rng,
            max_payload_bytes=max_payload_bytes,
            health=health,
            health_changed=health_changed,
        ),
        job_logs=JobLogShipper(
            context, reconciler, output_waiting, outbox, max_payload_bytes=max_payload_bytes
        ),
        outbox=outbox,
        inbox=Inbox({desired.topic: desired.on_message, birth.status_topic: birth.on_status}),
        upgrades=upgrades,
    )
