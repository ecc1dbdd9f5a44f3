"""Per-accelerator Prometheus series of the whole fleet, from the registry at scrape time.

GPUs are exported under NVIDIA dcgm-exporter's names, types, units and labels (its
`etc/default-counters.csv`: framebuffer in MiB, energy in mJ and a counter; the labels
of its released versions: `gpu`, `UUID`, `pci_bus_id`, `device`, `modelName`,
`Hostname`), so dashboards and alert rules written for DCGM work unchanged, with
`node`, `site` and `zone` added, and `exporter="greenfed"` on every series: what keeps
them apart from a real dcgm-exporter's scraped by the same Prometheus (the same GPU
seen by both would otherwise count twice in every sum). NPUs and CPUs have
`greenfed_accelerator_*` equivalents in base units. Only online nodes' latest samples
are exported, and a figure a sample lacks is left out rather than reported as zero.

The series are written in the text format here rather than by prometheus_client, for
two reasons. dcgm-exporter's counters keep their DCGM field names, without the `_total`
prometheus_client puts after every counter's name (`# TYPE X_total counter`, the
OpenMetrics rule); queries written for DCGM ask for the bare name, and dcgm-exporter
writes `# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter` over samples of that name,
as this does. And a scrape of a 10,000-GPU fleet is 60,000 GPU lines of ten labels each
(benchmarks/metrics_scrape.py): prometheus_client sorts and escapes every label of
every sample on every scrape, whereas here a device's label text is written once per
birth and reused by every scrape until the node's next birth.

A 10,000-node fleet's text is tens of megabytes (a tenth of a CPU second or more to
write), so `/metrics` writes it in a worker thread (`MetricsRegistries.fleet_exposition_chunks`):
the event loop only takes `online_samples`, a list of each online node's birth and
latest sample, both immutable messages, and `render` reads nothing else, so the loop
can go on changing the registry while the text is written.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from prometheus_client.utils import floatToGoString

from cloud.fleet.registry import NodeRegistry
from shared.messages import Accelerator, NodeStatus, Telemetry

MIB = 1024**2
# Go's exponent form starts at 1e6 (floatToGoString); below it, a finite number's text
# is Python's own repr, which is what a scrape of 150,000 lines mostly writes.
_GO_EXPONENT_FROM = 1e6
_go_number: Callable[[float], str] = floatToGoString


def _number(value: float) -> str:
    """A sample value as prometheus_client and Go's client write it (1.234568e+06, +Inf):
    the same text as prometheus_client's `floatToGoString`, a third of its cost for the
    common case."""
    if -math.inf < value < _GO_EXPONENT_FROM:
        return repr(float(value))
    return _go_number(value)


# Every float from 2**52 up is a whole number already.
_WHOLE_FROM = 2.0**52


def _whole_millijoules(energy_j: float) -> float:
    """A counter in whole mJ, as dcgm-exporter writes it. One too large to round is
    written as it is (1e306 J is an infinity of mJ): `round` would raise on it, and one
    node's sample would fail every scrape of the fleet."""
    energy_mj = energy_j * 1000.0
    return float(round(energy_mj)) if energy_mj < _WHOLE_FROM else energy_mj


# The label on every DCGM_FI_* series of greenfed's; a real dcgm-exporter's have none.
EXPORTER_LABEL = "exporter"
EXPORTER = "greenfed"
# dcgm-exporter's, in the order its GPU template writes them, then greenfed's.
GPU_LABELS = (
    "gpu",
    "UUID",
    "pci_bus_id",
    "device",
    "modelName",
    "Hostname",
    EXPORTER_LABEL,
    "node",
    "site",
    "zone",
)
ACCELERATOR_LABELS = ("node", "accelerator", "kind", "model", "site", "zone")


@dataclass(frozen=True, slots=True)
class Family:
    """One metric family: `name` is its samples' name, as queries use it."""

    name: str
    help: str
    type: str  # "gauge" or "counter"

    def header(self) -> str:
        return f"# HELP {self.name} {self.help}\n# TYPE {self.name} {self.type}\n"


