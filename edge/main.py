"""`greenfed edge run` and `greenfed edge discover`."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO

import msgspec

from edge.agent import Agent, NodeIdentity
from edge.agent.birth import ExecutionFacts
from edge.agent.upgrades import UpgradeOptions
from edge.discovery import DiscoveryResult, build_device_probes, discover_all
from edge.enrolment_proof import certificate_path, load_enrolment_proof
from edge.inference.options import InferenceOptions
from edge.training.runs import LauncherFactory, TrainingLauncher
from edge.upgrade.versions import HEALTH_FILE_ENV, RESTART_EXIT_CODE, VERSIONS_DIR_ENV
from shared.lean_logs import bind_contextvars, get_logger
from shared.messages import Accelerator
from shared.runtime import run_until_stopped
from shared.settings import AgentSettings, Settings, load_settings
from shared.tasks import cancel_and_wait

log = get_logger("greenfed.agent")


async def training_launcher(
    settings: Settings, config_path: Path | None
) -> tuple[LauncherFactory, ExecutionFacts]:
    """The launcher of a node that runs training, and what its birth says of it."""
    # Only nodes that run training workers load this (edge devices do not).
    from edge.sandbox.setup import JOBS_DIR, set_up_training
    from edge.training.process import ProcessLauncher
    from shared.sealing import public_key_text

    agent = settings.agent
    setup = await asyncio.to_thread(set_up_training, settings, config_path)
    isolation = setup.isolation
    log.info(
        "training isolation",
        level=isolation.level,
        note=isolation.note,
        limits=list(isolation.limits),
        container_runtime=isolation.runtime_note,
    )

    def launcher(inventory: Sequence[Accelerator]) -> TrainingLauncher:
        return ProcessLauncher(
            agent.resolved_data_dir() / JOBS_DIR,
            sandbox=setup.sandbox(tuple(inventory), agent.worker_pids_limit),
            node_id=agent.resolved_node_id(),
            sealing_key=setup.sealing_key,
            max_log_bytes=agent.max_job_log_bytes,
        )

    facts = ExecutionFacts(
        isolation=isolation.level,
        isolation_note=isolation.note,
        resource_limits=isolation.limits,
        container_runtimes=isolation.runtimes,
        sealing_public_key=public_key_text(setup.sealing_key),
    )
    return launcher, facts


def with_enrolment_proof(agent: AgentSettings, execution: ExecutionFacts) -> ExecutionFacts:
    """The birth's facts with the node's enrolment certificate and sealing key, where
    `greenfed edge enrol` kept a certificate (any node: an edge device that runs no
    training proves its identity the same way)."""
    path = certificate_path(agent)
    if not path.exists():
        return execution
    from edge.sealing_key import load_or_create_sealing_key, sealing_key_path
    from shared.sealing import public_key_text

    sealing_key = load_or_create_sealing_key(sealing_key_path(agent))
    proof = load_enrolment_proof(path, agent.resolved_node_id(), sealing_key)
    if proof is None:
        return execution
    return dataclasses.replace(
        execution, enrolment=proof, sealing_public_key=public_key_text(sealing_key)
    )


def supervised_upgrades(stop: asyncio.Event) -> tuple[UpgradeOptions | None, Callable[[], bool]]:
    """How this agent upgrades itself when the upgrade supervisor runs it (it says so in
    the environment it gives: edge/upgrade/supervisor.py), and whether it was asked to
    start again (a version was staged); None where no supervisor runs it."""
    versions_dir = os.environ.get(VERSIONS_DIR_ENV)
    health_file = os.environ.get(HEALTH_FILE_ENV)
    restart = asyncio.Event()

    def request_restart() -> None:
        restart.set()
        stop.set()

    if not versions_dir or not health_file:
        return None, restart.is_set
    options = UpgradeOptions(
        versions_dir=Path(versions_dir),
        health_file=Path(health_file),
        request_restart=request_restart,
    )
    return options, restart.is_set


async def run_agent(
    settings: Settings, stop: asyncio.Event, config_path: Path | None = None
) -> int:
    """`config_path`: the settings file (workers never see it). Returns the process's
    exit code: `RESTART_EXIT_CODE` when a new agent version was staged."""
    upgrades, restart_requested = supervised_upgrades(stop)
    launcher: LauncherFactory | None = None
    execution = ExecutionFacts()
    if settings.agent.runs_training:
        launcher, execution = await training_launcher(settings, config_path)
    execution = await asyncio.to_thread(with_enrolment_proof, settings.agent, execution)
    agent = Agent(
        NodeIdentity.from_settings(settings.agent),
        build_device_probes(settings.agent.probes),
        settings.mqtt,
        telemetry_interval_s=settings.agent.telemetry_interval_s,
        telemetry_jitter_ratio=settings.agent.telemetry_jitter_ratio,
        training_launcher=launcher,
        inference=InferenceOptions(
            cache_dir=settings.agent.resolved_data_dir() / "models",
            cache_max_bytes=settings.agent.model_cache_bytes,
            host=settings.agent.inference_host,
            port=settings.agent.inference_port,
            advertise_host=settings.agent.inference_advertise_host or None,
            max_queue=settings.agent.inference_queue_limit,
        ),
        control_plane_public_key=settings.agent.control_plane_public_key,
        state_dir=settings.agent.resolved_data_dir() / "state",
        outbox_max_bytes=settings.agent.outbox_max_bytes,
        outbox_max_age_s=settings.agent.outbox_max_age_s,
        execution=execution,
        # Enrolled again, the node's new password is in its settings file.
        reload_mqtt_settings=(
            None if config_path is None else lambda: load_settings(config_path).mqtt
        ),
        upgrades=upgrades,
    )
    bind_contextvars(node_id=agent.identity.node_id)
    await run_until_stopped(
        stop, run_then_release_memory(agent, settings.agent.telemetry_interval_s)
    )
    return RESTART_EXIT_CODE if restart_requested() else 0


async def run_then_release_memory(agent: Agent, settle_s: float) -> None:
    """`agent.run()`; and once the node has announced itself and had `settle_s` to take
    its retained documents and send its first telemetry, the memory its start freed
    (imports, settings, discovery) given back to the system, once."""

    async def release_once_settled() -> None:
        await agent.announced.wait()
        await asyncio.sleep(settle_s)
        release_freed_memory()

    releasing = asyncio.ensure_future(release_once_settled())
    try:
        await agent.run()
    finally:
        await cancel_and_wait([releasing])


def release_freed_memory() -> None:
    """Hand the C allocator's free pages back to the system (glibc's `malloc_trim`): an
    agent's start frees about 0.6 MB there that an idle agent never reuses, and glibc
    keeps it resident. Nothing where the C library has no `malloc_trim` (musl)."""
    import ctypes

    try:
        malloc_trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return
    malloc_trim.argtypes = [ctypes.c_size_t]
    malloc_trim.restype = ctypes.c_int
    malloc_trim(0)


class DiscoveryReport(msgspec.Struct, frozen=True):
    node_id: str
    host: object
    accelerators: object
    failed_probes: list[dict[str, str]]


def discovery_report(settings: Settings, result: DiscoveryResult) -> DiscoveryReport:
    return DiscoveryReport(
        node_id=settings.agent.resolved_node_id(),
        host=result.host,
        accelerators=result.accelerators,
        failed_probes=[{"probe": name, "error": error} for name, error in result.failed_probes],
    )


def print_discovery(settings: Settings, as_json: bool, out: TextIO = sys.stdout) -> int:
    probes = build_device_probes(settings.agent.probes)
    try:
        result = discover_all(probes)
    finally:
        for probe in probes.accelerator_probes:
            probe.close()
    if as_json:
        out.write(
            msgspec.json.format(msgspec.json.encode(discovery_report(settings, result))).decode()
        )
        out.write("\n")
        return 0
    host = result.host
    gib = 1024**3
    out.write(
        f"{host.hostname}  {host.os}  {host.arch}  {host.cpu_logical_cores} cores  "
        f"{host.memory_total_bytes / gib:.1f} GiB\n"
    )
    for accelerator in result.accelerators:
        power = (
            f"{accelerator.max_power_w:.0f} W max"
            if accelerator.max_power_w is not None
            else "power unknown"
        )
        providers = ", ".join(accelerator.onnx_providers) or "no ONNX Runtime provider"
        out.write(
            f"  {accelerator.id:<12} {accelerator.kind:<4} {accelerator.vendor:<8} "
            f"{accelerator.model}  {accelerator.memory_bytes / gib:.1f} GiB  "
            f"{accelerator.compute_units} units  {power}  [{providers}]\n"
        )
    for name, error in result.failed_probes:
        out.write(f"  probe {name} failed: {error}\n")
    return 0
