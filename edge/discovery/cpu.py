"""The host CPU as an accelerator, and the host facts every node reports.

Sources: on Linux /proc/stat (CPU times), /proc/meminfo (RAM), the hwmon and thermal
sysfs trees (temperature), as psutil reads them, without holding psutil (0.9 MB in an
agent that runs for months; psutil reads them where there is no /proc); /proc/cpuinfo
(model, vendor, ISA flags) and the Linux powercap RAPL counters (energy).
"""

from __future__ import annotations

import os
import platform
import re
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from edge.discovery.onnx_providers import providers_for
from edge.probes import HostSample
from shared.lean_logs import get_logger
from shared.messages import Accelerator, AcceleratorSample, HostInfo

log = get_logger(__name__)

CPU_ACCELERATOR_ID = "cpu0"

_X86_VENDORS = {"GenuineIntel": "intel", "AuthenticAMD": "amd"}

# `CPU implementer` codes, from Linux arch/arm64/include/asm/cputype.h.
_ARM_IMPLEMENTERS = {
    0x41: "arm",
    0x42: "broadcom",
    0x48: "hisilicon",
    0x4E: "nvidia",
    0x51: "qualcomm",
    0x61: "apple",
    0xC0: "ampere",
}

# Arm Ltd (implementer 0x41) `CPU part` codes, same source. aarch64 kernels print
# no `model name`, so on a server without a board `Model` this is the only name.
_ARM_LTD_PARTS = {
    0xD03: "Cortex-A53",
    0xD04: "Cortex-A35",
    0xD05: "Cortex-A55",
    0xD07: "Cortex-A57",
    0xD08: "Cortex-A72",
    0xD09: "Cortex-A73",
    0xD0A: "Cortex-A75",
    0xD0B: "Cortex-A76",
    0xD0C: "Neoverse-N1",
    0xD0D: "Cortex-A77",
    0xD40: "Neoverse-V1",
    0xD41: "Cortex-A78",
    0xD44: "Cortex-X1",
    0xD46: "Cortex-A510",
    0xD47: "Cortex-A710",
    0xD48: "Cortex-X2",
    0xD49: "Neoverse-N2",
    0xD4F: "Neoverse-V2",
    0xD80: "Cortex-A520",
    0xD81: "Cortex-A720",
    0xD82: "Cortex-X4",
}

# hwmon chips that measure the CPU package, best first, and within a chip the
# labels of the package-level reading (else the hottest reading is used).
_CPU_SENSOR_CHIPS = ("coretemp", "k10temp", "zenpower", "cpu_thermal", "cpu-thermal", "soc_thermal")
_PACKAGE_SENSOR_LABELS = ("Package id 0", "Tdie", "Tctl")

_RAPL_PACKAGE_ZONE = re.compile(r"^intel-rapl:\d+$")

PROC_STAT = Path("/proc/stat")
PROC_MEMINFO = Path("/proc/meminfo")
HWMON_DIR = Path("/sys/class/hwmon")
THERMAL_DIR = Path("/sys/class/thermal")


def _parse_int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text, 0)
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class CpuIdentity:
    """What /proc/cpuinfo says about the processor; model is None when it names none."""

    model: str | None
    vendor: str
    features: tuple[str, ...]


def parse_cpuinfo(text: str) -> CpuIdentity:
    """Parse /proc/cpuinfo text of x86 or ARM Linux."""
    first_values: dict[str, str] = {}
    per_processor_features: list[set[str]] = []
    for block in re.split(r"\n\s*\n", text):
        block_values: dict[str, str] = {}
        for line in block.splitlines():
            key, separator, value = line.partition(":")
            if separator:
                block_values[key.strip()] = value.strip()
        for key, value in block_values.items():
            first_values.setdefault(key, value)
        flags = block_values.get("flags", block_values.get("Features"))
        if flags is not None:
            per_processor_features.append(set(flags.split()))

    # A process migrates between cores, so only flags every core has are usable.
    features = set.intersection(*per_processor_features) if per_processor_features else set()

    implementer = _parse_int(first_values.get("CPU implementer"))
    if "vendor_id" in first_values:
        vendor = _X86_VENDORS.get(first_values["vendor_id"], "unknown")
    elif implementer is not None:
        vendor = _ARM_IMPLEMENTERS.get(implementer, "unknown")
    else:
        vendor = "unknown"

    model: str | None = None
    for key in ("model name", "Model", "Hardware"):
        if first_values.get(key):
            model = first_values[key]
            break
    if model is None and first_values.get("CPU part"):
        part_text = first_values["CPU part"]
        part = _parse_int(part_text)
        known_part = _ARM_LTD_PARTS.get(part) if implementer == 0x41 and part is not None else None
        model = known_part or f"ARM CPU part {part_text}"
    return CpuIdentity(model=model, vendor=vendor, features=tuple(sorted(features)))