# dcgm-exporter's names, types and help texts (its default counters).
GPU_UTIL = Family("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", "gauge")
FB_USED = Family("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", "gauge")
FB_FREE = Family("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", "gauge")
GPU_POWER = Family("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", "gauge")
GPU_TEMP = Family("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", "gauge")
GPU_ENERGY = Family(
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "Total energy consumption since the agent started (in mJ).",
    "counter",
)
UTILIZATION = Family(
    "greenfed_accelerator_utilization_pct", "NPU or CPU utilisation (in %)", "gauge"
)
MEMORY_USED = Family("greenfed_accelerator_memory_used_bytes", "NPU or CPU memory in use", "gauge")
POWER = Family("greenfed_accelerator_power_watts", "NPU or CPU power draw", "gauge")
TEMPERATURE = Family("greenfed_accelerator_temperature_celsius", "NPU or CPU temperature", "gauge")
ENERGY = Family(
    "greenfed_accelerator_energy_joules_total",
    "NPU or CPU energy since the agent started",
    "counter",
)
# In the order they are written; each is declared even without a series, as
# prometheus_client declares its families.
FAMILIES = (
    GPU_UTIL,
    FB_USED,
    FB_FREE,
    GPU_POWER,
    GPU_TEMP,
    GPU_ENERGY,
    UTILIZATION,
    MEMORY_USED,
    POWER,
    TEMPERATURE,
    ENERGY,
)


