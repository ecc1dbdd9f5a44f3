"""CPU and host probes: against this machine, and against fake cpuinfo and RAPL trees."""

from __future__ import annotations

import os
import platform
import socket
import time
from pathlib import Path

import msgspec
import psutil
import pytest

from edge.discovery import cpu as cpu_module
from edge.discovery.cpu import (
    CpuProbe,
    CpuUtilizationMeter,
    LocalHostProbe,
    RaplEnergyMeter,
    parse_cpuinfo,
    read_cpu_identity,
)
from edge.discovery.onnx_providers import available_onnx_providers
from shared.messages import Accelerator, AcceleratorSample, encode

X86_CPUINFO = """\
processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 106
model name\t: Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz
flags\t\t: fpu vme sse sse2 avx avx2 avx512f avx512_vnni avx2 amx_tile

processor\t: 1
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz
flags\t\t: fpu vme sse sse2 avx avx2 avx512f avx512_vnni

"""

AMD_CPUINFO = """\
processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7763 64-Core Processor
flags\t\t: fpu sse2 avx2 sha_ni
"""

# A Raspberry Pi 4 under a 64-bit kernel: no `model name`, a board `Model` at the end.
RASPBERRY_PI_CPUINFO = """\
processor\t: 0
BogoMIPS\t: 108.00
Features\t: fp asimd evtstrm crc32 cpuid
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x0
CPU part\t: 0xd08
CPU revision\t: 3

processor\t: 1
BogoMIPS\t: 108.00
Features\t: fp asimd evtstrm crc32 cpuid
CPU implementer\t: 0x41
CPU part\t: 0xd08

Hardware\t: BCM2835
Revision\t: c03114
Serial\t\t: 10000000abcdef01
Model\t\t: Raspberry Pi 4 Model B Rev 1.4
"""

# An Arm server (Ampere Altra, Neoverse-N1 cores): neither Model nor Hardware.
ARM_SERVER_CPUINFO = """\
processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x3
CPU part\t: 0xd0c
CPU revision\t: 1
"""

ARM_BOARD_HARDWARE_ONLY = """\
processor\t: 0
Features\t: half thumb fastmult vfp edsp neon
CPU implementer\t: 0x51
CPU part\t: 0x06f

Hardware\t: Qualcomm Technologies, Inc SDM845
"""


def _validated(accelerator: Accelerator) -> Accelerator:
    """Round-trip through the wire decoder, which enforces the schema's constraints."""
    return msgspec.json.decode(encode(accelerator), type=Accelerator)


# ---- this machine ---------------------------------------------------------------


def test_discovers_this_machines_cpu() -> None:
    probe = CpuProbe()
    (accelerator,) = probe.discover()

    assert _validated(accelerator) == accelerator
    assert accelerator.id == "cpu0"
    assert accelerator.kind == "cpu"
    assert accelerator.model.strip()
    assert accelerator.compute_units == psutil.cpu_count(logical=True)
    assert accelerator.memory_bytes == psutil.virtual_memory().total > 0
    assert list(accelerator.features) == sorted(set(accelerator.features))
    assert accelerator.idle_power_w is None
    assert accelerator.max_power_w is None
    expected_providers = (
        ("CPUExecutionProvider",) if "CPUExecutionProvider" in available_onnx_providers() else ()
    )
    assert accelerator.onnx_providers == expected_providers


def test_this_machines_cpu_sample_is_in_range(tmp_path: Path) -> None:
    # An empty powercap tree makes "no RAPL" certain whatever machine runs this.
    probe = CpuProbe(powercap_dir=tmp_path)
    probe.discover()
    deadline = time.monotonic() + 0.2
    while time.monotonic() < deadline:  # some busy time to measure
        sum(range(10_000))

    (sample,) = probe.sample()

    assert msgspec.json.decode(encode(sample), type=AcceleratorSample) == sample
    assert sample.id == "cpu0"
    assert 0.0 <= sample.utilization_pct <= 100.0
    assert 0 < sample.memory_used_bytes <= psutil.virtual_memory().total
    assert sample.power_w is None
    assert sample.energy_j is None


