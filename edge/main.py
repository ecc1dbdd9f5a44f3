"""`greenfed edge run` and `greenfed edge discover`."""

from __future__ import annotations

import asyncio
import sys
from typing import TextIO

import msgspec
import structlog

from edge.agent import Agent, NodeIdentity
from edge.discovery import DiscoveryResult, build_device_probes, discover_all
from edge.inference.options import InferenceOptions
from shared.runtime import run_until_stopped
from shared.settings import Settings


async def run_agent(settings: Settings, stop: asyncio.Event) -> int:
    launcher = None
    if settings.agent.runs_training:
        # Only nodes that run training workers load their launcher (edge devices do not).
        from edge.training.process import ProcessLauncher

        launcher = ProcessLauncher(
            settings.agent.resolved_data_dir() / "jobs",
            max_log_bytes=settings.agent.max_job_log_bytes,
        )
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
    )
    structlog.contextvars.bind_contextvars(node_id=agent.identity.node_id)
    await run_until_stopped(stop, agent.run())
    return 0


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
