"""The accelerator table: NVML device names find the right model; figures are sane."""

from __future__ import annotations

import pytest

from shared.accelerators import ACCELERATORS, AcceleratorFacts, nvidia_gpu_facts


@pytest.mark.parametrize(
    ("nvml_name", "filed_under"),
    [
        ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe"),
        ("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"),
        ("NVIDIA H100 NVL", "NVIDIA H100 80GB HBM3"),
        ("NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB"),
        ("NVIDIA A100 80GB PCIe", "NVIDIA A100-SXM4-80GB"),
        ("NVIDIA A100-PCIE-40GB", "NVIDIA A100-SXM4-40GB"),
        ("Tesla V100S-PCIE-32GB", "Tesla V100-SXM2-32GB"),
        ("NVIDIA A10G", "NVIDIA A10G"),
        ("NVIDIA A10", "NVIDIA A10"),
        ("NVIDIA GeForce RTX 4090", "NVIDIA RTX"),
    ],
)
def test_an_nvml_name_finds_its_model(nvml_name: str, filed_under: str) -> None:
    assert nvidia_gpu_facts(nvml_name) is ACCELERATORS[filed_under]


def test_an_unknown_gpu_has_no_facts() -> None:
    assert nvidia_gpu_facts("Quadro P1000") is None


@pytest.mark.parametrize(
    "facts",
    [facts for facts in ACCELERATORS.values() if facts.nvml_name_pattern is not None],
    ids=lambda facts: facts.name,
)
def test_every_matchable_model_is_found_by_its_own_name(facts: AcceleratorFacts) -> None:
    assert nvidia_gpu_facts(facts.name) is facts


@pytest.mark.parametrize("facts", ACCELERATORS.values(), ids=lambda facts: facts.name)
def test_known_figures_are_physically_sensible(facts: AcceleratorFacts) -> None:
    assert ACCELERATORS[facts.name] is facts
    if facts.idle_power_w is not None and facts.max_power_w is not None:
        assert 0 < facts.idle_power_w < facts.max_power_w
    assert facts.relative_speed is None or facts.relative_speed > 0
    assert facts.compute_units is None or facts.compute_units >= 1


def test_the_a100_variants_differ_only_in_memory() -> None:
    small, large = ACCELERATORS["NVIDIA A100-SXM4-40GB"], ACCELERATORS["NVIDIA A100-SXM4-80GB"]
    assert small.relative_speed == large.relative_speed == 1.0
    assert (small.compute_units, small.idle_power_w, small.max_power_w) == (
        large.compute_units,
        large.idle_power_w,
        large.max_power_w,
    )
    assert large.memory_bytes == 2 * (small.memory_bytes or 0)
