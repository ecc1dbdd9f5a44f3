"""NPU probe against fake sysfs and /dev trees built under tmp_path."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from edge.discovery.npu import NpuProbe
from shared.messages import Accelerator, AcceleratorSample, encode

NPU_PROVIDERS = (
    "OpenVINOExecutionProvider",
    "VitisAIExecutionProvider",
    "QNNExecutionProvider",
    "CANNExecutionProvider",
    "RknpuExecutionProvider",
    "CUDAExecutionProvider",
    "CPUExecutionProvider",
)


def _accel(
    root: Path, name: str, vendor: str | None, device: str | None, driver: str | None = None
) -> Path:
    """A /sys/class/accel entry; its PCI ids are written the way sysfs prints them."""
    device_dir = root / "sys/class/accel" / name / "device"
    device_dir.mkdir(parents=True)
    if vendor is not None:
        (device_dir / "vendor").write_text(f"{vendor}\n")
    if device is not None:
        (device_dir / "device").write_text(f"{device}\n")
    if driver is not None:
        driver_dir = root / "sys/bus/pci/drivers" / driver
        driver_dir.mkdir(parents=True)
        (device_dir / "driver").symlink_to(driver_dir)
    return device_dir


def _node(root: Path, relative: str) -> None:
    node = root / "dev" / relative
    node.parent.mkdir(parents=True, exist_ok=True)
    node.touch()


def _discover(root: Path, providers: tuple[str, ...] = NPU_PROVIDERS) -> list[Accelerator]:
    accelerators = list(NpuProbe(root=root, available_providers=providers).discover())
    for accelerator in accelerators:
        assert msgspec.json.decode(encode(accelerator), type=Accelerator) == accelerator
        assert accelerator.kind == "npu"
    return accelerators


def test_empty_root_has_no_npus(tmp_path: Path) -> None:
    assert _discover(tmp_path) == []


def test_root_with_unrelated_devices_has_no_npus(tmp_path: Path) -> None:
    for name in ("null", "nvidia0", "davinci_manager", "hailo_ctl", "accel/not-an-accel"):
        _node(tmp_path, name)

    assert _discover(tmp_path) == []


def test_intel_meteor_lake_npu(tmp_path: Path) -> None:
    _accel(tmp_path, "accel0", "0x8086", "0x7d1d", driver="intel_vpu")
    _node(tmp_path, "accel/accel0")

    (npu,) = _discover(tmp_path)

    assert npu.id == "npu0"
    assert npu.vendor == "intel"
    assert npu.model == "Intel Meteor Lake NPU"
    assert npu.index == 0
    assert npu.memory_bytes == 0  # shares host RAM
    assert npu.compute_units == 2
    assert npu.relative_speed is not None
    assert 0 < npu.relative_speed < 0.1
    assert npu.onnx_providers == ("OpenVINOExecutionProvider",)


def test_intel_npu_without_openvino_build_has_no_providers(tmp_path: Path) -> None:
    _accel(tmp_path, "accel0", "0x8086", "0x643e")

    (npu,) = _discover(tmp_path, providers=("CPUExecutionProvider",))

    assert npu.model == "Intel Lunar Lake NPU"
    assert npu.onnx_providers == ()


def test_amd_xdna_npu(tmp_path: Path) -> None:
    _accel(tmp_path, "accel0", "0x1022", "0x17f0", driver="amdxdna")

    (npu,) = _discover(tmp_path)

    assert npu.vendor == "amd"
    assert "XDNA" in npu.model
    assert npu.onnx_providers == ("VitisAIExecutionProvider",)


def test_known_vendor_new_device_keeps_vendor_and_ids(tmp_path: Path) -> None:
    _accel(tmp_path, "accel0", "0x8086", "0xb03e")

    (npu,) = _discover(tmp_path)

    assert npu.vendor == "intel"
    assert "0x8086:0xb03e" in npu.model
    assert npu.relative_speed is None
    assert npu.onnx_providers == ("OpenVINOExecutionProvider",)


def test_unknown_accel_vendor(tmp_path: Path) -> None:
    _accel(tmp_path, "accel0", "0x1234", "0x5678", driver="mystery")

    (npu,) = _discover(tmp_path)

    assert npu.vendor == "unknown"
    assert "0x1234" in npu.model
    assert "0x5678" in npu.model
    assert "mystery" in npu.model
    assert npu.onnx_providers == ()
    assert (npu.compute_units, npu.idle_power_w, npu.max_power_w) == (0, None, None)


def test_coral_edge_tpu(tmp_path: Path) -> None:
    _node(tmp_path, "apex_0")

    (tpu,) = _discover(tmp_path)

    assert tpu.vendor == "google"
    assert tpu.model == "Coral Edge TPU"
    assert tpu.index == 0
    assert (tpu.idle_power_w, tpu.max_power_w) == (0.5, 2.0)
    assert tpu.onnx_providers == ()  # no ONNX Runtime provider exists for it


def test_hailo(tmp_path: Path) -> None:
    _node(tmp_path, "hailo0")

    (hailo,) = _discover(tmp_path)

    assert hailo.vendor == "hailo"
    assert hailo.model == "Hailo-8"
    assert hailo.max_power_w == 2.5
    assert hailo.onnx_providers == ()


def test_other_vendor_nodes(tmp_path: Path) -> None:
    for name in ("rknpu", "davinci0", "davinci1", "davinci_manager"):
        _node(tmp_path, name)

    accelerators = _discover(tmp_path)

    assert [(a.vendor, a.index, a.onnx_providers) for a in accelerators] == [
        ("rockchip", None, ("RknpuExecutionProvider",)),
        ("huawei", 0, ("CANNExecutionProvider",)),
        ("huawei", 1, ("CANNExecutionProvider",)),
    ]


def test_device_in_sysfs_and_dev_is_reported_once(tmp_path: Path) -> None:
    _accel(tmp_path, "accel0", "0x8086", "0x7d1d")
    _node(tmp_path, "accel/accel0")
    _node(tmp_path, "accel/accel1")  # a node whose sysfs entry is not visible

    accelerators = _discover(tmp_path)

    assert [(a.id, a.vendor, a.index) for a in accelerators] == [
        ("npu0", "intel", 0),
        ("npu1", "unknown", 1),
    ]


def test_mixed_machine_gets_stable_numbered_ids(tmp_path: Path) -> None:
    _accel(tmp_path, "accel10", "0x8086", "0x7d1d")
    _accel(tmp_path, "accel2", "0x1022", "0x1502")
    _node(tmp_path, "hailo0")
    _node(tmp_path, "apex_1")
    _node(tmp_path, "apex_0")

    accelerators = _discover(tmp_path)

    assert [(a.id, a.model) for a in accelerators] == [
        ("npu0", "AMD XDNA NPU (Phoenix)"),
        ("npu1", "Intel Meteor Lake NPU"),
        ("npu2", "Coral Edge TPU"),
        ("npu3", "Coral Edge TPU"),
        ("npu4", "Hailo-8"),
    ]
    assert [a.index for a in accelerators] == [2, 10, 0, 1, 0]


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 500.0

    def __call__(self) -> float:
        return self.now_s


def test_samples_are_idle_without_a_busy_counter(tmp_path: Path) -> None:
    _node(tmp_path, "apex_0")
    probe = NpuProbe(root=tmp_path, available_providers=())
    probe.discover()

    (sample,) = probe.sample()

    assert msgspec.json.decode(encode(sample), type=AcceleratorSample) == sample
    assert sample == AcceleratorSample(id="npu0", utilization_pct=0.0, memory_used_bytes=0)


def test_intel_npu_utilization_from_busy_time(tmp_path: Path) -> None:
    device_dir = _accel(tmp_path, "accel0", "0x8086", "0x7d1d")
    busy_time = device_dir / "npu_busy_time_us"
    busy_time.write_text("1000000\n")
    _node(tmp_path, "hailo0")
    clock = FakeClock()
    probe = NpuProbe(root=tmp_path, available_providers=(), clock=clock)
    probe.discover()

    busy_time.write_text("1500000\n")  # 0.5 s busy ...
    clock.now_s += 2.0  # ... in 2 s
    intel, hailo = probe.sample()

    assert intel.id == "npu0"
    assert intel.utilization_pct == pytest.approx(25.0)
    assert hailo.utilization_pct == 0.0

    clock.now_s += 1.0  # idle for 1 s
    assert probe.sample()[0].utilization_pct == 0.0


def test_sample_before_discover_reports_nothing(tmp_path: Path) -> None:
    _node(tmp_path, "apex_0")

    assert NpuProbe(root=tmp_path).sample() == []
