"""Device profiles: physically sensible figures for every simulated machine."""

from __future__ import annotations

import pytest

from shared.accelerators import ACCELERATORS
from sim_devices.profiles import GIB, PROFILES, DeviceProfile, get_profile

TIB = 1024 * GIB


@pytest.mark.parametrize("profile", PROFILES.values(), ids=list(PROFILES))
def test_every_profile_is_filed_under_its_own_name(profile: DeviceProfile) -> None:
    assert PROFILES[profile.name] is profile
    assert get_profile(profile.name) is profile


@pytest.mark.parametrize("profile", PROFILES.values(), ids=list(PROFILES))
def test_idle_power_is_positive_and_below_maximum_power(profile: DeviceProfile) -> None:
    assert 0 < profile.cpu_idle_power_w < profile.cpu_max_power_w
    for accelerator in profile.accelerators:
        assert 0 < accelerator.idle_power_w < accelerator.max_power_w, accelerator.model


@pytest.mark.parametrize("profile", PROFILES.values(), ids=list(PROFILES))
def test_relative_speeds_are_positive(profile: DeviceProfile) -> None:
    assert profile.cpu_relative_speed > 0
    for accelerator in profile.accelerators:
        assert accelerator.relative_speed > 0, accelerator.model


@pytest.mark.parametrize("profile", PROFILES.values(), ids=list(PROFILES))
def test_memory_and_core_counts_are_sane(profile: DeviceProfile) -> None:
    assert 1 * GIB <= profile.memory_bytes <= 4 * TIB
    assert profile.cpu_cores >= 1
    for accelerator in profile.accelerators:
        assert accelerator.count >= 1
        assert accelerator.compute_units >= 1
        assert 0 <= accelerator.memory_bytes <= 256 * GIB
        if accelerator.kind == "gpu":
            # A GPU without memory could not be scheduled anything.
            assert accelerator.memory_bytes >= 1 * GIB, accelerator.model


@pytest.mark.parametrize("profile", PROFILES.values(), ids=list(PROFILES))
def test_typical_utilisation_is_a_fraction_and_the_source_is_cited(
    profile: DeviceProfile,
) -> None:
    assert 0 < profile.typical_utilization < 1
    assert profile.source.strip()
    assert profile.description.strip()


@pytest.mark.parametrize("profile", PROFILES.values(), ids=list(PROFILES))
def test_gpus_advertise_an_onnx_execution_provider(profile: DeviceProfile) -> None:
    for accelerator in profile.accelerators:
        if accelerator.kind == "gpu":
            assert accelerator.onnx_providers, accelerator.model


def test_speeds_are_relative_to_one_a100() -> None:
    a100 = get_profile("a100-4x").accelerators[0]
    assert a100.relative_speed == 1.0
    h100 = get_profile("h100-8x").accelerators[0].relative_speed
    v100 = get_profile("v100-8x").accelerators[0].relative_speed
    t4 = get_profile("t4-inference-server").accelerators[0].relative_speed
    orin_nano = get_profile("jetson-orin-nano").accelerators[0].relative_speed
    assert h100 > a100.relative_speed > v100 > t4 > orin_nano


def test_profiles_cover_gpu_npu_and_cpu_only_machines() -> None:
    kinds = {accelerator.kind for p in PROFILES.values() for accelerator in p.accelerators}
    assert {"gpu", "npu"} <= kinds
    assert any(not profile.accelerators for profile in PROFILES.values())


def test_an_unknown_profile_name_lists_the_known_ones() -> None:
    with pytest.raises(KeyError, match="jetson-orin-nano") as caught:
        get_profile("jetson-nano-9000")
    assert "jetson-nano-9000" in str(caught.value)


def test_simulated_gpus_carry_the_table_figures() -> None:
    gpus = [a for profile in PROFILES.values() for a in profile.accelerators if a.kind == "gpu"]
    assert gpus
    for gpu in gpus:
        facts = ACCELERATORS[gpu.model]
        assert (
            gpu.memory_bytes,
            gpu.compute_units,
            gpu.idle_power_w,
            gpu.max_power_w,
            gpu.relative_speed,
        ) == (
            facts.memory_bytes,
            facts.compute_units,
            facts.idle_power_w,
            facts.max_power_w,
            facts.relative_speed,
        ), gpu.model