def test_sample_before_discover_reports_nothing() -> None:
    assert CpuProbe().sample() == []


def test_host_probe_describes_this_machine() -> None:
    probe = LocalHostProbe()
    info = probe.host_info()

    assert info.hostname == socket.gethostname()
    assert info.os == platform.platform()
    assert info.arch == platform.machine()
    assert info.cpu_logical_cores == psutil.cpu_count(logical=True)
    assert info.memory_total_bytes == psutil.virtual_memory().total

    sample = probe.sample()
    assert 0.0 <= sample.cpu_utilization_pct <= 100.0
    assert sample.memory_total_bytes == info.memory_total_bytes
    assert 0 < sample.memory_used_bytes <= sample.memory_total_bytes


# ---- cpuinfo parsing ------------------------------------------------------------


def test_parses_x86_cpuinfo() -> None:
    identity = parse_cpuinfo(X86_CPUINFO)

    assert identity.model == "Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz"
    assert identity.vendor == "intel"
    # Sorted, deduplicated, and only flags that every core has (amx_tile is on cpu0 only).
    assert identity.features == (
        "avx",
        "avx2",
        "avx512_vnni",
        "avx512f",
        "fpu",
        "sse",
        "sse2",
        "vme",
    )


def test_parses_amd_vendor() -> None:
    identity = parse_cpuinfo(AMD_CPUINFO)

    assert identity.vendor == "amd"
    assert identity.model == "AMD EPYC 7763 64-Core Processor"
    assert identity.features == ("avx2", "fpu", "sha_ni", "sse2")


def test_parses_arm_board_cpuinfo() -> None:
    identity = parse_cpuinfo(RASPBERRY_PI_CPUINFO)

    assert identity.model == "Raspberry Pi 4 Model B Rev 1.4"
    assert identity.vendor == "arm"
    assert identity.features == ("asimd", "cpuid", "crc32", "evtstrm", "fp")


def test_arm_server_without_model_is_named_by_cpu_part() -> None:
    identity = parse_cpuinfo(ARM_SERVER_CPUINFO)

    assert identity.model == "Neoverse-N1"
    assert identity.vendor == "arm"
    assert "atomics" in identity.features


def test_arm_hardware_line_and_other_implementers() -> None:
    identity = parse_cpuinfo(ARM_BOARD_HARDWARE_ONLY)

    assert identity.model == "Qualcomm Technologies, Inc SDM845"
    assert identity.vendor == "qualcomm"


def test_unknown_arm_part_keeps_its_code() -> None:
    identity = parse_cpuinfo("CPU implementer\t: 0x41\nCPU part\t: 0xfff\n")

    assert identity.model == "ARM CPU part 0xfff"


def test_unrecognised_cpuinfo_has_unknown_vendor_and_no_model() -> None:
    identity = parse_cpuinfo("processor\t: 0\nvendor_id\t: HygonGenuine\n")

    assert identity.vendor == "unknown"
    assert identity.model is None
    assert identity.features == ()


def test_missing_cpuinfo_falls_back_to_platform(tmp_path: Path) -> None:
    identity = read_cpu_identity(tmp_path / "no-cpuinfo")

    assert identity.model == (platform.processor() or platform.machine() or "unknown")
    assert identity.vendor == "unknown"
    assert identity.features == ()


