"""Simulated probes: the hardware seam of simulated nodes, checked against hand computations."""

from __future__ import annotations

import random

import pytest

from edge.discovery import discover_all, sample_all
from edge.probes import DeviceProbes
from shared.messages import TELEMETRY_DECODER, AcceleratorSample, Telemetry, encode
from sim_devices.probes import SimulatedNode
from sim_devices.profiles import PROFILES, DeviceProfile, get_profile

# Samples round power to 1 mW and utilisation to 0.01 %.
POWER_ROUNDING_W = 0.0005
UTILIZATION_ROUNDING = 0.00005


class FakeMonotonic:
    def __init__(self) -> None:
        self.now_s = 10_000.0

    def __call__(self) -> float:
        return self.now_s


def simulated(
    profile: str | DeviceProfile = "h100-8x", seed: int = 1
) -> tuple[SimulatedNode, DeviceProbes, FakeMonotonic]:
    clock = FakeMonotonic()
    device_profile = get_profile(profile) if isinstance(profile, str) else profile
    node = SimulatedNode("sim-1", device_profile, random.Random(seed), monotonic=clock)
    return node, node.probes(), clock


def one_round(probes: DeviceProbes) -> list[AcceleratorSample]:
    """What the agent does once per telemetry interval."""
    (probe,) = probes.accelerator_probes
    return list(probe.sample())


def test_power_is_idle_plus_utilisation_times_the_dynamic_range_within_idle_and_max() -> None:
    for profile in PROFILES.values():
        node, probes, clock = simulated(profile, seed=3)
        by_id = {accelerator.id: accelerator for accelerator in node.accelerators}
        for _ in range(200):
            clock.now_s += 1.0
            for sample in one_round(probes):
                device = by_id[sample.id]
                assert device.idle_power_w is not None
                assert device.max_power_w is not None
                assert sample.power_w is not None
                dynamic_w = device.max_power_w - device.idle_power_w
                expected_w = device.idle_power_w + sample.utilization_pct / 100 * dynamic_w
                tolerance_w = POWER_ROUNDING_W + dynamic_w * UTILIZATION_ROUNDING + 1e-9
                assert sample.power_w == pytest.approx(expected_w, abs=tolerance_w)
                low, high = device.idle_power_w, device.max_power_w
                assert low - POWER_ROUNDING_W <= sample.power_w <= high + POWER_ROUNDING_W


def test_energy_is_the_trapezoidal_integral_of_power_over_the_clock() -> None:
    _, probes, clock = simulated("t4-inference-server", seed=5)
    steps_s = [0.0, 1.0, 2.0, 0.5, 4.0, 0.25]

    rounds = []
    for step_s in steps_s:
        clock.now_s += step_s
        rounds.append({sample.id: sample for sample in one_round(probes)})

    for device_id in rounds[0]:
        powers = [samples[device_id].power_w for samples in rounds]
        energies = [samples[device_id].energy_j for samples in rounds]
        assert energies[0] == 0.0  # no time has passed at the first sample
        expected_j = 0.0
        for index in range(1, len(rounds)):
            previous_w, current_w = powers[index - 1], powers[index]
            assert previous_w is not None
            assert current_w is not None
            expected_j += (previous_w + current_w) / 2 * steps_s[index]
            assert energies[index] == pytest.approx(expected_j, abs=0.01), (device_id, index)


def test_energy_never_decreases_and_grows_at_least_at_idle_power() -> None:
    node, probes, clock = simulated("a100-4x", seed=9)
    idle_w = {accelerator.id: accelerator.idle_power_w or 0.0 for accelerator in node.accelerators}
    one_round(probes)
    previous = {sample.id: sample.energy_j or 0.0 for sample in one_round(probes)}
    for _ in range(50):
        clock.now_s += 2.0
        for sample in one_round(probes):
            assert sample.energy_j is not None
            gained_j = sample.energy_j - previous[sample.id]
            assert gained_j >= idle_w[sample.id] * 2.0 - 0.001
            previous[sample.id] = sample.energy_j


def test_no_energy_accrues_while_the_clock_stands_still() -> None:
    _, probes, clock = simulated("v100-8x")
    clock.now_s += 5.0
    before = one_round(probes)
    again = one_round(probes)
    assert [sample.energy_j for sample in again] == [sample.energy_j for sample in before]


@pytest.mark.parametrize("profile", PROFILES.values(), ids=list(PROFILES))
def test_utilisation_and_memory_stay_within_their_ranges(profile: DeviceProfile) -> None:
    node, probes, clock = simulated(profile, seed=17)
    memory_bytes = {accelerator.id: accelerator.memory_bytes for accelerator in node.accelerators}
    for _ in range(300):
        clock.now_s += 0.5
        for sample in one_round(probes):
            assert 0.0 <= sample.utilization_pct <= 100.0
            assert 0 <= sample.memory_used_bytes <= memory_bytes[sample.id]
        host = probes.host.sample()
        assert 0.0 <= host.cpu_utilization_pct <= 100.0
        assert 0 <= host.memory_used_bytes <= host.memory_total_bytes == profile.memory_bytes


def test_utilisation_wanders_rather_than_standing_still() -> None:
    _, probes, clock = simulated("h100-8x", seed=2)
    seen = set()
    for _ in range(30):
        clock.now_s += 1.0
        seen.add(one_round(probes)[1].utilization_pct)
    assert len(seen) > 20


