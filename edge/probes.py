"""The seam between the agent and the hardware it runs on.

A probe discovers some accelerators once and samples them periodically. Real
probes talk to NVML, psutil and sysfs (edge/discovery/); simulated devices
(sim_devices/) implement the same protocol, so the agent code is identical.

Probe methods are blocking (NVML, /proc reads) and are always called off the
event loop by the agent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from shared.messages import Accelerator, AcceleratorSample, HostInfo


@dataclass(frozen=True, slots=True)
class HostSample:
    cpu_utilization_pct: float
    memory_used_bytes: int
    memory_total_bytes: int


class AcceleratorProbe(Protocol):
    """One discovery plugin: a family of devices (NVIDIA GPUs, NPUs, the CPU)."""

    @property
    def name(self) -> str: ...

    def discover(self) -> Sequence[Accelerator]:
        """The devices present. No device or no driver is an empty list, not an error."""
        ...

    def sample(self) -> Sequence[AcceleratorSample]:
        """Current readings for the devices `discover` returned."""
        ...

    def close(self) -> None:
        """Release driver handles (e.g. nvmlShutdown)."""
        ...


class HostProbe(Protocol):
    def host_info(self) -> HostInfo: ...

    def sample(self) -> HostSample: ...


@dataclass(frozen=True, slots=True)
class DeviceProbes:
    """Everything the agent needs to know about its machine."""

    host: HostProbe
    accelerator_probes: tuple[AcceleratorProbe, ...]