def test_probe_reads_injected_cpuinfo(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(ARM_SERVER_CPUINFO)

    (accelerator,) = CpuProbe(
        cpuinfo_path=cpuinfo, powercap_dir=tmp_path, available_providers=("CPUExecutionProvider",)
    ).discover()

    assert accelerator.model == "Neoverse-N1"
    assert accelerator.vendor == "arm"
    assert accelerator.onnx_providers == ("CPUExecutionProvider",)


def test_no_onnx_runtime_means_no_providers(tmp_path: Path) -> None:
    (accelerator,) = CpuProbe(powercap_dir=tmp_path, available_providers=()).discover()

    assert accelerator.onnx_providers == ()


# ---- utilisation ----------------------------------------------------------------


def test_utilization_meter_measures_between_calls() -> None:
    readings = iter([(10.0, 100.0), (15.0, 110.0), (15.0, 120.0), (15.0, 120.0)])
    meter = CpuUtilizationMeter(lambda: next(readings))

    assert meter.utilization_pct() == pytest.approx(50.0)
    assert meter.utilization_pct() == pytest.approx(0.0)
    assert meter.utilization_pct() == 0.0  # no time passed: no division by zero


# ---- RAPL energy ----------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def _rapl_zone(
    powercap: Path, zone: str, name: str, energy_uj: int | None, max_range_uj: int = 262_143_328_850
) -> Path:
    directory = powercap / zone
    directory.mkdir(parents=True)
    (directory / "name").write_text(f"{name}\n")
    (directory / "max_energy_range_uj").write_text(f"{max_range_uj}\n")
    if energy_uj is not None:
        (directory / "energy_uj").write_text(f"{energy_uj}\n")
    return directory


def test_rapl_energy_and_power_between_samples(tmp_path: Path) -> None:
    package = _rapl_zone(tmp_path, "intel-rapl:0", "package-0", 5_000_000)
    # Sub-zones and the platform zone would count the package twice: ignored.
    _rapl_zone(tmp_path, "intel-rapl:0:0", "core", 1_000_000)
    platform_zone = _rapl_zone(tmp_path, "intel-rapl:1", "psys", 9_000_000)
    clock = FakeClock()
    probe = CpuProbe(powercap_dir=tmp_path, clock=clock)
    probe.discover()

    (package / "energy_uj").write_text("65000000\n")  # +60 J
    (platform_zone / "energy_uj").write_text("999000000\n")
    clock.now_s += 2.0
    (first,) = probe.sample()
    assert first.energy_j == pytest.approx(60.0)
    assert first.power_w == pytest.approx(30.0)

    (package / "energy_uj").write_text("75000000\n")  # +10 J
    clock.now_s += 1.0
    (second,) = probe.sample()
    assert second.energy_j == pytest.approx(70.0)
    assert second.power_w == pytest.approx(10.0)


def test_rapl_counter_wraparound(tmp_path: Path) -> None:
    package = _rapl_zone(
        tmp_path, "intel-rapl:0", "package-0", 999_000_000, max_range_uj=1_000_000_000
    )
    clock = FakeClock()
    meter = RaplEnergyMeter(tmp_path, clock)
    assert meter.start()

    (package / "energy_uj").write_text("1000000\n")  # wrapped past 1e9 µJ
    clock.now_s += 1.0

    energy_j, power_w = meter.read()
    assert energy_j == pytest.approx(2.0)
    assert power_w == pytest.approx(2.0)


def test_rapl_sums_sockets(tmp_path: Path) -> None:
    socket0 = _rapl_zone(tmp_path, "intel-rapl:0", "package-0", 0)
    socket1 = _rapl_zone(tmp_path, "intel-rapl:1", "package-1", 0)
    clock = FakeClock()
    meter = RaplEnergyMeter(tmp_path, clock)
    meter.start()
    (socket0 / "energy_uj").write_text("3000000\n")
    (socket1 / "energy_uj").write_text("5000000\n")
    clock.now_s += 4.0

    energy_j, power_w = meter.read()
    assert energy_j == pytest.approx(8.0)
    assert power_w == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("max_range_uj", "before_uj", "after_uj", "counted_j"),
    [
        (0, 5_000_000, 1_000_000, 1.0),  # no range announced: a reset, counted from zero
        (1000, 5000, 10, 0.00001),  # a drop larger than the range: a reset too
    ],
)
def test_a_rapl_counter_that_goes_back_without_a_wrap_never_counts_negative_energy(
    tmp_path: Path, max_range_uj: int, before_uj: int, after_uj: int, counted_j: float
) -> None:
    # A negative figure made the control plane refuse the node's whole sample
    # (energy_j and power_w are >= 0 on the wire), its GPUs' included.
    package = _rapl_zone(tmp_path, "intel-rapl:0", "package-0", before_uj, max_range_uj)
    clock = FakeClock()
    probe = CpuProbe(powercap_dir=tmp_path, clock=clock)
    probe.discover()
    (package / "energy_uj").write_text(f"{after_uj}\n")
    clock.now_s += 1.0
    (sample,) = probe.sample()
    assert sample.energy_j == pytest.approx(counted_j)
    assert sample.power_w is not None
    assert sample.power_w >= 0
    telemetry = msgspec.json.encode(sample)
    assert msgspec.json.decode(telemetry, type=AcceleratorSample) == sample  # wire bounds hold