def test_two_nodes_built_with_the_same_seed_produce_identical_samples() -> None:
    first, first_probes, first_clock = simulated("jetson-agx-orin", seed=42)
    second, second_probes, second_clock = simulated("jetson-agx-orin", seed=42)
    assert first.accelerators == second.accelerators  # the same device UUIDs too

    for step_s in [0.0, 1.0, 0.5, 3.0] * 10:
        first_clock.now_s += step_s
        second_clock.now_s += step_s
        assert one_round(first_probes) == one_round(second_probes)
        assert first_probes.host.sample() == second_probes.host.sample()


def test_nodes_with_different_seeds_differ() -> None:
    first, first_probes, _ = simulated("jetson-agx-orin", seed=1)
    second, second_probes, _ = simulated("jetson-agx-orin", seed=2)
    assert first.accelerators != second.accelerators
    assert one_round(first_probes) != one_round(second_probes)


def test_discovery_reports_the_host_cpu_and_every_accelerator_of_the_profile() -> None:
    profile = get_profile("h100-8x")
    _, probes, _ = simulated(profile)

    result = discover_all(probes)

    assert result.failed_probes == ()
    assert result.host.hostname == "sim-1"
    assert result.host.cpu_logical_cores == profile.cpu_cores
    assert result.host.memory_total_bytes == profile.memory_bytes
    kinds = [accelerator.kind for accelerator in result.accelerators]
    assert kinds == ["cpu"] + ["gpu"] * 8
    ids = [accelerator.id for accelerator in result.accelerators]
    assert len(set(ids)) == len(ids)
    gpu = result.accelerators[1]
    assert (gpu.idle_power_w, gpu.max_power_w, gpu.relative_speed) == (70.0, 700.0, 2.5)
    assert gpu.uuid is not None
    assert gpu.uuid.startswith("GPU-")
    assert len({accelerator.uuid for accelerator in result.accelerators[1:]}) == 8


def test_simulated_gpu_cards_have_pci_addresses_and_a_jetson_has_none() -> None:
    server = discover_all(simulated("h100-8x")[1]).accelerators
    assert [a.pci_bus_id for a in server if a.kind == "gpu"] == [
        f"00000000:{bus:02X}:00.0" for bus in range(0x18, 0x20)
    ]
    assert [a.pci_bus_id for a in server if a.kind == "cpu"] == [""]
    jetson = discover_all(simulated("jetson-orin-nano")[1]).accelerators
    assert [(a.kind, a.pci_bus_id) for a in jetson] == [("cpu", ""), ("gpu", "")]


def test_an_npu_gateway_discovers_its_npu() -> None:
    _, probes, _ = simulated("intel-core-ultra-npu-gateway")
    kinds = [accelerator.kind for accelerator in discover_all(probes).accelerators]
    assert kinds == ["cpu", "npu"]


def test_sample_all_returns_a_reading_for_every_discovered_device() -> None:
    node, probes, clock = simulated("a100-4x")
    discovered = discover_all(probes)
    working = {"simulated"}

    clock.now_s += 5.0
    host, samples, failures = sample_all(probes, working)

    assert failures == ()
    assert [sample.id for sample in samples] == [a.id for a in discovered.accelerators]
    assert host.memory_total_bytes == node.profile.memory_bytes


def test_sample_all_skips_the_simulated_probe_when_its_discovery_did_not_succeed() -> None:
    _, probes, _ = simulated("a100-4x")
    _, samples, failures = sample_all(probes, set())
    assert (samples, failures) == ((), ())


def test_simulated_readings_make_telemetry_that_the_wire_contract_accepts() -> None:
    node, probes, clock = simulated("coral-edge-tpu-gateway", seed=8)
    discover_all(probes)
    for seq in range(20):
        clock.now_s += 1.0
        host, samples, _ = sample_all(probes, {"simulated"})
        telemetry = Telemetry(
            node_id=node.node_id,
            instance_id="i1",
            seq=seq,
            sampled_at=1_700_000_000.0 + seq,
            interval_s=1.0,
            cpu_utilization_pct=host.cpu_utilization_pct,
            memory_used_bytes=host.memory_used_bytes,
            memory_total_bytes=host.memory_total_bytes,
            accelerators=samples,
        )
        assert TELEMETRY_DECODER.decode(encode(telemetry)) == telemetry


def test_only_gpus_report_a_temperature() -> None:
    node, probes, _ = simulated("intel-core-ultra-npu-gateway")
    kinds = {accelerator.id: accelerator.kind for accelerator in node.accelerators}
    for sample in one_round(probes):
        assert (sample.temperature_c is not None) == (kinds[sample.id] == "gpu")

    gpu_node, gpu_probes, _ = simulated("t4-inference-server")
    gpu_kinds: dict[str, str] = {a.id: a.kind for a in gpu_node.accelerators}
    gpu_samples = [s for s in one_round(gpu_probes) if gpu_kinds[s.id] == "gpu"]
    assert gpu_samples
    assert all(sample.temperature_c is not None for sample in gpu_samples)


def test_discover_returns_the_same_devices_every_time() -> None:
    node, probes, clock = simulated("v100-8x")
    (probe,) = probes.accelerator_probes
    first = tuple(probe.discover())
    clock.now_s += 10.0
    one_round(probes)
    assert tuple(probe.discover()) == first == node.accelerators
    probe.close()