def read_cpu_identity(cpuinfo_path: Path) -> CpuIdentity:
    """The CPU identity from `cpuinfo_path`, falling back to `platform` off Linux."""
    try:
        identity = parse_cpuinfo(cpuinfo_path.read_text(encoding="utf-8", errors="replace"))
    except OSError as error:
        log.info(
            "cpuinfo unreadable; using platform module", path=str(cpuinfo_path), error=repr(error)
        )
        identity = CpuIdentity(model=None, vendor="unknown", features=())
    if identity.model is None:
        fallback = platform.processor() or platform.machine() or "unknown"
        identity = CpuIdentity(model=fallback, vendor=identity.vendor, features=identity.features)
    return identity


def logical_core_count() -> int:
    # psutil's logical count on Linux is this same sysconf(_SC_NPROCESSORS_ONLN).
    return os.cpu_count() or 0


def read_cpu_busy_and_total_s(proc_stat: Path = PROC_STAT) -> tuple[float, float]:
    """Cumulative (busy, total) CPU seconds over all cores, as psutil.cpu_percent counts them."""
    try:
        with proc_stat.open("rb") as stat:  # the first line: the rest is per core and more
            first_line = stat.readline()
    except OSError:  # no /proc: not Linux
        return _psutil_cpu_busy_and_total_s()
    # cpu  user nice system idle iowait irq softirq steal guest guest_nice (clock ticks;
    # older kernels print fewer).
    ticks = [int(field) for field in first_line.split()[1:]]
    ticks += [0] * (10 - len(ticks))
    idle, iowait, guest, guest_nice = ticks[3], ticks[4], ticks[8], ticks[9]
    # guest time is already inside user/nice on Linux; iowait is idle time.
    total = sum(ticks) - guest - guest_nice
    ticks_per_s = os.sysconf("SC_CLK_TCK")
    return (total - idle - iowait) / ticks_per_s, total / ticks_per_s


def _psutil_cpu_busy_and_total_s() -> tuple[float, float]:
    import psutil

    times = psutil.cpu_times()
    total_s = float(sum(times)) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    idle_s = float(times.idle) + getattr(times, "iowait", 0.0)
    return total_s - idle_s, total_s


class CpuUtilizationMeter:
    """CPU utilisation between consecutive calls, with state of its own.

    psutil.cpu_percent(interval=None) keeps its reference point per calling
    thread; the agent samples from a thread pool, so whichever worker runs a
    round would measure from its own last call. Each meter keeps its own point.
    """

    def __init__(
        self, read_busy_and_total_s: Callable[[], tuple[float, float]] = read_cpu_busy_and_total_s
    ) -> None:
        self._read = read_busy_and_total_s
        self._last_busy_s, self._last_total_s = self._read()

    def restart(self) -> None:
        self._last_busy_s, self._last_total_s = self._read()

    def utilization_pct(self) -> float:
        """Percent busy since the previous call (or since construction/restart)."""
        busy_s, total_s = self._read()
        busy_delta_s = busy_s - self._last_busy_s
        total_delta_s = total_s - self._last_total_s
        self._last_busy_s, self._last_total_s = busy_s, total_s
        if total_delta_s <= 0:
            return 0.0
        return min(100.0, max(0.0, 100.0 * busy_delta_s / total_delta_s))


def read_memory_used_and_total_bytes(proc_meminfo: Path = PROC_MEMINFO) -> tuple[int, int]:
    """(used, total) bytes: total - available, not psutil's `used`: page cache is
    reclaimable and a scheduler asking "how much can a model still get" wants what is
    really taken."""
    try:
        meminfo = proc_meminfo.read_text()
    except OSError:  # no /proc: not Linux
        meminfo = ""
    kib: dict[str, int] = {}
    for line in meminfo.splitlines():
        name, _, value = line.partition(":")
        if name in ("MemTotal", "MemAvailable"):
            kib[name] = int(value.split()[0])
    if len(kib) == 2:
        total_bytes, available_bytes = kib["MemTotal"] * 1024, kib["MemAvailable"] * 1024
    else:  # not Linux, or a kernel older than 3.14 (psutil estimates what is available)
        import psutil

        memory = psutil.virtual_memory()
        total_bytes, available_bytes = int(memory.total), int(memory.available)
    return max(0, total_bytes - available_bytes), total_bytes


