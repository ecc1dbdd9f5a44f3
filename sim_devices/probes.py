"""Simulated probes: the hardware seam of a simulated node.

Utilisation follows a mean-reverting random walk around the profile's typical
load; power is idle + utilisation x (max - idle), never above the power limit a
GPU is held to (carbon-aware power capping of training); energy is power
integrated over the time between samples (trapezoidal rule). Everything above
this seam (the agent, MQTT, the cloud) is the real code.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from edge.probes import DeviceProbes, HostSample, PowerLimitUnavailable
from shared.messages import Accelerator, AcceleratorSample, HostInfo
from shared.mig_profiles import COMPUTE_SLICES, compute_sevenths, mig_memory_bytes, slice_model
from sim_devices.profiles import (
    CPU_PROVIDERS,
    AcceleratorProfile,
    DeviceProfile,
    clamped_power_limit_w,
)

# Random-walk parameters per sample: pull towards the mean, and step noise.
MEAN_REVERSION = 0.2
STEP_STDDEV = 0.08


@dataclass(slots=True)
class _SimulatedDevice:
    accelerator: Accelerator
    idle_power_w: float
    max_power_w: float
    utilization: float
    energy_j: float = 0.0
    last_power_w: float = 0.0
    power_limit_w: float | None = None  # None: the default (max_power_w)


def _power_w(device: _SimulatedDevice) -> float:
    power_w = device.idle_power_w + device.utilization * (device.max_power_w - device.idle_power_w)
    return power_w if device.power_limit_w is None else min(power_w, device.power_limit_w)


class SimulatedNode:
    """All simulated hardware of one node; thread-safe because the agent samples in a thread."""

    def __init__(
        self,
        node_id: str,
        profile: DeviceProfile,
        rng: random.Random,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node_id = node_id
        self.profile = profile
        self._rng = rng
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._last_sample_at: float | None = None
        self._devices = [self._cpu_device(), *self._accelerator_devices()]
        self._failed: set[str] = set()  # devices that stopped answering (`fail`)
        self._memory_used_fraction = 0.3

    def _start_utilization(self) -> float:
        return min(1.0, max(0.0, self._rng.gauss(self.profile.typical_utilization, 0.1)))

    def _cpu_device(self) -> _SimulatedDevice:
        profile = self.profile
        cpu = Accelerator(
            id="cpu0",
            kind="cpu",
            vendor=profile.cpu_vendor,
            model=profile.cpu_model,
            memory_bytes=profile.memory_bytes,
            compute_units=profile.cpu_cores,
            idle_power_w=profile.cpu_idle_power_w,
            max_power_w=profile.cpu_max_power_w,
            relative_speed=profile.cpu_relative_speed,
            onnx_providers=CPU_PROVIDERS,
        )
        return _SimulatedDevice(
            cpu, profile.cpu_idle_power_w, profile.cpu_max_power_w, self._start_utilization()
        )

    def _accelerator_devices(self) -> list[_SimulatedDevice]:
        devices = []
        # Devices of one kind are numbered across the profile's entries (gpu0 may be cut
        # into MIG slices, gpu1 whole).
        next_index: dict[str, int] = {}
        for accelerator_profile in self.profile.accelerators:
            first = next_index.get(accelerator_profile.kind, 0)
            next_index[accelerator_profile.kind] = first + accelerator_profile.count
            for index in range(first, first + accelerator_profile.count):
                uuid_hex = f"{self._rng.getrandbits(128):032x}"
                prefix = "GPU" if accelerator_profile.kind == "gpu" else "NPU"
                # One bus per card, written as NVML writes it.
                bus_id = f"00000000:{0x18 + index:02X}:00.0" if accelerator_profile.on_pci else ""
                if accelerator_profile.mig_profile is not None:
                    devices.extend(self._mig_slices(accelerator_profile, index, bus_id))
                    continue
                accelerator = Accelerator(
                    id=f"{accelerator_profile.kind}{index}",
                    kind=accelerator_profile.kind,
                    vendor=accelerator_profile.vendor,
                    model=accelerator_profile.model,
                    memory_bytes=accelerator_profile.memory_bytes,
                    compute_units=accelerator_profile.compute_units,
                    idle_power_w=accelerator_profile.idle_power_w,
                    max_power_w=accelerator_profile.max_power_w,
                    relative_speed=accelerator_profile.relative_speed,
                    onnx_providers=accelerator_profile.onnx_providers,
                    uuid=f"{prefix}-{uuid_hex[:8]}-{uuid_hex[8:12]}-{uuid_hex[12:16]}-"
                    f"{uuid_hex[16:20]}-{uuid_hex[20:]}",
                    index=index,
                    pci_bus_id=bus_id,
                )
                devices.append(
                    _SimulatedDevice(
                        accelerator,
                        accelerator_profile.idle_power_w,
                        accelerator_profile.max_power_w,
                        self._start_utilization(),
                    )
                )
        return devices

    def _mig_slices(
        self, gpu: AcceleratorProfile, index: int, bus_id: str
    ) -> list[_SimulatedDevice]:
        """GPU ``index`` in MIG mode, as discovery lists it (edge/discovery/nvidia.py):
        its instances "gpu{index}-mig{j}", each addressed by its MIG UUID alone, with its
        share of the GPU's compute, speed and power; the physical GPU itself is not
        listed."""
        profile = gpu.mig_profile
        assert profile is not None
        sevenths = compute_sevenths(profile)
        share = sevenths / COMPUTE_SLICES
        slices = []
        for slot in range(COMPUTE_SLICES // sevenths):
            uuid_hex = f"{self._rng.getrandbits(128):032x}"
            accelerator = Accelerator(
                id=f"gpu{index}-mig{slot}",
                kind="gpu",
                vendor=gpu.vendor,
                model=slice_model(gpu.model, profile),
                memory_bytes=mig_memory_bytes(profile),
                compute_units=gpu.compute_units * sevenths // COMPUTE_SLICES,
                idle_power_w=gpu.idle_power_w * share,
                max_power_w=gpu.max_power_w * share,
                relative_speed=gpu.relative_speed * share,
                onnx_providers=gpu.onnx_providers,
                uuid=f"MIG-{uuid_hex[:8]}-{uuid_hex[8:12]}-{uuid_hex[12:16]}-"
                f"{uuid_hex[16:20]}-{uuid_hex[20:]}",
                parent_id=f"gpu{index}",
                pci_bus_id=bus_id,
            )
            slices.append(
                _SimulatedDevice(
                    accelerator,
                    gpu.idle_power_w * share,
                    gpu.max_power_w * share,
                    self._start_utilization(),
                )
            )
        return slices

    @property
    def accelerators(self) -> tuple[Accelerator, ...]:
        return tuple(device.accelerator for device in self._devices)

    def host_info(self) -> HostInfo:
        return HostInfo(
            hostname=self.node_id,
            os="Linux (simulated)",
            arch=self.profile.arch,
            cpu_logical_cores=self.profile.cpu_cores,
            memory_total_bytes=self.profile.memory_bytes,
        )

    def advance(self) -> None:
        """Step every device's random walk and integrate energy up to now."""
        with self._lock:
            now = self._monotonic()
            elapsed_s = 0.0 if self._last_sample_at is None else now - self._last_sample_at
            self._last_sample_at = now
            mean = self.profile.typical_utilization
            for device in self._devices:
                previous_power_w = device.last_power_w or _power_w(device)
                step = MEAN_REVERSION * (mean - device.utilization)
                step += self._rng.gauss(0.0, STEP_STDDEV)
                device.utilization = min(1.0, max(0.0, device.utilization + step))
                device.last_power_w = _power_w(device)
                device.energy_j += 0.5 * (previous_power_w + device.last_power_w) * elapsed_s
            self._memory_used_fraction = min(
                0.95, max(0.05, self._memory_used_fraction + self._rng.gauss(0.0, 0.02))
            )

    def fail(self, accelerator_id: str, failed: bool = True) -> None:
        """Make a device stop answering (as a GPU that fell off the bus), or answer again."""
        with self._lock:
            if failed:
                self._failed.add(accelerator_id)
            else:
                self._failed.discard(accelerator_id)

    def set_power_limit_w(self, gpu: Accelerator, limit_w: float) -> float:
        """Hold a simulated GPU to `limit_w`, clamped as its driver would; the limit held."""
        with self._lock:
            device = self._power_limited_device(gpu)
            held_w = clamped_power_limit_w(device.accelerator, limit_w)
            if held_w is None:
                raise PowerLimitUnavailable(f"{gpu.id} does not support power limits")
            device.power_limit_w = held_w
            # The board obeys at once, not at the next telemetry round.
            device.last_power_w = min(device.last_power_w, held_w)
            return held_w

    def restore_default_power_limit(self, gpu: Accelerator) -> None:
        with self._lock:
            self._power_limited_device(gpu).power_limit_w = None

    def _power_limited_device(self, gpu: Accelerator) -> _SimulatedDevice:
        for device in self._devices:
            if device.accelerator.id == gpu.id:
                if gpu.id in self._failed:
                    raise PowerLimitUnavailable(f"{gpu.id} is not answering")
                return device
        raise PowerLimitUnavailable(f"{gpu.id} is not on this node")

    def accelerator_samples(self) -> list[AcceleratorSample]:
        with self._lock:
            return [
                AcceleratorSample(
                    id=device.accelerator.id,
                    utilization_pct=round(device.utilization * 100.0, 2),
                    memory_used_bytes=int(
                        device.accelerator.memory_bytes * device.utilization * 0.8
                    ),
                    power_w=round(device.last_power_w, 3),
                    temperature_c=round(30.0 + 50.0 * device.utilization, 1)
                    if device.accelerator.kind == "gpu"
                    else None,
                    energy_j=round(device.energy_j, 3),
                )
                for device in self._devices
                if device.accelerator.id not in self._failed
            ]

    def host_sample(self) -> HostSample:
        with self._lock:
            cpu = self._devices[0]
            return HostSample(
                cpu_utilization_pct=round(cpu.utilization * 100.0, 2),
                memory_used_bytes=int(self.profile.memory_bytes * self._memory_used_fraction),
                memory_total_bytes=self.profile.memory_bytes,
            )

    def probes(self) -> DeviceProbes:
        return DeviceProbes(
            host=_SimHostProbe(self),
            accelerator_probes=(_SimAcceleratorProbe(self),),
            gpu_power=_SimGpuPower(self),
        )


class _SimHostProbe:
    def __init__(self, node: SimulatedNode) -> None:
        self._node = node

    def host_info(self) -> HostInfo:
        return self._node.host_info()

    def sample(self) -> HostSample:
        return self._node.host_sample()


class _SimAcceleratorProbe:
    name = "simulated"

    def __init__(self, node: SimulatedNode) -> None:
        self._node = node

    def discover(self) -> Sequence[Accelerator]:
        return self._node.accelerators

    def sample(self) -> Sequence[AcceleratorSample]:
        # The agent samples accelerators once per telemetry round, so this is the clock tick.
        self._node.advance()
        return self._node.accelerator_samples()

    def close(self) -> None:
        return None


class _SimGpuPower:
    """GpuPowerControl (edge/probes.py) over the simulated GPUs: simulated GPUs have no
    MIG instances, so each is its own physical GPU."""

    def __init__(self, node: SimulatedNode) -> None:
        self._node = node

    def set_power_limit_w(self, gpu: Accelerator, limit_w: float) -> float:
        return self._node.set_power_limit_w(gpu, limit_w)

    def restore_default_power_limit(self, gpu: Accelerator) -> None:
        self._node.restore_default_power_limit(gpu)

    def close(self) -> None:
        return None
