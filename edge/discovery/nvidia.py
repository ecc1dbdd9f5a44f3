"""NVIDIA GPUs and their MIG instances, through NVML (the nvidia-ml-py package).

A machine without the driver, without libnvidia-ml or without permission is a
machine without NVIDIA GPUs: discover() returns [] and logs that once. Every
per-device NVML call is guarded, so one odd GPU (or one unsupported query on
it) costs that field or that device, never the probe.

MIG: when a GPU runs in MIG mode, each MIG instance is its own accelerator
("gpu{i}-mig{j}", parent_id "gpu{i}", addressed by its MIG UUID) and the
physical GPU is not listed. CUDA cannot run work on a MIG-enabled GPU outside
its instances, and listing the parent too would count its memory and SMs twice.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal, TypeVar

from edge.discovery.onnx_providers import providers_for
from shared.accelerators import nvidia_gpu_facts
from shared.lean_logs import get_logger
from shared.messages import PCI_BUS_ID_PATTERN, Accelerator, AcceleratorSample

log = get_logger(__name__)

_T = TypeVar("_T")

# XIDs an application causes (a bad kernel, a page fault, a timeout it hit): they say
# nothing about the GPU, so they do not make it unhealthy. The same list as NVIDIA's
# Kubernetes device plugin; every other critical XID (ECC errors 48/94/95, fallen off
# the bus 79, GSP errors 119/120, ...) does.
APPLICATION_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})
XID_REASON = "XID {xid} reported by the driver (a GPU error; reset the GPU, then restart the agent)"
_MAX_EVENTS_PER_ROUND = 64  # a storm of events cannot hold up a telemetry round
# The library pynvml loads outside Windows (its `_LoadNvmlLibrary`).
_NVML_LIBRARY = "libnvidia-ml.so.1"


@dataclass(frozen=True, slots=True)
class _TrackedDevice:
    """An accelerator discover() returned and the NVML handles sample() reads it through."""

    accelerator_id: str
    handle: Any
    # The physical GPU: itself, or a MIG instance's parent. Power, temperature and
    # energy exist only per physical GPU.
    physical_id: str
    physical_handle: Any
    is_mig: bool


@dataclass(slots=True)
class _EnergyCounter:
    last_reading_mj: int
    accumulated_mj: int = 0


def _nvml_call(
    nvml: ModuleType,
    read: Callable[[], _T],
    *,
    what: str,
    accelerator_id: str,
    level: Literal["debug", "info"],
) -> _T | None:
    """`read()`, or None when NVML refuses (NotSupported on this GPU, GPU lost, ...)."""
    try:
        return read()
    except nvml.NVMLError as error:
        if isinstance(error, nvml.NVMLError_NotSupported):
            level = "debug"  # expected on many boards (attributes, power limit on GeForce)
        getattr(log, level)(
            "NVML query failed", query=what, accelerator=accelerator_id, error=str(error)
        )
        return None


def shutdown_nvml(nvml: ModuleType | None) -> None:
    """End one NVML session (NVML counts its initialisations); None: none was open."""
    if nvml is None:
        return
    try:
        nvml.nvmlShutdown()
    except nvml.NVMLError as error:
        log.warning("nvmlShutdown failed", error=str(error))


def missing_nvml_library() -> str | None:
    """Why NVML cannot load when its library is missing, else None (let pynvml try).

    pynvml costs about 2 MB resident once imported, and most edge devices (Jetsons,
    CPU-only boxes) have no NVML: look for the library pynvml would load first."""
    if sys.platform.startswith("win") or "pynvml" in sys.modules:
        return None  # pynvml's own search on Windows; already loaded: nothing to save
    import ctypes

    try:
        ctypes.CDLL(_NVML_LIBRARY)
    except OSError as error:
        return f"NVML Shared Library Not Found ({error})"
    return None


_PCI_BUS_ID = re.compile(PCI_BUS_ID_PATTERN)


def pci_bus_id(bus_id: str | bytes | None) -> str:
    """NVML's `nvmlPciInfo_t.busId` ("00000000:3B:00.0") as the wire carries it: "" when
    NVML gave none or something else, which costs a metrics label, not the birth."""
    if isinstance(bus_id, bytes):  # pynvml before 11.5 did not decode char arrays
        bus_id = bus_id.decode("ascii", errors="replace")
    bus_id = (bus_id or "").strip("\x00 ")
    if not _PCI_BUS_ID.match(bus_id):
        if bus_id:
            log.info("NVML PCI bus id not understood; left out", bus_id=bus_id)
        return ""
    return bus_id


def _scaled(value: float | None, share: float | None) -> float | None:
    return None if value is None or share is None else value * share


class NvidiaProbe:
    """NVIDIA GPUs (and MIG instances) as accelerators "gpu{i}" / "gpu{i}-mig{j}".

    `i` is the NVML index, which follows PCI bus order; CUDA numbers devices the
    same way only with CUDA_DEVICE_ORDER=PCI_BUS_ID, so work is best addressed
    by UUID. Not safe for concurrent calls: the agent calls one method at a time.
    """

    def __init__(self, *, available_providers: Sequence[str] | None = None) -> None:
        self._available_providers = available_providers
        self._nvml: ModuleType | None = None
        self._unavailable_logged = False
        self._devices: list[_TrackedDevice] = []
        self._energy_by_gpu: dict[str, _EnergyCounter] = {}
        # Critical XID events, where NVML reports them: the event set, the physical
        # GPUs by UUID (how an event names its GPU), and the faults seen (sticky: an
        # XID GPU needs a reset, after which the agent is restarted).
        self._events: Any | None = None
        self._physical_by_uuid: dict[str, str] = {}
        self._xid_faults: dict[str, str] = {}  # physical GPU id -> why

    @property
    def name(self) -> str:
        return "nvidia"

    def _initialized_nvml(self) -> ModuleType | None:
        if self._nvml is not None:
            return self._nvml
        missing = missing_nvml_library()
        if missing is not None:
            self._log_unavailable(missing)
            return None
        try:
            import pynvml
        except ImportError as error:
            self._log_unavailable(repr(error))
            return None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as error:
            # No library, no driver, no permission: all mean "no NVIDIA GPU here".
            self._log_unavailable(str(error))
            return None
        self._nvml = pynvml
        return self._nvml

    def _log_unavailable(self, reason: str) -> None:
        if not self._unavailable_logged:
            log.info("NVML unavailable; no NVIDIA GPUs reported", reason=reason)
            self._unavailable_logged = True

    def discover(self) -> Sequence[Accelerator]:
        self._devices = []
        self._energy_by_gpu = {}
        self._free_events()
        self._xid_faults = {}  # a fresh look at the hardware (the agent's start)
        nvml = self._initialized_nvml()
        if nvml is None:
            return []
        try:
            gpu_count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as error:
            log.warning("NVML device count failed; no NVIDIA GPUs reported", error=str(error))
            return []
        providers = providers_for("nvidia", self._available_providers)
        accelerators: list[Accelerator] = []
        for index in range(gpu_count):
            try:
                found = self._discover_gpu(nvml, index, providers)
            except Exception as error:  # one broken GPU must not hide the others
                log.warning("skipping NVIDIA GPU", index=index, error=repr(error))
                continue
            for accelerator, device in found:
                accelerators.append(accelerator)
                self._devices.append(device)
        # Zero point of the energy counters, so sampled energy starts near 0.
        for device in self._devices:
            self._energy_j(nvml, device)
        self._watch_xid(nvml)
        return accelerators

    # -- XID events -----------------------------------------------------------------

    def _watch_xid(self, nvml: ModuleType) -> None:
        """Register every physical GPU for critical XID events where NVML supports it
        (not on every board or driver: then only lost readings judge its health)."""
        physical = {d.physical_id: d.physical_handle for d in self._devices}
        if not physical:
            return
        try:
            events = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as error:
            log.info("NVML events unavailable; XID errors not watched", error=str(error))
            return
        for physical_id, handle in physical.items():
            try:
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, events)
                self._physical_by_uuid[str(nvml.nvmlDeviceGetUUID(handle))] = physical_id
            except nvml.NVMLError as error:
                log.info("XID events not watched", accelerator=physical_id, error=str(error))
        self._events = events

    def _drain_xid(self, nvml: ModuleType) -> None:
        """Read the XID events raised since the last round, without waiting."""
        if self._events is None:
            return
        for _ in range(_MAX_EVENTS_PER_ROUND):
            try:
                data = nvml.nvmlEventSetWait_v2(self._events, 0)
            except nvml.NVMLError_Timeout:
                return  # none pending
            except nvml.NVMLError as error:
                log.warning("NVML event wait failed", error=str(error))
                return
            xid = int(data.eventData)
            if not int(data.eventType) & nvml.nvmlEventTypeXidCriticalError:
                continue
            try:
                physical_id = self._physical_by_uuid.get(str(nvml.nvmlDeviceGetUUID(data.device)))
            except nvml.NVMLError:
                physical_id = None
            log.warning("NVIDIA XID event", xid=xid, accelerator=physical_id)
            if physical_id is not None and xid not in APPLICATION_XIDS:
                self._xid_faults.setdefault(physical_id, XID_REASON.format(xid=xid))

    def device_faults(self) -> dict[str, str]:
        """Accelerator id -> why it failed, from critical XID events: a MIG instance
        fails with its physical GPU."""
        return {
            d.accelerator_id: self._xid_faults[d.physical_id]
            for d in self._devices
            if d.physical_id in self._xid_faults
        }

    def _free_events(self) -> None:
        events, self._events = self._events, None
        self._physical_by_uuid = {}
        if events is not None and self._nvml is not None:
            try:
                self._nvml.nvmlEventSetFree(events)
            except self._nvml.NVMLError as error:
                log.debug("nvmlEventSetFree failed", error=str(error))

    def _discover_gpu(
        self, nvml: ModuleType, index: int, providers: tuple[str, ...]
    ) -> list[tuple[Accelerator, _TrackedDevice]]:
        gpu_id = f"gpu{index}"
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        model = str(nvml.nvmlDeviceGetName(handle))
        # What NVML does not report (SMs on most drivers, idle power, speed) comes
        # from the shared table; power limit and memory are NVML's alone.
        facts = nvidia_gpu_facts(model)

        def query(read: Callable[[], _T], what: str) -> _T | None:
            return _nvml_call(nvml, read, what=what, accelerator_id=gpu_id, level="info")

        sm_count = query(
            lambda: int(nvml.nvmlDeviceGetAttributes(handle).multiprocessorCount), "attributes"
        )
        if not sm_count:
            sm_count = (facts.compute_units or 0) if facts else 0
        # The default limit, not the current one: a GPU greenfed holds to a lower limit
        # for a capped worker (edge/training/power_limits.py) keeps its full power.
        power_limit_mw = query(
            lambda: int(nvml.nvmlDeviceGetPowerManagementDefaultLimit(handle)),
            "default power limit",
        )
        if power_limit_mw is None:
            power_limit_mw = query(
                lambda: int(nvml.nvmlDeviceGetPowerManagementLimit(handle)), "power limit"
            )
        max_power_w = power_limit_mw / 1000 if power_limit_mw is not None else None
        idle_power_w = facts.idle_power_w if facts else None
        relative_speed = facts.relative_speed if facts else None
        bus_id = pci_bus_id(query(lambda: nvml.nvmlDeviceGetPciInfo(handle).busId, "PCI info"))

        # Pre-Ampere GPUs answer NotSupported: no MIG.
        mig_mode = query(lambda: list(nvml.nvmlDeviceGetMigMode(handle)), "MIG mode")
        if mig_mode is not None and mig_mode[0] == nvml.NVML_DEVICE_MIG_ENABLE:
            return self._discover_mig_instances(
                nvml,
                parent_id=gpu_id,
                parent_handle=handle,
                parent_model=model,
                parent_sm_count=sm_count,
                parent_power_w=(idle_power_w, max_power_w),
                parent_relative_speed=relative_speed,
                parent_pci_bus_id=bus_id,
                providers=providers,
            )

        accelerator = Accelerator(
            id=gpu_id,
            kind="gpu",
            vendor="nvidia",
            model=model,
            memory_bytes=query(lambda: int(nvml.nvmlDeviceGetMemoryInfo(handle).total), "memory")
            or 0,
            compute_units=sm_count,
            idle_power_w=idle_power_w,
            max_power_w=max_power_w,
            relative_speed=relative_speed,
            onnx_providers=providers,
            uuid=query(lambda: str(nvml.nvmlDeviceGetUUID(handle)), "uuid"),
            index=index,
            pci_bus_id=bus_id,
        )
        device = _TrackedDevice(
            accelerator_id=gpu_id,
            handle=handle,
            physical_id=gpu_id,
            physical_handle=handle,
            is_mig=False,
        )
        return [(accelerator, device)]

    def _discover_mig_instances(
        self,
        nvml: ModuleType,
        *,
        parent_id: str,
        parent_handle: Any,
        parent_model: str,
        parent_sm_count: int,
        parent_power_w: tuple[float | None, float | None],
        parent_relative_speed: float | None,
        parent_pci_bus_id: str,
        providers: tuple[str, ...],
    ) -> list[tuple[Accelerator, _TrackedDevice]]:
        max_instances = _nvml_call(
            nvml,
            lambda: int(nvml.nvmlDeviceGetMaxMigDeviceCount(parent_handle)),
            what="MIG device count",
            accelerator_id=parent_id,
            level="info",
        )
        found: list[tuple[Accelerator, _TrackedDevice]] = []
        for mig_index in range(max_instances or 0):
            mig_id = f"{parent_id}-mig{mig_index}"
            try:
                mig_handle = nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent_handle, mig_index)
            except nvml.NVMLError_NotFound:
                continue  # an empty slot: MIG instance slots need not be contiguous
            except nvml.NVMLError as error:
                log.warning("skipping MIG instance", accelerator=mig_id, error=str(error))
                continue
            try:
                accelerator = self._mig_accelerator(
                    nvml,
                    mig_id,
                    mig_handle,
                    parent_id,
                    parent_model,
                    parent_sm_count,
                    parent_power_w,
                    parent_relative_speed,
                    parent_pci_bus_id,
                    providers,
                )
            except Exception as error:
                log.warning("skipping MIG instance", accelerator=mig_id, error=repr(error))
                continue
            device = _TrackedDevice(
                accelerator_id=mig_id,
                handle=mig_handle,
                physical_id=parent_id,
                physical_handle=parent_handle,
                is_mig=True,
            )
            found.append((accelerator, device))
        if not found:
            log.info(
                "GPU in MIG mode without MIG instances; nothing schedulable on it",
                accelerator=parent_id,
            )
        return found

    def _mig_accelerator(
        self,
        nvml: ModuleType,
        mig_id: str,
        mig_handle: Any,
        parent_id: str,
        parent_model: str,
        parent_sm_count: int,
        parent_power_w: tuple[float | None, float | None],
        parent_relative_speed: float | None,
        parent_pci_bus_id: str,
        providers: tuple[str, ...],
    ) -> Accelerator:
        def query(read: Callable[[], _T], what: str) -> _T | None:
            return _nvml_call(nvml, read, what=what, accelerator_id=mig_id, level="info")

        sm_count = (
            query(
                lambda: int(nvml.nvmlDeviceGetAttributes(mig_handle).multiprocessorCount),
                "attributes",
            )
            or 0
        )
        # The energy model's idle/max power and speed of an instance are its SM share
        # of the physical GPU's; unknown when either SM count is.
        sm_share = sm_count / parent_sm_count if sm_count and parent_sm_count else None
        idle_power_w, max_power_w = parent_power_w
        return Accelerator(
            id=mig_id,
            kind="gpu",
            vendor="nvidia",
            # Recent drivers name instances like "NVIDIA A100-SXM4-40GB MIG 3g.20gb".
            model=query(lambda: str(nvml.nvmlDeviceGetName(mig_handle)), "name")
            or f"{parent_model} MIG",
            memory_bytes=query(
                lambda: int(nvml.nvmlDeviceGetMemoryInfo(mig_handle).total), "memory"
            )
            or 0,
            compute_units=sm_count,
            idle_power_w=_scaled(idle_power_w, sm_share),
            max_power_w=_scaled(max_power_w, sm_share),
            relative_speed=_scaled(parent_relative_speed, sm_share),
            onnx_providers=providers,
            # CUDA addresses a MIG instance by its "MIG-..." UUID only, never by an index.
            uuid=query(lambda: str(nvml.nvmlDeviceGetUUID(mig_handle)), "uuid"),
            index=None,
            parent_id=parent_id,
            # An instance is a slice of its GPU: it sits at the GPU's PCI address.
            pci_bus_id=parent_pci_bus_id,
        )

    def sample(self) -> Sequence[AcceleratorSample]:
        nvml = self._nvml
        if nvml is None:
            return []
        self._drain_xid(nvml)
        samples: list[AcceleratorSample] = []
        for device in self._devices:
            try:
                samples.append(self._sample_device(nvml, device))
            except Exception as error:  # one GPU falling off the bus keeps the rest reported
                log.warning(
                    "NVIDIA GPU sample failed", accelerator=device.accelerator_id, error=repr(error)
                )
        return samples

    def _sample_device(self, nvml: ModuleType, device: _TrackedDevice) -> AcceleratorSample:
        def query(read: Callable[[], _T], what: str) -> _T | None:
            return _nvml_call(
                nvml, read, what=what, accelerator_id=device.accelerator_id, level="debug"
            )

        # NVML reports memory per MIG instance; utilisation usually not (NotSupported),
        # and power, temperature and energy only for the physical GPU, so a MIG
        # instance carries its parent's readings. Instances sharing a parent_id
        # share those numbers: consumers must not add them up.
        utilization_pct = query(
            lambda: float(nvml.nvmlDeviceGetUtilizationRates(device.handle).gpu), "utilization"
        )
        if utilization_pct is None and device.is_mig:
            utilization_pct = query(
                lambda: float(nvml.nvmlDeviceGetUtilizationRates(device.physical_handle).gpu),
                "parent utilization",
            )
        try:
            memory_used_bytes: int | None = int(nvml.nvmlDeviceGetMemoryInfo(device.handle).used)
        except (nvml.NVMLError_GpuIsLost, nvml.NVMLError_Unknown):
            # The device itself failed: no reading for it this round; the agent judges
            # it unhealthy if that lasts (edge/agent/device_health.py).
            raise
        except nvml.NVMLError as error:  # not supported, no permission, a timeout
            log.debug(
                "NVML query failed", query="memory", accelerator=device.accelerator_id,
                error=str(error),
            )  # fmt: skip
            memory_used_bytes = None
        power_mw = query(lambda: int(nvml.nvmlDeviceGetPowerUsage(device.physical_handle)), "power")
        temperature_c = query(
            lambda: float(
                nvml.nvmlDeviceGetTemperature(device.physical_handle, nvml.NVML_TEMPERATURE_GPU)
            ),
            "temperature",
        )
        return AcceleratorSample(
            id=device.accelerator_id,
            # The wire field is required; 0 stands for "no reading" as well as idle.
            utilization_pct=min(100.0, max(0.0, utilization_pct or 0.0)),
            memory_used_bytes=max(0, memory_used_bytes or 0),
            power_w=max(0.0, power_mw / 1000) if power_mw is not None else None,
            temperature_c=temperature_c,
            energy_j=self._energy_j(nvml, device),
        )

    def _energy_j(self, nvml: ModuleType, device: _TrackedDevice) -> float | None:
        """Energy of the physical GPU since discovery, J; None where NVML has no counter."""
        reading_mj = _nvml_call(
            nvml,
            lambda: int(nvml.nvmlDeviceGetTotalEnergyConsumption(device.physical_handle)),
            what="energy",
            accelerator_id=device.accelerator_id,
            level="debug",
        )
        if reading_mj is None:
            return None
        counter = self._energy_by_gpu.get(device.physical_id)
        if counter is None:
            self._energy_by_gpu[device.physical_id] = _EnergyCounter(last_reading_mj=reading_mj)
            return 0.0
        delta_mj = reading_mj - counter.last_reading_mj
        if delta_mj < 0:
            # The counter counts since the driver loaded; a reload restarts it at 0.
            delta_mj = reading_mj
        counter.accumulated_mj += delta_mj
        counter.last_reading_mj = reading_mj
        return counter.accumulated_mj / 1000

    def close(self) -> None:
        self._free_events()
        nvml, self._nvml = self._nvml, None
        self._devices = []
        shutdown_nvml(nvml)
