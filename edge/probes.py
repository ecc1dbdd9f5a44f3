"""The seam between the agent and the hardware it runs on.

A probe discovers some accelerators once and samples them periodically; a GPU power
control holds GPUs to a power limit (carbon-aware power capping of training). Real
ones talk to NVML, psutil and sysfs (edge/discovery/); simulated devices
(sim_devices/) implement the same protocols, so the agent code is identical.

Probe and power control methods are blocking (NVML, /proc reads) and are always
called off the event loop by the agent.
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


class PowerLimitUnavailable(Exception):
    """A GPU's power limit cannot be set or restored; `why` says so for people (it ends
    up in the worker's reported `power_limit_note`)."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def physical_gpu_id(gpu: Accelerator) -> str:
    """The GPU whose power limit `gpu` runs under: a MIG instance's parent, or itself."""
    return gpu.parent_id or gpu.id


class GpuPowerControl(Protocol):
    """Power limits of the physical GPUs: the GPU itself, or a MIG instance's parent
    (NVML limits power per physical GPU only). Not safe for concurrent calls: the
    agent makes one at a time, in a thread."""

    def set_power_limit_w(self, gpu: Accelerator, limit_w: float) -> float:
        """Hold the physical GPU of `gpu` to `limit_w`, clamped into the range the
        device allows; the limit applied, W. Raises PowerLimitUnavailable."""
        ...

    def restore_default_power_limit(self, gpu: Accelerator) -> None:
        """Give the physical GPU of `gpu` its default power limit back. Raises
        PowerLimitUnavailable."""
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
    # What sets GPU power limits for training workers; None: nothing can here.
    gpu_power: GpuPowerControl | None = None
