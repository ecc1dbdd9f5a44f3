"""Accelerator discovery plugins and the one place that runs them.

`build_device_probes` turns the configured probe names into real probes (and, with
the NVIDIA probe, NVML's GPU power control: edge/discovery/nvidia_power.py);
`discover_all` and `sample_all` call every probe with failures isolated: a
probe that raises is logged and reported as failed, the others carry on.
All functions here block (NVML, psutil, sysfs); the agent calls them in a thread.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from edge.discovery.cpu import CpuProbe, LocalHostProbe
from edge.discovery.npu import NpuProbe
from edge.discovery.nvidia import NvidiaProbe
from edge.discovery.nvidia_power import NvmlPowerControl
from edge.probes import AcceleratorProbe, DeviceProbes, HostSample
from shared.lean_logs import get_logger
from shared.messages import Accelerator, AcceleratorSample, HostInfo

__all__ = [
    "PROBE_NAMES",
    "DiscoveryResult",
    "build_device_probes",
    "device_faults",
    "discover_all",
    "sample_all",
]

log = get_logger(__name__)

_PROBE_FACTORIES: Mapping[str, Callable[[], AcceleratorProbe]] = MappingProxyType(
    {"cpu": CpuProbe, "nvidia": NvidiaProbe, "npu": NpuProbe}
)
PROBE_NAMES: tuple[str, ...] = tuple(_PROBE_FACTORIES)
"""The probe names settings may enable."""

ProbeFailure = tuple[str, str]
"""(probe name, error message)"""


@dataclass(frozen=True, slots=True)
class DiscoveryResult:
    host: HostInfo
    accelerators: tuple[Accelerator, ...]
    failed_probes: tuple[ProbeFailure, ...]


def build_device_probes(enabled: Sequence[str]) -> DeviceProbes:
    """Real probes for the enabled names ("cpu", "nvidia", "npu"), plus the host probe.

    Raises ValueError naming an unknown probe. A name given twice gives one probe.
    """
    unknown = [name for name in enabled if name not in _PROBE_FACTORIES]
    if unknown:
        raise ValueError(
            f"unknown device probe(s) {', '.join(map(repr, unknown))}; "
            f"known: {', '.join(PROBE_NAMES)}"
        )
    names = dict.fromkeys(enabled)  # dedupe, keep order
    return DeviceProbes(
        host=LocalHostProbe(),
        accelerator_probes=tuple(_PROBE_FACTORIES[name]() for name in names),
        # Loads NVML only when a training worker asks for a power limit.
        gpu_power=NvmlPowerControl() if "nvidia" in names else None,
    )


def _describe(error: Exception) -> str:
    message = str(error)
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


def discover_all(probes: DeviceProbes) -> DiscoveryResult:
    """Host facts and every probe's devices; a probe that raises is reported, not fatal.

    The host probe (psutil, platform) is not isolated: without host facts there is
    no status message to send, so its failure propagates.
    """
    accelerators: list[Accelerator] = []
    failures: list[ProbeFailure] = []
    for probe in probes.accelerator_probes:
        try:
            accelerators.extend(probe.discover())
        except Exception as error:
            log.warning(
                "device probe discovery failed",
                probe=probe.name,
                error=_describe(error),
                exc_info=error,
            )
            failures.append((probe.name, _describe(error)))
    return DiscoveryResult(
        host=probes.host.host_info(),
        accelerators=tuple(accelerators),
        failed_probes=tuple(failures),
    )


def sample_all(
    probes: DeviceProbes, working_probe_names: Collection[str]
) -> tuple[HostSample, tuple[AcceleratorSample, ...], tuple[ProbeFailure, ...]]:
    """One telemetry round: the host sample, samples of the working probes, and failures.

    Only probes named in `working_probe_names` (those whose discovery succeeded)
    are sampled. A probe whose sample() raises contributes nothing this round and
    is reported; it is asked again next round.
    """
    samples: list[AcceleratorSample] = []
    failures: list[ProbeFailure] = []
    for probe in probes.accelerator_probes:
        if probe.name not in working_probe_names:
            continue
        try:
            samples.extend(probe.sample())
        except Exception as error:
            log.warning(
                "device probe sampling failed",
                probe=probe.name,
                error=_describe(error),
                exc_info=error,
            )
            failures.append((probe.name, _describe(error)))
    return probes.host.sample(), tuple(samples), tuple(failures)


def device_faults(probes: DeviceProbes, working_probe_names: Collection[str]) -> dict[str, str]:
    """Accelerator id -> why its driver says it failed, from the probes that can tell
    (NVIDIA's critical XID events); a probe that cannot has no such method."""
    faults: dict[str, str] = {}
    for probe in probes.accelerator_probes:
        read = getattr(probe, "device_faults", None)
        if probe.name not in working_probe_names or read is None:
            continue
        try:
            faults.update(read())
        except Exception as error:
            log.warning("device probe faults failed", probe=probe.name, error=_describe(error))
    return faults
