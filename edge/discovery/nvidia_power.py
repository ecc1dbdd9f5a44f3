"""NVIDIA GPU power limits through NVML: the hardware side of carbon-aware power
capping (edge/training/power_limits.py decides which GPU is held to what, and when).

NVML limits power per physical GPU: a limit set through a MIG instance is its
parent's, and holds every instance on it. So the agent never asks one for a run on
MIG instances (power_limits.py); restoring the default through an instance stays,
for a parent that an agent of an older version capped. An asked limit is clamped into the
device's constraints (nvmlDeviceGetPowerManagementLimitConstraints). NVML lets only
root set a limit (NoPermission otherwise), and a limit does not survive a driver
unload or a reboot. Every failure becomes a PowerLimitUnavailable saying why, for
the worker's report: the worker itself runs on at the default.

NVML is initialised on first use, apart from the NVIDIA probe's session (NVML counts
its initialisations), so power limits never touch the probe's state from another
thread.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from edge.discovery.nvidia import missing_nvml_library, shutdown_nvml
from edge.probes import PowerLimitUnavailable, physical_gpu_id
from shared.lean_logs import get_logger
from shared.messages import Accelerator

log = get_logger(__name__)

NO_PERMISSION = "no permission to set GPU power limits (run the agent as root or grant it)"
# The NVIDIA probe names a physical GPU "gpu{NVML index}" (edge/discovery/nvidia.py).
_PHYSICAL_ID = re.compile(r"gpu(\d+)")


@contextlib.contextmanager
def _nvml_errors(nvml: ModuleType, gpu_id: str) -> Iterator[None]:
    """NVML's refusals as PowerLimitUnavailable, with why in words for people."""
    try:
        yield
    except nvml.NVMLError_NoPermission:
        raise PowerLimitUnavailable(NO_PERMISSION) from None
    except nvml.NVMLError_NotSupported:
        raise PowerLimitUnavailable(f"{gpu_id} does not support power limits") from None
    except nvml.NVMLError as error:
        raise PowerLimitUnavailable(f"NVML error on {gpu_id}: {error}") from None


class NvmlPowerControl:
    """GpuPowerControl (edge/probes.py) over NVML. Blocking; one call at a time."""

    def __init__(self) -> None:
        self._nvml: ModuleType | None = None

    def _initialized_nvml(self) -> ModuleType:
        if self._nvml is not None:
            return self._nvml
        missing = missing_nvml_library()
        if missing is not None:
            raise PowerLimitUnavailable(f"NVML is not available ({missing})")
        try:
            import pynvml
        except ImportError:
            raise PowerLimitUnavailable(
                "NVML is not available (nvidia-ml-py is not installed)"
            ) from None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as error:
            raise PowerLimitUnavailable(f"NVML is not available ({error})") from None
        self._nvml = pynvml
        return self._nvml

    def _physical_handle(self, nvml: ModuleType, gpu: Accelerator) -> Any:
        """The NVML handle of the physical GPU of `gpu`: by UUID, which no reordering of
        indices changes; by the NVML index where discovery could not read the UUID."""
        if gpu.vendor != "nvidia" or gpu.kind != "gpu":
            raise PowerLimitUnavailable(f"{gpu.id} is not an NVIDIA GPU")
        if gpu.uuid:
            handle = nvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
            if gpu.parent_id is not None:
                handle = nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
            return handle
        index = gpu.index
        if gpu.parent_id is not None:
            match = _PHYSICAL_ID.fullmatch(gpu.parent_id)
            index = int(match.group(1)) if match else None
        if index is None:
            raise PowerLimitUnavailable(f"{physical_gpu_id(gpu)} cannot be addressed in NVML")
        return nvml.nvmlDeviceGetHandleByIndex(index)

    def set_power_limit_w(self, gpu: Accelerator, limit_w: float) -> float:
        nvml = self._initialized_nvml()
        gpu_id = physical_gpu_id(gpu)
        with _nvml_errors(nvml, gpu_id):
            handle = self._physical_handle(nvml, gpu)
            min_mw, max_mw = (
                int(value) for value in nvml.nvmlDeviceGetPowerManagementLimitConstraints(handle)
            )
            limit_mw = min(max_mw, max(min_mw, round(limit_w * 1000)))
            nvml.nvmlDeviceSetPowerManagementLimit(handle, limit_mw)
        log.info(
            "GPU power limit set", accelerator=gpu_id, asked_w=limit_w, limit_w=limit_mw / 1000
        )
        return limit_mw / 1000

    def restore_default_power_limit(self, gpu: Accelerator) -> None:
        nvml = self._initialized_nvml()
        gpu_id = physical_gpu_id(gpu)
        with _nvml_errors(nvml, gpu_id):
            handle = self._physical_handle(nvml, gpu)
            default_mw = int(nvml.nvmlDeviceGetPowerManagementDefaultLimit(handle))
            nvml.nvmlDeviceSetPowerManagementLimit(handle, default_mw)
        log.info("GPU power limit restored", accelerator=gpu_id, limit_w=default_mw / 1000)

    def close(self) -> None:
        nvml, self._nvml = self._nvml, None
        shutdown_nvml(nvml)
