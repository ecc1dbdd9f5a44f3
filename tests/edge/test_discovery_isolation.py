"""discover_all / sample_all isolate failing probes; build_device_probes builds real ones."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from edge.discovery import (
    DiscoveryResult,
    build_device_probes,
    device_faults,
    discover_all,
    sample_all,
)
from edge.discovery.cpu import CpuProbe, LocalHostProbe
from edge.discovery.npu import NpuProbe
from edge.discovery.nvidia import NvidiaProbe
from edge.probes import AcceleratorProbe, DeviceProbes, HostSample
from shared.messages import Accelerator, AcceleratorSample, HostInfo


class FakeHost:
    def host_info(self) -> HostInfo:
        return HostInfo(
            hostname="edge-1",
            os="Linux",
            arch="aarch64",
            cpu_logical_cores=4,
            memory_total_bytes=8 * 1024**3,
        )

    def sample(self) -> HostSample:
        return HostSample(
            cpu_utilization_pct=12.5, memory_used_bytes=1024, memory_total_bytes=8 * 1024**3
        )


class FakeProbe:
    """A probe with one device that can be told to fail in discover() or sample()."""

    def __init__(
        self, name: str, *, fail_discover: bool = False, fail_sample: bool = False
    ) -> None:
        self._name = name
        self.fail_discover = fail_discover
        self.fail_sample = fail_sample
        self.discover_calls = 0
        self.sample_calls = 0

    @property
    def name(self) -> str:
        return self._name

    def discover(self) -> Sequence[Accelerator]:
        self.discover_calls += 1
        if self.fail_discover:
            raise RuntimeError(f"{self._name} driver exploded")
        return [
            Accelerator(
                id=f"{self._name}0",
                kind="npu",
                vendor="test",
                model="fake",
                memory_bytes=0,
                compute_units=1,
            )
        ]

    def sample(self) -> Sequence[AcceleratorSample]:
        self.sample_calls += 1
        if self.fail_sample:
            raise OSError("device node vanished")
        return [AcceleratorSample(id=f"{self._name}0", utilization_pct=50.0, memory_used_bytes=0)]

    def close(self) -> None:
        pass


def _probes(*accelerator_probes: AcceleratorProbe) -> DeviceProbes:
    return DeviceProbes(host=FakeHost(), accelerator_probes=accelerator_probes)


def test_failing_discovery_does_not_stop_the_other_probes() -> None:
    broken = FakeProbe("broken", fail_discover=True)
    first, last = FakeProbe("first"), FakeProbe("last")

    result = discover_all(_probes(first, broken, last))

    assert result == DiscoveryResult(
        host=FakeHost().host_info(),
        accelerators=tuple(first.discover()) + tuple(last.discover()),
        failed_probes=(("broken", "RuntimeError: broken driver exploded"),),
    )
    assert broken.discover_calls == 1


def test_every_probe_failing_still_gives_a_result() -> None:
    result = discover_all(
        _probes(FakeProbe("a", fail_discover=True), FakeProbe("b", fail_discover=True))
    )

    assert result.accelerators == ()
    assert [name for name, _ in result.failed_probes] == ["a", "b"]
    assert result.host.hostname == "edge-1"


def test_failing_sample_does_not_stop_the_other_probes() -> None:
    flaky = FakeProbe("flaky", fail_sample=True)
    steady = FakeProbe("steady")
    probes = _probes(flaky, steady)

    host, samples, failures = sample_all(probes, {"flaky", "steady"})

    assert host == FakeHost().sample()
    assert [s.id for s in samples] == ["steady0"]
    assert failures == (("flaky", "OSError: device node vanished"),)

    flaky.fail_sample = False  # recovered: it contributes again next round
    _, samples, failures = sample_all(probes, {"flaky", "steady"})
    assert [s.id for s in samples] == ["flaky0", "steady0"]
    assert failures == ()


def test_sample_skips_probes_that_failed_discovery() -> None:
    failed_at_discovery = FakeProbe("gone")
    working = FakeProbe("working")

    _, samples, failures = sample_all(_probes(failed_at_discovery, working), frozenset({"working"}))

    assert [s.id for s in samples] == ["working0"]
    assert failures == ()
    assert failed_at_discovery.sample_calls == 0


def test_build_device_probes_for_enabled_names() -> None:
    probes = build_device_probes(["cpu", "nvidia", "npu"])

    assert isinstance(probes.host, LocalHostProbe)
    assert [type(p) for p in probes.accelerator_probes] == [CpuProbe, NvidiaProbe, NpuProbe]
    assert [p.name for p in probes.accelerator_probes] == ["cpu", "nvidia", "npu"]


def test_build_device_probes_keeps_order_and_drops_repeats() -> None:
    probes = build_device_probes(["npu", "cpu", "npu"])

    assert [p.name for p in probes.accelerator_probes] == ["npu", "cpu"]


def test_host_probe_is_always_present() -> None:
    probes = build_device_probes([])

    assert probes.accelerator_probes == ()
    assert isinstance(probes.host, LocalHostProbe)


def test_unknown_probe_name_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match="'tpu'") as raised:
        build_device_probes(["cpu", "tpu"])
    assert "cpu, nvidia, npu" in str(raised.value)


def test_real_probes_on_this_machine() -> None:
    probes = build_device_probes(["cpu", "nvidia", "npu"])
    try:
        result = discover_all(probes)
        working = {p.name for p in probes.accelerator_probes} - {
            name for name, _ in result.failed_probes
        }
        host, samples, failures = sample_all(probes, working)
    finally:
        for probe in probes.accelerator_probes:
            probe.close()

    assert result.failed_probes == ()
    ids = [a.id for a in result.accelerators]
    assert "cpu0" in ids
    assert len(ids) == len(set(ids))
    assert {s.id for s in samples} == set(ids)
    assert failures == ()
    assert host.memory_total_bytes == result.host.memory_total_bytes


class FaultingProbe(FakeProbe):
    """A probe that can tell which of its devices failed (as NVIDIA's XID events do)."""

    def __init__(self, name: str, faults: dict[str, str] | None = None) -> None:
        super().__init__(name)
        self.faults = faults

    def device_faults(self) -> dict[str, str]:
        if self.faults is None:
            raise RuntimeError("event set gone")
        return self.faults


def test_device_faults_come_from_working_probes_that_can_tell_and_a_failing_one_is_isolated() -> (
    None
):
    probes = _probes(
        FaultingProbe("xid", {"xid0": "XID 79"}),
        FaultingProbe("broken"),
        FaultingProbe("not-working", {"nw0": "XID 48"}),
        FakeProbe("plain"),
    )
    assert device_faults(probes, {"xid", "broken", "plain"}) == {"xid0": "XID 79"}