def read_temperatures_c(
    hwmon_dir: Path = HWMON_DIR, thermal_dir: Path = THERMAL_DIR
) -> dict[str, list[tuple[str, float]]]:
    """Chip name -> its (label, °C) readings, as psutil.sensors_temperatures finds them on
    Linux: every hwmon `temp*_input`, else (no hwmon reading at all) every thermal zone,
    named by its type, without labels."""
    if not hwmon_dir.is_dir() and not thermal_dir.is_dir():  # not Linux
        return _psutil_temperatures_c()
    readings: dict[str, list[tuple[str, float]]] = {}
    inputs = sorted(
        {*hwmon_dir.glob("hwmon*/temp*_input"), *hwmon_dir.glob("hwmon*/device/temp*_input")}
    )
    for input_path in inputs:
        base = str(input_path).removesuffix("_input")
        try:
            current_c = float(input_path.read_text()) / 1000
            chip = (input_path.parent / "name").read_text().strip()
        except (OSError, ValueError):  # a sensor that cannot be read now
            continue
        try:
            label = Path(base + "_label").read_text().strip()
        except (OSError, ValueError):  # unreadable, or not UTF-8 (UnicodeDecodeError)
            label = ""
        readings.setdefault(chip, []).append((label, current_c))
    if inputs:
        return readings
    for zone in sorted(thermal_dir.glob("thermal_zone*")):
        try:
            current_c = float((zone / "temp").read_text()) / 1000
            chip = (zone / "type").read_text().strip()
        except (OSError, ValueError):
            continue
        readings.setdefault(chip, []).append(("", current_c))
    return readings


def _psutil_temperatures_c() -> dict[str, list[tuple[str, float]]]:
    import psutil

    sensors_temperatures = getattr(psutil, "sensors_temperatures", None)
    if sensors_temperatures is None:  # not offered on macOS/Windows
        return {}
    return {
        chip: [(entry.label, float(entry.current)) for entry in entries]
        for chip, entries in sensors_temperatures().items()
    }


def read_cpu_temperature_c(
    read_temperatures: Callable[[], dict[str, list[tuple[str, float]]]] = read_temperatures_c,
) -> float | None:
    """The CPU package temperature, or None where no chip of the CPU's reads one."""
    try:
        readings = read_temperatures()
    except (OSError, ValueError) as error:  # a sensor's text that is not UTF-8 too
        log.debug("temperature sensors unreadable", error=repr(error))
        return None
    for chip in _CPU_SENSOR_CHIPS:
        entries = readings.get(chip)
        if not entries:
            continue
        by_label = dict(entries)
        for label in _PACKAGE_SENSOR_LABELS:
            if label in by_label:
                return by_label[label]
        return max(current_c for _, current_c in entries)
    return None


@dataclass(slots=True)
class _RaplPackage:
    energy_path: Path
    max_energy_range_uj: int
    last_energy_uj: int


