"""Per-accelerator Prometheus series of the whole fleet, from the registry at scrape time.

GPUs are exported under NVIDIA dcgm-exporter's names, units and labels (its
`etc/default-counters.csv`: framebuffer in MiB, energy in mJ), so dashboards and
alert rules written for DCGM work unchanged, with `node`, `site` and `zone` added.
NPUs and CPUs have `greenfed_accelerator_*` equivalents in base units. Only online
nodes' latest samples are exported, and a figure a sample lacks is left out rather
than reported as zero.

A scrape of a 10,000-GPU fleet is one pass over the registry (benchmarks/
metrics_scrape.py): the label sets of a node's devices are built once per birth and
reused by every scrape until the node's next birth.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from cloud.fleet.registry import NodeRegistry
from shared.messages import Accelerator, NodeStatus

MIB = 1024**2

GPU_LABELS = ("gpu", "UUID", "modelName", "Hostname", "node", "site", "zone")
ACCELERATOR_LABELS = ("node", "accelerator", "kind", "model", "site", "zone")


@dataclass(frozen=True, slots=True)
class _Device:
    """One device of a birth with the label set all its series share."""

    is_gpu: bool
    memory_bytes: int
    labels: dict[str, str]


def _device(status: NodeStatus, accelerator: Accelerator) -> _Device:
    if accelerator.kind == "gpu":
        # A MIG instance has no device index: its accelerator id stands in for one.
        index = str(accelerator.index) if accelerator.index is not None else accelerator.id
        values: tuple[str, ...] = (
            index,
            accelerator.uuid or "",
            accelerator.model,
            status.host.hostname,
            status.node_id,
            status.site,
            status.zone,
        )
        return _Device(True, accelerator.memory_bytes, dict(zip(GPU_LABELS, values, strict=True)))
    values = (
        status.node_id,
        accelerator.id,
        accelerator.kind,
        accelerator.model,
        status.site,
        status.zone,
    )
    return _Device(
        False, accelerator.memory_bytes, dict(zip(ACCELERATOR_LABELS, values, strict=True))
    )


class AcceleratorCollector(Collector):
    def __init__(self, registry: NodeRegistry) -> None:
        self._registry = registry
        # node id -> (the birth its devices were built from, devices by accelerator id)
        self._devices: dict[str, tuple[NodeStatus, dict[str, _Device]]] = {}

    def _devices_of(self, status: NodeStatus) -> dict[str, _Device]:
        cached = self._devices.get(status.node_id)
        if cached is not None and cached[0] is status:
            return cached[1]
        devices = {
            accelerator.id: _device(status, accelerator) for accelerator in status.accelerators
        }
        self._devices[status.node_id] = (status, devices)
        return devices

    def collect(self) -> Iterator[Metric]:
        gpu_util = Metric("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", "gauge")
        fb_used = Metric("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", "gauge")
        fb_free = Metric("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", "gauge")
        gpu_power = Metric("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", "gauge")
        gpu_temp = Metric("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", "gauge")
        # dcgm-exporter types this a counter, but the text format prometheus_client writes
        # would then name it ..._total; untyped keeps dcgm's exact name (rate() works).
        gpu_energy = Metric(
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
            "Total energy consumption since the agent started (in mJ).",
            "unknown",
        )
        utilization = Metric(
            "greenfed_accelerator_utilization_pct", "NPU or CPU utilisation (in %)", "gauge"
        )
        memory = Metric(
            "greenfed_accelerator_memory_used_bytes", "NPU or CPU memory in use", "gauge"
        )
        power = Metric("greenfed_accelerator_power_watts", "NPU or CPU power draw", "gauge")
        temperature = Metric(
            "greenfed_accelerator_temperature_celsius", "NPU or CPU temperature", "gauge"
        )
        energy = Metric(
            "greenfed_accelerator_energy_joules",
            "NPU or CPU energy since the agent started",
            "counter",
        )
        # Appended to directly: one Sample per series, no per-sample label dict.
        gpu_util_s, fb_used_s, fb_free_s = gpu_util.samples, fb_used.samples, fb_free.samples
        gpu_power_s, gpu_temp_s = gpu_power.samples, gpu_temp.samples
        gpu_energy_s = gpu_energy.samples
        util_s, memory_s, power_s = utilization.samples, memory.samples, power.samples
        temperature_s, energy_s = temperature.samples, energy.samples

        live: set[str] = set()
        for record in self._registry:
            telemetry = record.telemetry
            if record.state != "online" or telemetry is None:
                continue
            live.add(record.node_id)
            devices = self._devices_of(record.status)
            for sample in telemetry.accelerators:
                device = devices.get(sample.id)
                if device is None:
                    continue
                labels = device.labels
                if device.is_gpu:
                    gpu_util_s.append(
                        Sample("DCGM_FI_DEV_GPU_UTIL", labels, sample.utilization_pct)
                    )
                    used_mib = sample.memory_used_bytes // MIB
                    fb_used_s.append(Sample("DCGM_FI_DEV_FB_USED", labels, used_mib))
                    if device.memory_bytes:
                        free_mib = max(0, device.memory_bytes - sample.memory_used_bytes) // MIB
                        fb_free_s.append(Sample("DCGM_FI_DEV_FB_FREE", labels, free_mib))
                    if sample.power_w is not None:
                        gpu_power_s.append(
                            Sample("DCGM_FI_DEV_POWER_USAGE", labels, sample.power_w)
                        )
                    if sample.temperature_c is not None:
                        gpu_temp_s.append(
                            Sample("DCGM_FI_DEV_GPU_TEMP", labels, sample.temperature_c)
                        )
                    if sample.energy_j is not None:
                        gpu_energy_s.append(
                            Sample(
                                "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
                                labels,
                                round(sample.energy_j * 1000.0),
                            )
                        )
                    continue
                util_s.append(
                    Sample("greenfed_accelerator_utilization_pct", labels, sample.utilization_pct)
                )
                memory_s.append(
                    Sample(
                        "greenfed_accelerator_memory_used_bytes", labels, sample.memory_used_bytes
                    )
                )
                if sample.power_w is not None:
                    power_s.append(
                        Sample("greenfed_accelerator_power_watts", labels, sample.power_w)
                    )
                if sample.temperature_c is not None:
                    temperature_s.append(
                        Sample(
                            "greenfed_accelerator_temperature_celsius",
                            labels,
                            sample.temperature_c,
                        )
                    )
                if sample.energy_j is not None:
                    energy_s.append(
                        Sample("greenfed_accelerator_energy_joules_total", labels, sample.energy_j)
                    )
        for node_id in self._devices.keys() - live:
            self._devices.pop(node_id, None)  # gone or offline: built again on its return
        yield from (gpu_util, fb_used, fb_free, gpu_power, gpu_temp, gpu_energy)
        yield from (utilization, memory, power, temperature, energy)