def test_a_package_zone_whose_name_cannot_be_read_means_no_energy(tmp_path: Path) -> None:
    # All sockets or none: one socket left out would under-report the host's energy.
    _rapl_zone(tmp_path, "intel-rapl:0", "package-0", 0)
    unreadable = _rapl_zone(tmp_path, "intel-rapl:1", "package-1", 0)
    (unreadable / "name").unlink()
    (unreadable / "name").mkdir()  # reading it fails, as EACCES or EIO would
    assert not RaplEnergyMeter(tmp_path, FakeClock()).start()


def test_unreadable_rapl_means_no_energy(tmp_path: Path) -> None:
    # energy_uj missing stands for "root only" (Linux 5.10+ for unprivileged agents).
    _rapl_zone(tmp_path, "intel-rapl:0", "package-0", None)
    probe = CpuProbe(powercap_dir=tmp_path)
    probe.discover()

    (sample,) = probe.sample()

    assert sample.energy_j is None
    assert sample.power_w is None


# ---- temperature ----------------------------------------------------------------


def test_temperature_prefers_the_package_reading() -> None:
    readings = {
        "nvme": [("Composite", 70.0)],
        "coretemp": [("Core 0", 60.0), ("Package id 0", 55.0)],
    }
    assert cpu_module.read_cpu_temperature_c(lambda: readings) == 55.0


def test_temperature_of_a_chip_without_package_label_is_its_hottest() -> None:
    readings = {"cpu_thermal": [("", 48.5), ("", 51.0)]}
    assert cpu_module.read_cpu_temperature_c(lambda: readings) == 51.0


def test_no_cpu_sensor_means_no_temperature() -> None:
    assert cpu_module.read_cpu_temperature_c(lambda: {"nvme": [("Composite", 40.0)]}) is None
    assert cpu_module.read_cpu_temperature_c(lambda: {}) is None


def _hwmon_chip(
    hwmon_dir: Path, index: int, name: str, readings: dict[int, tuple[str | None, str]]
) -> None:
    chip = hwmon_dir / f"hwmon{index}"
    chip.mkdir(parents=True)
    (chip / "name").write_text(f"{name}\n")
    for number, (label, millidegrees) in readings.items():
        (chip / f"temp{number}_input").write_text(f"{millidegrees}\n")
        if label is not None:
            (chip / f"temp{number}_label").write_text(f"{label}\n")


def test_temperatures_are_read_from_hwmon_as_psutil_reads_them(tmp_path: Path) -> None:
    hwmon, thermal = tmp_path / "hwmon", tmp_path / "thermal"
    _hwmon_chip(hwmon, 0, "nvme", {1: ("Composite", "40850")})
    _hwmon_chip(hwmon, 1, "coretemp", {1: ("Package id 0", "55000"), 2: ("Core 0", "60000")})
    _hwmon_chip(hwmon, 2, "acpitz", {1: (None, "27800"), 2: (None, "not a number")})
    zone = thermal / "thermal_zone0"  # read only where hwmon has no reading at all
    zone.mkdir(parents=True)
    (zone / "type").write_text("x86_pkg_temp\n")
    (zone / "temp").write_text("50000\n")

    readings = cpu_module.read_temperatures_c(hwmon, thermal)

    assert readings == {
        "nvme": [("Composite", 40.85)],
        "coretemp": [("Package id 0", 55.0), ("Core 0", 60.0)],
        "acpitz": [("", 27.8)],
    }
    assert cpu_module.read_cpu_temperature_c(lambda: readings) == 55.0


