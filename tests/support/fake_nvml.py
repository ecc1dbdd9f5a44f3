"""A fake NVML at the pynvml seam: the subset of pynvml that the NVIDIA probe
(edge/discovery/nvidia.py) and the GPU power control (edge/discovery/nvidia_power.py)
call, over fake GPUs and MIG instances, answering as the driver does."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pynvml
import pytest


@dataclass
class FakeMig:
    name: str
    uuid: str
    memory_total_bytes: int
    memory_used_bytes: int
    sm_count: int
    failing: dict[str, type[Exception]] = field(default_factory=dict)


@dataclass
class FakeGpu:
    name: str
    uuid: str
    memory_total_bytes: int
    memory_used_bytes: int = 0
    power_limit_mw: int = 400_000  # the limit it is held to now
    # None: the limit it started with (`power_limit_mw`), as the driver's default.
    default_power_limit_mw: int | None = None
    # nvmlDeviceGetPowerManagementLimitConstraints; max None: the default limit.
    min_power_limit_mw: int = 100_000
    max_power_limit_mw: int | None = None
    power_usage_mw: int = 60_000
    temperature_c: int = 40
    utilization_pct: int = 0
    energy_mj: int | None = 1_000_000
    # None: nvmlDeviceGetAttributes is NotSupported (full GPUs on most drivers).
    sm_count: int | None = None
    mig_enabled: bool = False
    # nvmlPciInfo_t.busId as pynvml hands it out (decoded; bytes from an older pynvml).
    pci_bus_id: str | bytes = "00000000:00:00.0"
    # MIG slot index -> instance; empty slots answer NotFound.
    migs: dict[int, FakeMig] = field(default_factory=dict)
    # NVML function name -> error that call raises for this GPU.
    failing: dict[str, type[Exception]] = field(default_factory=dict)
    # Every nvmlDeviceSetPowerManagementLimit that took, mW.
    limits_set_mw: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.default_power_limit_mw is None:
            self.default_power_limit_mw = self.power_limit_mw
        if self.max_power_limit_mw is None:
            self.max_power_limit_mw = self.default_power_limit_mw


class FakeNvml:
    """The subset of pynvml the probe uses, over a fixed set of fake GPUs."""

    MAX_MIG_SLOTS = 7

    def __init__(self, gpus: list[FakeGpu]) -> None:
        self.gpus = gpus
        self.init_calls = 0
        self.shutdown_calls = 0
        self.init_error: type[Exception] | None = None
        # XID events the driver has raised and not yet handed out: (GPU, XID number).
        self.pending_events: list[tuple[FakeGpu, int]] = []
        self.registered: list[str] = []  # UUIDs of the GPUs registered for XID events
        self.event_sets_freed = 0

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for name in dir(self):
            if name.startswith("nvml"):
                monkeypatch.setattr(pynvml, name, getattr(self, name))

    def _gpu(self, handle: FakeGpu | FakeMig, call: str) -> FakeGpu | FakeMig:
        if call in handle.failing:
            raise handle.failing[call]()
        return handle

    def _parent_only(self, handle: FakeGpu | FakeMig, call: str) -> FakeGpu:
        gpu = self._gpu(handle, call)
        if not isinstance(gpu, FakeGpu):
            raise pynvml.NVMLError_NotSupported()
        return gpu

    def nvmlInit(self) -> None:
        self.init_calls += 1
        if self.init_error is not None:
            raise self.init_error()

    def nvmlShutdown(self) -> None:
        self.shutdown_calls += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        gpu = self.gpus[index]
        self._gpu(gpu, "nvmlDeviceGetHandleByIndex")
        return gpu

    def nvmlDeviceGetName(self, handle: FakeGpu | FakeMig) -> str:
        return self._gpu(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetUUID(self, handle: FakeGpu | FakeMig) -> str:
        return self._gpu(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetPciInfo(self, handle: FakeGpu | FakeMig) -> SimpleNamespace:
        gpu = self._parent_only(handle, "nvmlDeviceGetPciInfo")
        return SimpleNamespace(busId=gpu.pci_bus_id)

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu | FakeMig) -> SimpleNamespace:
        device = self._gpu(handle, "nvmlDeviceGetMemoryInfo")
        return SimpleNamespace(
            total=device.memory_total_bytes,
            used=device.memory_used_bytes,
            free=device.memory_total_bytes - device.memory_used_bytes,
        )

    def nvmlDeviceGetPowerManagementLimit(self, handle: FakeGpu | FakeMig) -> int:
        return self._parent_only(handle, "nvmlDeviceGetPowerManagementLimit").power_limit_mw

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: FakeGpu | FakeMig) -> int:
        gpu = self._parent_only(handle, "nvmlDeviceGetPowerManagementDefaultLimit")
        assert gpu.default_power_limit_mw is not None
        return gpu.default_power_limit_mw

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: FakeGpu | FakeMig) -> list[int]:
        gpu = self._parent_only(handle, "nvmlDeviceGetPowerManagementLimitConstraints")
        assert gpu.max_power_limit_mw is not None
        return [gpu.min_power_limit_mw, gpu.max_power_limit_mw]

    def nvmlDeviceSetPowerManagementLimit(self, handle: FakeGpu | FakeMig, limit_mw: int) -> None:
        gpu = self._parent_only(handle, "nvmlDeviceSetPowerManagementLimit")
        assert isinstance(limit_mw, int)  # ctypes c_uint: whole milliwatts
        assert gpu.max_power_limit_mw is not None
        if not gpu.min_power_limit_mw <= limit_mw <= gpu.max_power_limit_mw:
            raise pynvml.NVMLError_InvalidArgument()  # what the driver answers
        gpu.power_limit_mw = limit_mw
        gpu.limits_set_mw.append(limit_mw)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> FakeGpu | FakeMig:
        for gpu in self.gpus:
            devices: list[FakeGpu | FakeMig] = [gpu, *gpu.migs.values()]
            for device in devices:
                if device.uuid == uuid:
                    return self._gpu(device, "nvmlDeviceGetHandleByUUID")
        raise pynvml.NVMLError_NotFound()

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: FakeGpu | FakeMig) -> FakeGpu:
        for gpu in self.gpus:
            if any(mig is handle for mig in gpu.migs.values()):
                return gpu
        raise pynvml.NVMLError_InvalidArgument()  # not a MIG instance

    def nvmlDeviceGetAttributes(self, handle: FakeGpu | FakeMig) -> SimpleNamespace:
        device = self._gpu(handle, "nvmlDeviceGetAttributes")
        if device.sm_count is None:
            raise pynvml.NVMLError_NotSupported()
        return SimpleNamespace(multiprocessorCount=device.sm_count)

    def nvmlDeviceGetMigMode(self, handle: FakeGpu) -> list[int]:
        gpu = self._parent_only(handle, "nvmlDeviceGetMigMode")
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if gpu.mig_enabled else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: FakeGpu) -> int:
        self._parent_only(handle, "nvmlDeviceGetMaxMigDeviceCount")
        return self.MAX_MIG_SLOTS

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: FakeGpu, index: int) -> FakeMig:
        gpu = self._parent_only(handle, "nvmlDeviceGetMigDeviceHandleByIndex")
        if index not in gpu.migs:
            raise pynvml.NVMLError_NotFound()
        return gpu.migs[index]

    def nvmlDeviceGetUtilizationRates(self, handle: FakeGpu | FakeMig) -> SimpleNamespace:
        gpu = self._parent_only(handle, "nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=gpu.utilization_pct, memory=0)

    def nvmlDeviceGetPowerUsage(self, handle: FakeGpu | FakeMig) -> int:
        return self._parent_only(handle, "nvmlDeviceGetPowerUsage").power_usage_mw

    def nvmlDeviceGetTemperature(self, handle: FakeGpu | FakeMig, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._parent_only(handle, "nvmlDeviceGetTemperature").temperature_c

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: FakeGpu | FakeMig) -> int:
        gpu = self._parent_only(handle, "nvmlDeviceGetTotalEnergyConsumption")
        if gpu.energy_mj is None:
            raise pynvml.NVMLError_NotSupported()
        return gpu.energy_mj

    def nvmlEventSetCreate(self) -> object:
        return self

    def nvmlDeviceRegisterEvents(self, handle: FakeGpu, types: int, events: object) -> None:
        assert types == pynvml.nvmlEventTypeXidCriticalError
        assert events is self
        self.registered.append(self._parent_only(handle, "nvmlDeviceRegisterEvents").uuid)

    def nvmlEventSetWait_v2(self, events: object, timeout_ms: int) -> SimpleNamespace:
        assert timeout_ms == 0  # a telemetry round never waits for events
        if not self.pending_events:
            raise pynvml.NVMLError_Timeout()
        gpu, xid = self.pending_events.pop(0)
        return SimpleNamespace(
            device=gpu,
            eventType=pynvml.nvmlEventTypeXidCriticalError,
            eventData=xid,
            gpuInstanceId=0xFFFFFFFF,
            computeInstanceId=0xFFFFFFFF,
        )

    def nvmlEventSetFree(self, events: object) -> None:
        self.event_sets_freed += 1