def _escaped(value: str) -> str:
    """A label value as the text format quotes it."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def label_text(names: tuple[str, ...], values: tuple[str, ...]) -> str:
    pairs = ",".join(
        f'{name}="{_escaped(value)}"' for name, value in zip(names, values, strict=True)
    )
    return "{" + pairs + "}"


@dataclass(frozen=True, slots=True)
class _Device:
    """One device of a birth with the label text all its series share (`{...}`)."""

    is_gpu: bool
    memory_bytes: int
    labels: str


def _device(status: NodeStatus, accelerator: Accelerator) -> _Device:
    if accelerator.kind == "gpu":
        index = accelerator.index
        values: tuple[str, ...] = (
            # A MIG instance has no device index: its accelerator id stands in for one,
            # and no device node is its own (dcgm-exporter labels an instance with its
            # GPU's index and device plus GPU_I_ID; greenfed has no GPU index for it).
            str(index) if index is not None else accelerator.id,
            accelerator.uuid or "",
            accelerator.pci_bus_id,
            f"nvidia{index}" if index is not None else "",
            accelerator.model,
            # What a dcgm-exporter on that machine says (os.Hostname); the node id when
            # the birth names no host.
            status.host.hostname or status.node_id,
            EXPORTER,
            status.node_id,
            status.site,
            status.zone,
        )
        return _Device(True, accelerator.memory_bytes, label_text(GPU_LABELS, values))
    values = (
        status.node_id,
        accelerator.id,
        accelerator.kind,
        accelerator.model,
        status.site,
        status.zone,
    )
    return _Device(False, accelerator.memory_bytes, label_text(ACCELERATOR_LABELS, values))


def online_samples(registry: NodeRegistry) -> list[tuple[NodeStatus, Telemetry]]:
    """Each online node's birth and latest sample (a node without one has none), taken
    where the registry changes (the event loop): what a scrape's worker thread writes
    series from, here and in cloud/usage/metrics.py (`ZonePower`)."""
    return [
        (record.status, record.telemetry)
        for record in registry
        if record.state == "online" and record.telemetry is not None
    ]


class AcceleratorMetrics:
    """The per-accelerator families of the registry's online nodes, as text."""

    def __init__(self, registry: NodeRegistry) -> None:
        self._registry = registry
        # node id -> (the birth its devices were built from, devices by accelerator id);
        # read and written by `render` alone, one render at a time.
        self._devices: dict[str, tuple[NodeStatus, dict[str, _Device]]] = {}
        self._rendering = threading.Lock()

    def _devices_of(self, status: NodeStatus) -> dict[str, _Device]:
        cached = self._devices.get(status.node_id)
        if cached is not None and cached[0] is status:
            return cached[1]
        devices = {
            accelerator.id: _device(status, accelerator) for accelerator in status.accelerators
        }
        self._devices[status.node_id] = (status, devices)
        return devices

    def online_samples(self) -> list[tuple[NodeStatus, Telemetry]]:
        """What `render` reads (`online_samples` of the registry)."""
        return online_samples(self._registry)

    def exposition(self) -> bytes:
        """Every family in the Prometheus text format, one line per series."""
        return b"".join(self.render(self.online_samples()))

    def render(self, samples: Sequence[tuple[NodeStatus, Telemetry]]) -> list[bytes]:
        """Every family of `samples` (`online_samples`) in the text format, a chunk per
        family: a few megabytes each, so that no single join or encode holds the GIL
        for long while the event loop waits for it, and the body is never copied whole
        (`/metrics` writes the chunks as they are). Safe in any thread: it reads
        immutable messages only."""
        with self._rendering:
            return self._chunks(samples)

    def _chunks(self, samples: Sequence[tuple[NodeStatus, Telemetry]]) -> list[bytes]:
        lines: dict[Family, list[str]] = {family: [] for family in FAMILIES}
        gpu_util, fb_used, fb_free = lines[GPU_UTIL], lines[FB_USED], lines[FB_FREE]
        gpu_power, gpu_temp, gpu_energy = lines[GPU_POWER], lines[GPU_TEMP], lines[GPU_ENERGY]
        utilization, memory_used = lines[UTILIZATION], lines[MEMORY_USED]
        power, temperature, energy = lines[POWER], lines[TEMPERATURE], lines[ENERGY]
        number = _number

        live: set[str] = set()
        for status, telemetry in samples:
            live.add(status.node_id)
            devices = self._devices_of(status)
            for sample in telemetry.accelerators:
                device = devices.get(sample.id)
                if device is None:
                    continue
                labels = device.labels
                if device.is_gpu:
                    gpu_util.append(
                        f"DCGM_FI_DEV_GPU_UTIL{labels} {number(sample.utilization_pct)}\n"
                    )
                    used_mib = sample.memory_used_bytes // MIB
                    fb_used.append(f"DCGM_FI_DEV_FB_USED{labels} {number(used_mib)}\n")
                    if device.memory_bytes:
                        free_mib = max(0, device.memory_bytes - sample.memory_used_bytes) // MIB
                        fb_free.append(f"DCGM_FI_DEV_FB_FREE{labels} {number(free_mib)}\n")
                    if sample.power_w is not None:
                        gpu_power.append(
                            f"DCGM_FI_DEV_POWER_USAGE{labels} {number(sample.power_w)}\n"
                        )
                    if sample.temperature_c is not None:
                        gpu_temp.append(
                            f"DCGM_FI_DEV_GPU_TEMP{labels} {number(sample.temperature_c)}\n"
                        )
                    if sample.energy_j is not None:
                        energy_mj = _whole_millijoules(sample.energy_j)
                        gpu_energy.append(
                            f"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{labels} {number(energy_mj)}\n"
                        )
                    continue
                utilization.append(
                    f"greenfed_accelerator_utilization_pct{labels} "
                    f"{number(sample.utilization_pct)}\n"
                )
                memory_used.append(
                    f"greenfed_accelerator_memory_used_bytes{labels} "
                    f"{number(sample.memory_used_bytes)}\n"
                )
                if sample.power_w is not None:
                    power.append(
                        f"greenfed_accelerator_power_watts{labels} {number(sample.power_w)}\n"
                    )
                if sample.temperature_c is not None:
                    temperature.append(
                        f"greenfed_accelerator_temperature_celsius{labels} "
                        f"{number(sample.temperature_c)}\n"
                    )
                if sample.energy_j is not None:
                    energy.append(
                        f"greenfed_accelerator_energy_joules_total{labels} "
                        f"{number(sample.energy_j)}\n"
                    )
        for node_id in self._devices.keys() - live:
            self._devices.pop(node_id, None)  # gone or offline: built again on its return
        chunks: list[bytes] = []
        for family, family_lines in lines.items():
            chunks.append(family.header().encode())
            chunks.append("".join(family_lines).encode())
            family_lines.clear()  # its strings freed as soon as they are encoded
        return chunks