def test_a_sensor_label_that_is_not_utf8_loses_its_label_not_the_cpus_sample(
    tmp_path: Path,
) -> None:
    hwmon, thermal = tmp_path / "hwmon", tmp_path / "thermal"
    _hwmon_chip(hwmon, 0, "coretemp", {1: ("Package id 0", "55000")})
    (hwmon / "hwmon0" / "temp1_label").write_bytes(b"Package id 0\xff\n")
    readings = cpu_module.read_temperatures_c(hwmon, thermal)
    assert readings == {"coretemp": [("", 55.0)]}
    assert cpu_module.read_cpu_temperature_c(lambda: readings) == 55.0


def test_without_hwmon_readings_thermal_zones_are_read(tmp_path: Path) -> None:
    thermal = tmp_path / "thermal"
    for index, (kind, millidegrees) in enumerate(
        [("cpu-thermal", "51540"), ("gpu-thermal", "49000")]
    ):
        zone = thermal / f"thermal_zone{index}"
        zone.mkdir(parents=True)
        (zone / "type").write_text(f"{kind}\n")
        (zone / "temp").write_text(f"{millidegrees}\n")

    readings = cpu_module.read_temperatures_c(tmp_path / "hwmon", thermal)

    assert readings == {"cpu-thermal": [("", 51.54)], "gpu-thermal": [("", 49.0)]}
    assert cpu_module.read_cpu_temperature_c(lambda: readings) == 51.54


def test_this_machines_temperatures_are_psutils() -> None:
    expected = {
        chip: [(entry.label, entry.current) for entry in entries]
        for chip, entries in psutil.sensors_temperatures().items()
    }
    assert cpu_module.read_temperatures_c() == pytest.approx(expected)


# ---- /proc --------------------------------------------------------------------


def test_cpu_times_are_read_from_proc_stat(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  100 20 30 400 50 6 7 8 9 10\ncpu0 1 2 3 4 5 6 7 8 9 10\nintr 1 2\n")
    ticks_per_s = os.sysconf("SC_CLK_TCK")

    busy_s, total_s = cpu_module.read_cpu_busy_and_total_s(stat)

    # guest and guest_nice are inside user and nice already; idle and iowait are not busy.
    assert total_s == pytest.approx((640 - 9 - 10) / ticks_per_s)
    assert busy_s == pytest.approx((640 - 9 - 10 - 400 - 50) / ticks_per_s)
    stat.write_text("cpu  100 20 30 400\n")  # a kernel from before iowait
    assert cpu_module.read_cpu_busy_and_total_s(stat) == pytest.approx(
        (150 / ticks_per_s, 550 / ticks_per_s)
    )


def test_this_machines_cpu_times_are_psutils() -> None:
    ours = cpu_module.read_cpu_busy_and_total_s()
    theirs = cpu_module._psutil_cpu_busy_and_total_s()
    assert ours == pytest.approx(theirs, abs=0.5)  # a few ticks apart at most


def test_memory_is_read_from_proc_meminfo(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(
        "MemTotal:       16000000 kB\nMemFree:         1000000 kB\n"
        "MemAvailable:    6000000 kB\nBuffers:          200000 kB\n"
    )
    assert cpu_module.read_memory_used_and_total_bytes(meminfo) == (
        10_000_000 * 1024,
        16_000_000 * 1024,
    )
    # Without MemAvailable (Linux before 3.14), psutil estimates it.
    meminfo.write_text("MemTotal:       16000000 kB\n")
    _, total_bytes = cpu_module.read_memory_used_and_total_bytes(meminfo)
    assert total_bytes == psutil.virtual_memory().total


def test_this_machines_memory_total_is_psutils() -> None:
    used_bytes, total_bytes = cpu_module.read_memory_used_and_total_bytes()
    assert total_bytes == psutil.virtual_memory().total
    assert 0 < used_bytes <= total_bytes