class RaplEnergyMeter:
    """Cumulative CPU package energy from the Linux powercap RAPL counters.

    Sums every `intel-rapl:N` zone named `package-N` (one per socket; the same
    driver serves AMD Zen). Sub-zones (`intel-rapl:N:M`: core, uncore, dram) are
    inside their package, and `psys` covers the whole platform, so both are left
    out to avoid counting energy twice. Since Linux 5.10 `energy_uj` is readable
    by root only (CVE-2020-8694); an agent without access reports no energy.
    Counters wrap at `max_energy_range_uj`.
    """

    def __init__(self, powercap_dir: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self._powercap_dir = powercap_dir
        self._clock = clock
        self._packages: list[_RaplPackage] = []
        self._energy_j = 0.0
        self._last_read_s = 0.0

    @property
    def available(self) -> bool:
        return bool(self._packages)

    def start(self) -> bool:
        """Find readable package counters and take the zero point; False when there are none."""
        self._packages = []
        self._energy_j = 0.0
        for zone in self._package_zones():
            try:
                package = _RaplPackage(
                    energy_path=zone / "energy_uj",
                    max_energy_range_uj=int((zone / "max_energy_range_uj").read_text()),
                    last_energy_uj=int((zone / "energy_uj").read_text()),
                )
            except (OSError, ValueError) as error:
                # All sockets or none: a partial sum would under-report the host.
                log.info(
                    "RAPL zone unreadable; CPU energy not reported",
                    zone=str(zone),
                    error=repr(error),
                )
                self._packages = []
                return False
            self._packages.append(package)
        self._last_read_s = self._clock()
        return self.available

    def _package_zones(self) -> Iterable[Path]:
        try:
            zones = sorted(self._powercap_dir.iterdir())
        except OSError:
            return []
        package_zones = []
        for zone in zones:
            if not _RAPL_PACKAGE_ZONE.match(zone.name):
                continue
            try:
                zone_name = (zone / "name").read_text().strip()
            except (OSError, ValueError):
                # Which socket's it is cannot be told: all sockets or none, as start()
                # holds for the counters (a partial sum would under-report the host).
                log.info("RAPL zone name unreadable; CPU energy not reported", zone=str(zone))
                return []
            if zone_name.startswith("package"):
                package_zones.append(zone)
        return package_zones

    def read(self) -> tuple[float | None, float | None]:
        """(cumulative energy J since start, mean power W since the previous read)."""
        if not self._packages:
            return None, None
        try:
            readings_uj = [int(package.energy_path.read_text()) for package in self._packages]
        except (OSError, ValueError) as error:
            log.debug("RAPL read failed", error=repr(error))
            return None, None
        now_s = self._clock()
        delta_j = 0.0
        for package, energy_uj in zip(self._packages, readings_uj, strict=True):
            delta_uj = energy_uj - package.last_energy_uj
            if delta_uj < 0:
                # A wrap at max_energy_range_uj; where that cannot be it (no range, or a
                # reading that was past it) a reset: counted from zero, never negative,
                # which the control plane refuses along with the node's whole sample.
                wrapped = 0 < package.last_energy_uj <= package.max_energy_range_uj
                delta_uj = delta_uj + package.max_energy_range_uj if wrapped else energy_uj
                delta_uj = max(0, delta_uj)
            package.last_energy_uj = energy_uj
            delta_j += delta_uj / 1e6
        self._energy_j += delta_j
        elapsed_s = now_s - self._last_read_s
        self._last_read_s = now_s
        power_w = delta_j / elapsed_s if elapsed_s > 0 else None
        return self._energy_j, power_w


class CpuProbe:
    """The host CPU as one schedulable accelerator, "cpu0".

    Not safe for concurrent calls: the agent calls one probe method at a time.
    """

    def __init__(
        self,
        *,
        cpuinfo_path: Path = Path("/proc/cpuinfo"),
        powercap_dir: Path = Path("/sys/class/powercap"),
        available_providers: Sequence[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._cpuinfo_path = cpuinfo_path
        self._available_providers = available_providers
        self._rapl = RaplEnergyMeter(powercap_dir, clock)
        self._utilization = CpuUtilizationMeter()
        self._discovered = False

    @property
    def name(self) -> str:
        return "cpu"

    def discover(self) -> Sequence[Accelerator]:
        identity = read_cpu_identity(self._cpuinfo_path)
        _, memory_total_bytes = read_memory_used_and_total_bytes()
        self._rapl.start()
        self._utilization.restart()
        self._discovered = True
        return [
            Accelerator(
                id=CPU_ACCELERATOR_ID,
                kind="cpu",
                vendor=identity.vendor,
                model=identity.model or "unknown",
                memory_bytes=memory_total_bytes,
                compute_units=logical_core_count(),
                # No per-model power table for CPUs: measured RAPL power replaces it.
                idle_power_w=None,
                max_power_w=None,
                onnx_providers=providers_for("cpu", self._available_providers),
                features=identity.features,
            )
        ]

    def sample(self) -> Sequence[AcceleratorSample]:
        if not self._discovered:
            return []
        memory_used_bytes, _ = read_memory_used_and_total_bytes()
        energy_j, power_w = self._rapl.read()
        return [
            AcceleratorSample(
                id=CPU_ACCELERATOR_ID,
                utilization_pct=self._utilization.utilization_pct(),
                memory_used_bytes=memory_used_bytes,
                power_w=power_w,
                temperature_c=read_cpu_temperature_c(),
                energy_j=energy_j,
            )
        ]

    def close(self) -> None:
        """Nothing to release: /proc and sysfs hold no handles between calls."""


class LocalHostProbe:
    """Host facts (HostInfo) and host-wide CPU/RAM readings of the machine the agent runs on."""

    def __init__(self) -> None:
        self._utilization = CpuUtilizationMeter()

    def host_info(self) -> HostInfo:
        _, memory_total_bytes = read_memory_used_and_total_bytes()
        return HostInfo(
            hostname=socket.gethostname(),
            os=platform.platform(),
            arch=platform.machine(),
            cpu_logical_cores=logical_core_count(),
            memory_total_bytes=memory_total_bytes,
        )

    def sample(self) -> HostSample:
        memory_used_bytes, memory_total_bytes = read_memory_used_and_total_bytes()
        return HostSample(
            cpu_utilization_pct=self._utilization.utilization_pct(),
            memory_used_bytes=memory_used_bytes,
            memory_total_bytes=memory_total_bytes,
        )
