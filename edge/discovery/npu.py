"""NPUs and other AI accelerators found in sysfs and /dev.

Two sources, scanned under an injectable root so tests can build fake trees:

- the Linux accel subsystem (drivers/accel: Intel NPU `intel_vpu`, AMD XDNA
  `amdxdna`, Qualcomm Cloud AI `qaic`, ...): `/sys/class/accel/accelN` with the
  PCI ids in `device/vendor` and `device/device`, and its node `/dev/accel/accelN`.
  The two name the same device and are reported once.
- vendor character devices from out-of-tree drivers: Google Coral Edge TPU
  (`/dev/apex_N`, PCIe/M.2 only; the USB Coral has no node), Hailo
  (`/dev/hailoN`), Rockchip (`/dev/rknpu`), Huawei Ascend (`/dev/davinciN`),
  Qualcomm Cloud AI (`/dev/qaic_*`).

The nodes are only checked for existence (the fakes are plain files); opening
them could disturb a running workload and needs permissions the agent may lack.

NPUs have no memory of their own worth scheduling on (they map host RAM), so
memory_bytes is 0; they expose no power reading either.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from edge.discovery.onnx_providers import DeviceFamily, providers_for
from shared.accelerators import ACCELERATORS, AcceleratorFacts
from shared.lean_logs import get_logger
from shared.messages import Accelerator, AcceleratorSample

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class NpuModel:
    """What an identified NPU is: its facts and its ONNX Runtime device family."""

    facts: AcceleratorFacts
    family: DeviceFamily | None


def _known(name: str, family: DeviceFamily) -> NpuModel:
    return NpuModel(ACCELERATORS[name], family)


# (PCI vendor, PCI device) of accel-subsystem devices. Device ids from the
# upstream drivers' PCI tables; speed, power and engine counts in shared.accelerators.
_PCI_NPUS: dict[tuple[int, int], NpuModel] = {
    (0x8086, 0x7D1D): _known("Intel Meteor Lake NPU", "intel-npu"),
    (0x8086, 0xAD1D): _known("Intel Arrow Lake NPU", "intel-npu"),
    (0x8086, 0x643E): _known("Intel Lunar Lake NPU", "intel-npu"),
    # 0x1502 also covers Hawk Point (16 TOPS); the Phoenix figure is the safe one.
    (0x1022, 0x1502): _known("AMD XDNA NPU (Phoenix)", "amd-npu"),
    (0x1022, 0x17F0): _known("AMD XDNA 2 NPU (Strix)", "amd-npu"),
    (0x17CB, 0xA100): _known("Qualcomm Cloud AI 100", "qualcomm-npu"),
}

# A known PCI vendor with a device id not in the table above: (vendor, display name, family).
_PCI_VENDORS: dict[int, tuple[str, str, DeviceFamily]] = {
    0x8086: ("intel", "Intel", "intel-npu"),
    0x1022: ("amd", "AMD", "amd-npu"),
    0x17CB: ("qualcomm", "Qualcomm", "qualcomm-npu"),
}

# Vendor device nodes under /dev: name pattern (group 1, if any, is the index).
# A Hailo-8L (13 TOPS) has the same node as a Hailo-8 and is reported as one,
# because only HailoRT can tell them apart.
_VENDOR_NODES: tuple[tuple[re.Pattern[str], NpuModel], ...] = (
    (re.compile(r"^apex_(\d+)$"), _known("Coral Edge TPU", "coral")),
    (re.compile(r"^hailo(\d+)$"), _known("Hailo-8", "hailo")),
    (re.compile(r"^rknpu$"), _known("Rockchip NPU", "rockchip-npu")),
    (re.compile(r"^davinci(\d+)$"), _known("Huawei Ascend NPU", "huawei-npu")),
    (re.compile(r"^qaic_\D*(\d+)?$"), _known("Qualcomm Cloud AI", "qualcomm-npu")),
)

_ACCEL_NAME = re.compile(r"^accel(\d+)$")


def _natural_key(path: Path) -> tuple[str, int]:
    """accel2 before accel10."""
    match = re.match(r"^(.*?)(\d+)$", path.name)
    if match is None:
        return path.name, -1
    return match.group(1), int(match.group(2))


def _sorted_entries(directory: Path) -> list[Path]:
    try:
        return sorted(directory.iterdir(), key=_natural_key)
    except OSError:  # absent, or not readable by the agent
        return []


def _read_pci_id(path: Path) -> int | None:
    try:
        return int(path.read_text().strip(), 16)
    except (OSError, ValueError):
        return None


def _pci_model(vendor_id: int | None, device_id: int | None, driver: str | None) -> NpuModel:
    if vendor_id is not None and device_id is not None:
        known = _PCI_NPUS.get((vendor_id, device_id))
        if known is not None:
            return known
        pci_ids = f"PCI {vendor_id:#06x}:{device_id:#06x}"
        if vendor_id in _PCI_VENDORS:
            vendor, display_name, family = _PCI_VENDORS[vendor_id]
            facts = AcceleratorFacts(
                name=f"{display_name} NPU ({pci_ids})", kind="npu", vendor=vendor
            )
            return NpuModel(facts, family)
        description = pci_ids
    else:
        description = "no PCI ids"
    if driver:
        description = f"{description}, driver {driver}"
    facts = AcceleratorFacts(name=f"accel device ({description})", kind="npu", vendor="unknown")
    return NpuModel(facts, None)


@dataclass(frozen=True, slots=True)
class _FoundNpu:
    model: NpuModel
    source: str
    index: int | None
    # Intel NPU driver (recent kernels): cumulative busy time, µs.
    busy_time_path: Path | None = None


@dataclass(slots=True)
class _BusyCounter:
    last_busy_us: int
    last_read_s: float


class NpuProbe:
    """NPUs as accelerators "npu0", "npu1", ... in a stable scan order.

    Not safe for concurrent calls: the agent calls one probe method at a time.
    """

    def __init__(
        self,
        *,
        root: Path = Path("/"),
        available_providers: Sequence[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._root = root
        self._available_providers = available_providers
        self._clock = clock
        self._accelerator_ids: list[str] = []
        self._busy_time_paths: dict[str, Path] = {}
        self._busy_counters: dict[str, _BusyCounter] = {}

    @property
    def name(self) -> str:
        return "npu"

    def discover(self) -> Sequence[Accelerator]:
        found = [*self._scan_accel_subsystem(), *self._scan_vendor_nodes()]
        accelerators: list[Accelerator] = []
        self._accelerator_ids = [f"npu{number}" for number in range(len(found))]
        self._busy_time_paths = {}
        self._busy_counters = {}
        for number, npu in enumerate(found):
            accelerator_id = f"npu{number}"
            family, facts = npu.model.family, npu.model.facts
            providers = providers_for(family, self._available_providers) if family else ()
            accelerators.append(
                Accelerator(
                    id=accelerator_id,
                    kind="npu",
                    vendor=facts.vendor,
                    model=facts.name,
                    memory_bytes=0,
                    compute_units=facts.compute_units or 0,
                    idle_power_w=facts.idle_power_w,
                    max_power_w=facts.max_power_w,
                    relative_speed=facts.relative_speed,
                    onnx_providers=providers,
                    index=npu.index,
                )
            )
            log.debug("NPU found", accelerator=accelerator_id, model=facts.name, source=npu.source)
            if npu.busy_time_path is not None:
                self._busy_time_paths[accelerator_id] = npu.busy_time_path
                self._busy_utilization_pct(accelerator_id)  # zero point
        return accelerators

    def _scan_accel_subsystem(self) -> Iterable[_FoundNpu]:
        seen: set[str] = set()
        for entry in _sorted_entries(self._root / "sys/class/accel"):
            match = _ACCEL_NAME.match(entry.name)
            if match is None:
                continue
            seen.add(entry.name)
            device_dir = entry / "device"
            driver_link = device_dir / "driver"
            driver = driver_link.resolve().name if driver_link.exists() else None
            model = _pci_model(
                _read_pci_id(device_dir / "vendor"), _read_pci_id(device_dir / "device"), driver
            )
            busy_time_path = device_dir / "npu_busy_time_us"
            yield _FoundNpu(
                model=model,
                source=str(entry),
                index=int(match.group(1)),
                busy_time_path=busy_time_path if busy_time_path.is_file() else None,
            )
        # A node without a sysfs entry (sysfs not mounted in a container, say).
        for node in _sorted_entries(self._root / "dev/accel"):
            match = _ACCEL_NAME.match(node.name)
            if match is None or node.name in seen:
                continue
            yield _FoundNpu(
                model=_pci_model(None, None, None), source=str(node), index=int(match.group(1))
            )

    def _scan_vendor_nodes(self) -> Iterable[_FoundNpu]:
        nodes = _sorted_entries(self._root / "dev")
        for pattern, model in _VENDOR_NODES:
            for node in nodes:
                match = pattern.match(node.name)
                if match is None:
                    continue
                index_text = match.group(1) if pattern.groups else None
                yield _FoundNpu(
                    model=model,
                    source=str(node),
                    index=int(index_text) if index_text is not None else None,
                )

    def _busy_utilization_pct(self, accelerator_id: str) -> float:
        """Busy share of the wall time since the previous reading; 0 on the first one."""
        path = self._busy_time_paths[accelerator_id]
        try:
            busy_us = int(path.read_text().strip())
        except (OSError, ValueError) as error:
            log.debug("NPU busy time unreadable", accelerator=accelerator_id, error=repr(error))
            return 0.0
        now_s = self._clock()
        previous = self._busy_counters.get(accelerator_id)
        self._busy_counters[accelerator_id] = _BusyCounter(busy_us, now_s)
        if previous is None or now_s <= previous.last_read_s:
            return 0.0
        busy_share = (busy_us - previous.last_busy_us) / ((now_s - previous.last_read_s) * 1e6)
        return min(100.0, max(0.0, 100.0 * busy_share))

    def sample(self) -> Sequence[AcceleratorSample]:
        # Only the Intel NPU reports activity; the others read as idle.
        return [
            AcceleratorSample(
                id=accelerator_id,
                utilization_pct=(
                    self._busy_utilization_pct(accelerator_id)
                    if accelerator_id in self._busy_time_paths
                    else 0.0
                ),
                memory_used_bytes=0,
                power_w=None,
                temperature_c=None,
                energy_j=None,
            )
            for accelerator_id in self._accelerator_ids
        ]

    def close(self) -> None:
        """Nothing to release: the probe keeps no files open."""
