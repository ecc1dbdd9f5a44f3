"""NVIDIA probe against a fake NVML installed at the pynvml seam (tests/support/fake_nvml.py),
and the real one."""

from __future__ import annotations

from typing import Any

import msgspec
import pynvml
import pytest
from structlog.testing import CapturingLogger

from edge.agent.device_health import DeviceHealth
from edge.discovery import nvidia as nvidia_module
from edge.discovery.nvidia import XID_REASON, NvidiaProbe
from shared.messages import Accelerator, AcceleratorSample, encode
from tests.support.fake_nvml import FakeGpu, FakeMig, FakeNvml

GIB = 1024**3
ALL_PROVIDERS = ("CPUExecutionProvider", "CUDAExecutionProvider", "TensorrtExecutionProvider")


def _fleet() -> list[FakeGpu]:
    """gpu0: A100, gpu1: A100 in MIG mode (instances in slots 0 and 2), gpu2: H100."""
    return [
        FakeGpu(
            name="NVIDIA A100-SXM4-40GB",
            uuid="GPU-a100-0",
            memory_total_bytes=40 * GIB,
            power_limit_mw=400_000,
            pci_bus_id="00000000:07:00.0",
        ),
        FakeGpu(
            name="NVIDIA A100-SXM4-40GB",
            uuid="GPU-a100-1",
            memory_total_bytes=40 * GIB,
            power_limit_mw=400_000,
            pci_bus_id="00000000:0F:00.0",
            mig_enabled=True,
            migs={
                0: FakeMig("NVIDIA A100-SXM4-40GB MIG 3g.20gb", "MIG-aaaa", 20 * GIB, 5 * GIB, 42),
                2: FakeMig("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "MIG-bbbb", 5 * GIB, 1 * GIB, 14),
            },
        ),
        FakeGpu(
            name="NVIDIA H100 80GB HBM3",
            uuid="GPU-h100-2",
            memory_total_bytes=80 * GIB,
            power_limit_mw=700_000,
            sm_count=132,
            pci_bus_id="00000000:47:00.0",
        ),
    ]


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    nvml = FakeNvml(_fleet())
    nvml.install(monkeypatch)
    return nvml


@pytest.fixture
def captured_log(monkeypatch: pytest.MonkeyPatch) -> CapturingLogger:
    logger = CapturingLogger()
    monkeypatch.setattr(nvidia_module, "log", logger)
    return logger


def _by_id(accelerators: Any) -> dict[str, Accelerator]:
    return {accelerator.id: accelerator for accelerator in accelerators}


def test_discovers_gpus_and_mig_instances(fake_nvml: FakeNvml) -> None:
    accelerators = NvidiaProbe(available_providers=ALL_PROVIDERS).discover()

    # The MIG-mode GPU is represented by its instances only; the empty slot 1 is skipped.
    assert [a.id for a in accelerators] == ["gpu0", "gpu1-mig0", "gpu1-mig2", "gpu2"]
    for accelerator in accelerators:
        assert msgspec.json.decode(encode(accelerator), type=Accelerator) == accelerator
        assert accelerator.kind == "gpu"
        assert accelerator.vendor == "nvidia"
        # TensorRT before CUDA, and never the CPU provider on a GPU.
        assert accelerator.onnx_providers == (
            "TensorrtExecutionProvider",
            "CUDAExecutionProvider",
        )
    gpus = _by_id(accelerators)

    a100 = gpus["gpu0"]
    assert a100.uuid == "GPU-a100-0"
    assert a100.index == 0
    assert a100.model == "NVIDIA A100-SXM4-40GB"
    assert a100.memory_bytes == 40 * GIB
    assert a100.max_power_w == 400.0  # 400 000 mW
    assert a100.idle_power_w == 50.0
    assert a100.relative_speed == 1.0
    assert a100.compute_units == 108  # attributes NotSupported: from the model table
    assert a100.parent_id is None
    assert a100.pci_bus_id == "00000000:07:00.0"

    h100 = gpus["gpu2"]
    assert (h100.uuid, h100.index, h100.memory_bytes) == ("GPU-h100-2", 2, 80 * GIB)
    assert h100.max_power_w == 700.0
    assert h100.idle_power_w == 70.0
    assert h100.relative_speed == 2.5
    assert h100.compute_units == 132  # from nvmlDeviceGetAttributes
    assert h100.pci_bus_id == "00000000:47:00.0"

    big_slice, small_slice = gpus["gpu1-mig0"], gpus["gpu1-mig2"]
    assert (big_slice.uuid, small_slice.uuid) == ("MIG-aaaa", "MIG-bbbb")
    assert (big_slice.parent_id, small_slice.parent_id) == ("gpu1", "gpu1")
    assert (big_slice.memory_bytes, small_slice.memory_bytes) == (20 * GIB, 5 * GIB)
    assert (big_slice.compute_units, small_slice.compute_units) == (42, 14)
    assert big_slice.model == "NVIDIA A100-SXM4-40GB MIG 3g.20gb"
    assert big_slice.index is None  # addressed by MIG UUID
    # An instance sits at its GPU's PCI address.
    assert (big_slice.pci_bus_id, small_slice.pci_bus_id) == ("00000000:0F:00.0",) * 2
    # Speed and power are the instance's SM share of the A100's.
    assert big_slice.relative_speed == pytest.approx(42 / 108)
    assert big_slice.max_power_w == pytest.approx(400.0 * 42 / 108)
    assert small_slice.idle_power_w == pytest.approx(50.0 * 14 / 108)


def test_providers_are_only_those_the_onnxruntime_build_offers(fake_nvml: FakeNvml) -> None:
    cuda_only = NvidiaProbe(
        available_providers=("CUDAExecutionProvider", "CPUExecutionProvider")
    ).discover()
    cpu_only = NvidiaProbe(available_providers=("CPUExecutionProvider",)).discover()

    assert {a.onnx_providers for a in cuda_only} == {("CUDAExecutionProvider",)}
    assert {a.onnx_providers for a in cpu_only} == {()}


def test_unknown_model_has_no_table_values(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeNvml([FakeGpu(name="NVIDIA Future GPU", uuid="GPU-x", memory_total_bytes=GIB)]).install(
        monkeypatch
    )

    (gpu,) = NvidiaProbe(available_providers=()).discover()

    assert gpu.idle_power_w is None
    assert gpu.relative_speed is None
    assert gpu.compute_units == 0
    assert gpu.max_power_w == 400.0


def test_a_failing_field_is_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGpu(
        name="Tesla T4",
        uuid="GPU-t4",
        memory_total_bytes=16 * GIB,
        failing={
            "nvmlDeviceGetPowerManagementDefaultLimit": pynvml.NVMLError_NotSupported,
            "nvmlDeviceGetPowerManagementLimit": pynvml.NVMLError_NotSupported,
            "nvmlDeviceGetUUID": pynvml.NVMLError_Unknown,
            "nvmlDeviceGetMemoryInfo": pynvml.NVMLError_Unknown,
            "nvmlDeviceGetMigMode": pynvml.NVMLError_NotSupported,
            "nvmlDeviceGetPciInfo": pynvml.NVMLError_Unknown,
        },
    )
    FakeNvml([gpu]).install(monkeypatch)

    (t4,) = NvidiaProbe(available_providers=()).discover()

    assert t4.id == "gpu0"
    assert t4.max_power_w is None
    assert t4.uuid is None
    assert t4.memory_bytes == 0
    assert t4.pci_bus_id == ""
    assert (t4.idle_power_w, t4.relative_speed, t4.compute_units) == (10.0, 0.2, 40)


@pytest.mark.parametrize(
    ("bus_id", "wire"),
    [
        ("00000000:3B:00.0", "00000000:3B:00.0"),
        (b"00000000:3B:00.0", "00000000:3B:00.0"),  # an older pynvml's undecoded bytes
        ("0000:3B:00.0", "0000:3B:00.0"),  # the legacy 13-character form
        ("", ""),
        ("not a bus id", ""),  # left out rather than the birth refused
    ],
)
def test_the_pci_bus_id_is_nvmls_or_left_empty(
    monkeypatch: pytest.MonkeyPatch, bus_id: str | bytes, wire: str
) -> None:
    gpu = FakeGpu(name="Tesla T4", uuid="GPU-t4", memory_total_bytes=16 * GIB, pci_bus_id=bus_id)
    FakeNvml([gpu]).install(monkeypatch)

    (t4,) = NvidiaProbe(available_providers=()).discover()

    assert t4.pci_bus_id == wire
    assert msgspec.json.decode(encode(t4), type=Accelerator) == t4


def test_max_power_is_the_default_limit_while_a_lower_limit_is_held(fake_nvml: FakeNvml) -> None:
    a100, mig_parent, h100 = fake_nvml.gpus
    # Held to lower limits (a capped worker's, or an administrator's nvidia-smi -pl).
    a100.power_limit_mw = 200_000
    mig_parent.power_limit_mw = 250_000
    h100.power_limit_mw = 350_000
    # A driver without the default limit query: the current limit stands in.
    h100.failing["nvmlDeviceGetPowerManagementDefaultLimit"] = pynvml.NVMLError_NotSupported

    gpus = _by_id(NvidiaProbe(available_providers=()).discover())

    assert gpus["gpu0"].max_power_w == 400.0
    assert gpus["gpu1-mig0"].max_power_w == pytest.approx(400.0 * 42 / 108)
    assert gpus["gpu2"].max_power_w == 350.0


@pytest.mark.parametrize(
    "error",
    [pynvml.NVMLError_GpuIsLost, RuntimeError],
    ids=["nvml-error", "unexpected-error"],
)
def test_a_failing_device_does_not_hide_the_others(
    fake_nvml: FakeNvml, captured_log: CapturingLogger, error: type[Exception]
) -> None:
    fake_nvml.gpus[0].failing["nvmlDeviceGetName"] = error

    probe = NvidiaProbe(available_providers=())
    accelerators = probe.discover()

    assert [a.id for a in accelerators] == ["gpu1-mig0", "gpu1-mig2", "gpu2"]
    assert any(
        call.args == ("skipping NVIDIA GPU",) and call.kwargs["index"] == 0
        for call in captured_log.calls
    )
    assert [s.id for s in probe.sample()] == ["gpu1-mig0", "gpu1-mig2", "gpu2"]


def test_mig_instance_that_fails_is_skipped(fake_nvml: FakeNvml) -> None:
    fake_nvml.gpus[1].migs[2].failing["nvmlDeviceGetAttributes"] = RuntimeError

    accelerators = NvidiaProbe(available_providers=()).discover()

    assert [a.id for a in accelerators] == ["gpu0", "gpu1-mig0", "gpu2"]


def test_mig_mode_without_instances_lists_nothing_for_that_gpu(fake_nvml: FakeNvml) -> None:
    fake_nvml.gpus[1].migs.clear()

    accelerators = NvidiaProbe(available_providers=()).discover()

    assert [a.id for a in accelerators] == ["gpu0", "gpu2"]


def test_sample_converts_units_and_counts_energy_from_discovery(fake_nvml: FakeNvml) -> None:
    a100 = fake_nvml.gpus[0]
    probe = NvidiaProbe(available_providers=())
    probe.discover()  # energy zero point: a100 at 1 000 000 mJ

    a100.power_usage_mw = 250_500
    a100.utilization_pct = 73
    a100.temperature_c = 61
    a100.memory_used_bytes = 3 * GIB
    a100.energy_mj = 1_500_000
    samples = {s.id: s for s in probe.sample()}

    for sample in samples.values():
        assert msgspec.json.decode(encode(sample), type=AcceleratorSample) == sample
    first = samples["gpu0"]
    assert first.utilization_pct == 73.0
    assert first.memory_used_bytes == 3 * GIB
    assert first.power_w == pytest.approx(250.5)
    assert first.temperature_c == 61.0
    assert first.energy_j == pytest.approx(500.0)  # 500 000 mJ since discovery
    assert samples["gpu2"].energy_j == 0.0

    a100.energy_mj = 1_600_000
    (second,) = [s for s in probe.sample() if s.id == "gpu0"]
    assert second.energy_j == pytest.approx(600.0)


def test_energy_counter_restart_does_not_go_backwards(fake_nvml: FakeNvml) -> None:
    a100 = fake_nvml.gpus[0]
    probe = NvidiaProbe(available_providers=())
    probe.discover()
    a100.energy_mj = 1_200_000
    probe.sample()

    a100.energy_mj = 50_000  # driver reloaded: counter back near zero
    (after_reset,) = [s for s in probe.sample() if s.id == "gpu0"]

    assert after_reset.energy_j == pytest.approx(250.0)


def test_mig_instances_sample_own_memory_and_parent_power(fake_nvml: FakeNvml) -> None:
    mig_gpu = fake_nvml.gpus[1]
    mig_gpu.power_usage_mw = 180_000
    mig_gpu.temperature_c = 50
    mig_gpu.utilization_pct = 35
    probe = NvidiaProbe(available_providers=())
    probe.discover()
    mig_gpu.energy_mj = 1_010_000

    samples = {s.id: s for s in probe.sample()}

    big_slice, small_slice = samples["gpu1-mig0"], samples["gpu1-mig2"]
    assert (big_slice.memory_used_bytes, small_slice.memory_used_bytes) == (5 * GIB, 1 * GIB)
    for instance in (big_slice, small_slice):
        assert instance.power_w == 180.0
        assert instance.temperature_c == 50.0
        assert instance.utilization_pct == 35.0  # NotSupported per instance: parent's
        assert instance.energy_j == pytest.approx(10.0)


def test_unsupported_readings_are_left_out(fake_nvml: FakeNvml) -> None:
    h100 = fake_nvml.gpus[2]
    h100.energy_mj = None
    h100.failing["nvmlDeviceGetPowerUsage"] = pynvml.NVMLError_NotSupported
    h100.failing["nvmlDeviceGetUtilizationRates"] = pynvml.NVMLError_Unknown
    probe = NvidiaProbe(available_providers=())
    probe.discover()

    (sample,) = [s for s in probe.sample() if s.id == "gpu2"]

    assert sample.energy_j is None
    assert sample.power_w is None
    assert sample.utilization_pct == 0.0
    assert sample.temperature_c == 40.0


def test_a_gpu_failing_at_sample_time_leaves_the_others(fake_nvml: FakeNvml) -> None:
    probe = NvidiaProbe(available_providers=())
    probe.discover()
    fake_nvml.gpus[0].failing["nvmlDeviceGetMemoryInfo"] = ValueError

    assert [s.id for s in probe.sample()] == ["gpu1-mig0", "gpu1-mig2", "gpu2"]


@pytest.mark.parametrize(
    "error",
    [
        pynvml.NVMLError_LibraryNotFound,
        pynvml.NVMLError_DriverNotLoaded,
        pynvml.NVMLError_NoPermission,
    ],
)
def test_nvml_unavailable_means_no_gpus(
    fake_nvml: FakeNvml, captured_log: CapturingLogger, error: type[Exception]
) -> None:
    fake_nvml.init_error = error
    probe = NvidiaProbe(available_providers=())

    assert probe.discover() == []
    assert probe.discover() == []  # tried again (a driver may load later) ...
    assert fake_nvml.init_calls == 2
    unavailable = [
        call
        for call in captured_log.calls
        if call.args == ("NVML unavailable; no NVIDIA GPUs reported",)
    ]
    assert [c.method_name for c in unavailable] == ["info"]  # ... but said once
    assert probe.sample() == []
    probe.close()
    assert fake_nvml.shutdown_calls == 0


def test_close_shuts_nvml_down_once(fake_nvml: FakeNvml) -> None:
    probe = NvidiaProbe(available_providers=())
    probe.discover()
    probe.discover()  # already initialised: no second nvmlInit

    probe.close()
    probe.close()

    assert fake_nvml.init_calls == 1
    assert fake_nvml.shutdown_calls == 1
    assert probe.sample() == []


def test_real_nvml_on_this_machine() -> None:
    """Without an NVIDIA driver the real pynvml fails to init and the probe finds nothing."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        driver_present = False
    else:
        pynvml.nvmlShutdown()
        driver_present = True
    probe = NvidiaProbe()
    try:
        accelerators = probe.discover()
        samples = probe.sample()
    finally:
        probe.close()

    if driver_present:
        assert all(a.kind == "gpu" and a.id.startswith("gpu") for a in accelerators)
        assert all(a.pci_bus_id for a in accelerators), accelerators
        assert [s.id for s in samples] == [a.id for a in accelerators]
    else:
        assert accelerators == []
        assert samples == []


def test_a_gpu_lost_at_sample_time_gives_no_reading(fake_nvml: FakeNvml) -> None:
    probe = NvidiaProbe(available_providers=())
    probe.discover()
    fake_nvml.gpus[0].failing["nvmlDeviceGetMemoryInfo"] = pynvml.NVMLError_GpuIsLost

    # No made-up zeros for it: the agent counts the missing reading (device_health.py).
    assert [s.id for s in probe.sample()] == ["gpu1-mig0", "gpu1-mig2", "gpu2"]


def test_a_critical_xid_fails_its_gpu_and_its_mig_instances_but_an_application_xid_does_not(
    fake_nvml: FakeNvml,
) -> None:
    probe = NvidiaProbe(available_providers=())
    probe.discover()
    assert fake_nvml.registered == ["GPU-a100-0", "GPU-a100-1", "GPU-h100-2"]
    gpu0, mig_parent, _ = fake_nvml.gpus
    fake_nvml.pending_events = [(gpu0, 13), (gpu0, 43)]  # the application's own faults
    probe.sample()
    assert probe.device_faults() == {}
    fake_nvml.pending_events = [(mig_parent, 79), (gpu0, 48)]
    assert len(probe.sample()) == 4  # readings still come: the XID alone says it failed
    faults = probe.device_faults()
    assert set(faults) == {"gpu0", "gpu1-mig0", "gpu1-mig2"}
    assert faults["gpu1-mig0"].startswith("XID 79 reported by the driver")
    assert faults["gpu0"].startswith("XID 48")
    probe.sample()  # no new events: an XID fault stays until the GPU is reset
    assert set(probe.device_faults()) == set(faults)

    health = DeviceHealth(probe.discover())  # rediscovery (a restarted agent) starts clean
    assert fake_nvml.event_sets_freed == 1
    samples = {s.id for s in probe.sample()}
    assert not health.observe(samples, probe.device_faults())
    fake_nvml.pending_events = [(gpu0, 94)]
    probe.sample()
    assert health.observe(samples, probe.device_faults())
    assert health.unhealthy == {"gpu0": XID_REASON.format(xid=94)}
    probe.close()
    assert fake_nvml.event_sets_freed == 2


def test_a_driver_without_xid_events_still_discovers_and_samples(fake_nvml: FakeNvml) -> None:
    fake_nvml.gpus[2].failing["nvmlDeviceRegisterEvents"] = pynvml.NVMLError_NotSupported
    probe = NvidiaProbe(available_providers=())
    assert len(probe.discover()) == 4
    assert fake_nvml.registered == ["GPU-a100-0", "GPU-a100-1"]
    assert len(probe.sample()) == 4
