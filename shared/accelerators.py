"""Accelerator facts, one entry per model: what a device does not say about itself.

Discovery (edge/discovery), the simulated device profiles (sim_devices/profiles.py)
and the scheduler benchmark (cloud/eval/scheduler_bench.py) all read this table,
so a model's speed or power is written once. Discovery takes what the hardware
reports (NVML's power limit and memory, its SM count where it has one) and the
rest from here; the simulated profiles and the benchmark take these as they are.
None: not known here.

An entry is looked up by the model name it is filed under (`ACCELERATORS[name]`),
the name the device reports where it reports one; NVIDIA GPUs also by matching
the NVML device name (`nvidia_gpu_facts`).

relative_speed is throughput relative to one NVIDIA A100 (1.0): a planning figure
that orders devices for the scheduler until measured latency is known, not a
benchmark.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from itertools import pairwise
from types import MappingProxyType
from typing import TypeVar

from shared.messages import AcceleratorKind

_T = TypeVar("_T")

_GIB = 1024**3
_MIB = 1024**2


@dataclass(frozen=True, slots=True, kw_only=True)
class AcceleratorFacts:
    name: str
    kind: AcceleratorKind
    vendor: str
    # SMs for NVIDIA GPUs; engines, tiles or cores for NPUs.
    compute_units: int | None = None
    memory_bytes: int | None = None
    idle_power_w: float | None = None
    max_power_w: float | None = None
    relative_speed: float | None = None
    # The lowest power limit the driver accepts (NVML's power management limit
    # constraints, `nvidia-smi -q -d POWER` "Min Power Limit"); None: not known, and
    # greenfed caps no lower than MIN_POWER_LIMIT_SHARE of max_power_w.
    min_power_limit_w: float | None = None
    # Matched against NVML device names by nvidia_gpu_facts; None: never matched.
    nvml_name_pattern: re.Pattern[str] | None = None


# NVIDIA GPUs. compute_units: SM counts from NVIDIA architecture whitepapers
# (nvmlDeviceGetAttributes reports SMs for MIG instances only on most drivers).
# idle_power_w: typical draw of an idle GPU with the driver in persistence mode,
# as nvidia-smi shows it; approximate (±30 %), varies with board, clocks and
# memory, and is only the energy model's prior: measured power replaces it.
# memory_bytes and max_power_w (board power): the data sheet named per entry;
# discovery reads both from NVML instead.
# relative_speed: rough throughput on mixed training/inference work relative to
# one A100 (MLPerf-style end-to-end ratios, not peak FLOPS); None when unknown.
# nvml_name_pattern: the first match in table order wins, so specific patterns
# come first.

# NVIDIA A100 data sheet: 40 GB HBM2, 400 W SXM4, 108 SMs.
_A100_SXM4_40GB = AcceleratorFacts(
    name="NVIDIA A100-SXM4-40GB",
    kind="gpu",
    vendor="nvidia",
    compute_units=108,
    memory_bytes=40 * _GIB,
    idle_power_w=50.0,
    max_power_w=400.0,
    min_power_limit_w=100.0,
    relative_speed=1.0,
    nvml_name_pattern=re.compile(r"\bA100\b"),
)

_NVIDIA_GPUS = (
    AcceleratorFacts(
        name="NVIDIA H200",
        kind="gpu",
        vendor="nvidia",
        compute_units=132,
        relative_speed=2.5,
        nvml_name_pattern=re.compile(r"\bH200\b"),
    ),
    AcceleratorFacts(
        name="NVIDIA H100 PCIe",
        kind="gpu",
        vendor="nvidia",
        compute_units=114,
        idle_power_w=70.0,
        relative_speed=2.0,
        nvml_name_pattern=re.compile(r"\bH100\b.*\bPCIe\b"),
    ),
    # NVIDIA H100 SXM5 data sheet: 80 GB HBM3, up to 700 W, 132 SMs.
    AcceleratorFacts(
        name="NVIDIA H100 80GB HBM3",
        kind="gpu",
        vendor="nvidia",
        compute_units=132,
        memory_bytes=80 * _GIB,
        idle_power_w=70.0,
        max_power_w=700.0,
        min_power_limit_w=200.0,
        relative_speed=2.5,
        nvml_name_pattern=re.compile(r"\bH100\b"),
    ),
    # The same GPU with twice the memory. NVIDIA A100 data sheet: 80 GB HBM2e,
    # 400 W SXM4, 108 SMs.
    replace(
        _A100_SXM4_40GB,
        name="NVIDIA A100-SXM4-80GB",
        memory_bytes=80 * _GIB,
        nvml_name_pattern=re.compile(r"\bA100\b.*\b80GB\b"),
    ),
    _A100_SXM4_40GB,
    # NVIDIA V100 data sheet: 32 GB HBM2, 300 W SXM2, 80 SMs. Speed 0.45: published
    # end-to-end comparisons put mixed-precision training on an A100 at about
    # 2-2.5 times a V100's throughput.
    AcceleratorFacts(
        name="Tesla V100-SXM2-32GB",
        kind="gpu",
        vendor="nvidia",
        compute_units=80,
        memory_bytes=32 * _GIB,
        idle_power_w=40.0,
        max_power_w=300.0,
        min_power_limit_w=150.0,
        relative_speed=0.45,
        nvml_name_pattern=re.compile(r"\bV100"),
    ),
    AcceleratorFacts(
        name="NVIDIA L4",
        kind="gpu",
        vendor="nvidia",
        compute_units=58,
        idle_power_w=16.0,
        relative_speed=0.35,
        nvml_name_pattern=re.compile(r"\bL4\b"),
    ),
    # NVIDIA T4 data sheet: 16 GB GDDR6, 70 W, 40 SMs.
    AcceleratorFacts(
        name="Tesla T4",
        kind="gpu",
        vendor="nvidia",
        compute_units=40,
        memory_bytes=16 * _GIB,
        idle_power_w=10.0,
        max_power_w=70.0,
        min_power_limit_w=60.0,
        relative_speed=0.2,
        nvml_name_pattern=re.compile(r"\bT4\b"),
    ),
    AcceleratorFacts(
        name="NVIDIA A10G",
        kind="gpu",
        vendor="nvidia",
        compute_units=80,
        idle_power_w=20.0,
        relative_speed=0.45,
        nvml_name_pattern=re.compile(r"\bA10G\b"),
    ),
    AcceleratorFacts(
        name="NVIDIA A10",
        kind="gpu",
        vendor="nvidia",
        compute_units=72,
        idle_power_w=20.0,
        relative_speed=0.45,
        nvml_name_pattern=re.compile(r"\bA10\b"),
    ),
    # Any GeForce or workstation RTX board: too varied for more than an idle prior.
    AcceleratorFacts(
        name="NVIDIA RTX",
        kind="gpu",
        vendor="nvidia",
        idle_power_w=20.0,
        nvml_name_pattern=re.compile(r"\bRTX\b"),
    ),
)

# Jetson modules, as the simulated profiles name them. No NVML pattern: discovery
# has never matched Jetsons, and giving them one would change what it reports.
_JETSONS = (
    # NVIDIA Jetson Orin Nano data sheet: 8 GB LPDDR5 shared, 7-15 W modes, 40 TOPS.
    AcceleratorFacts(
        name="Jetson Orin Nano (Ampere, 1024 cores)",
        kind="gpu",
        vendor="nvidia",
        compute_units=8,
        memory_bytes=8 * _GIB,
        idle_power_w=2.0,
        max_power_w=15.0,
        relative_speed=0.03,
    ),
    # NVIDIA Jetson AGX Orin data sheet: 64 GB shared, 15-60 W modes, 275 TOPS.
    AcceleratorFacts(
        name="Jetson AGX Orin (Ampere, 2048 cores)",
        kind="gpu",
        vendor="nvidia",
        compute_units=16,
        memory_bytes=64 * _GIB,
        idle_power_w=5.0,
        max_power_w=60.0,
        relative_speed=0.15,
    ),
)

# NPUs: relative_speed is peak INT8 TOPS divided by an A100's 624 dense INT8 TOPS,
# a crude, optimistic prior (NPUs rarely reach peak on real models).
_A100_INT8_TOPS = 624.0


def _tops(int8_tops: float) -> float:
    return int8_tops / _A100_INT8_TOPS


# TOPS and engine/tile counts from the vendors' product pages. The power of these
# NPUs is part of the SoC package and not published apart.
_SOC_NPUS = (
    AcceleratorFacts(
        name="Intel Meteor Lake NPU",
        kind="npu",
        vendor="intel",
        compute_units=2,
        # An estimate, not a published figure: the NPU's share of the Core Ultra's
        # 28 W package, about 0.3 W idle and 5 W flat out.
        idle_power_w=0.3,
        max_power_w=5.0,
        relative_speed=_tops(11),
    ),
    AcceleratorFacts(
        name="Intel Arrow Lake NPU",
        kind="npu",
        vendor="intel",
        compute_units=2,
        relative_speed=_tops(13),
    ),
    AcceleratorFacts(
        name="Intel Lunar Lake NPU",
        kind="npu",
        vendor="intel",
        compute_units=6,
        relative_speed=_tops(48),
    ),
    AcceleratorFacts(
        name="AMD XDNA NPU (Phoenix)",
        kind="npu",
        vendor="amd",
        compute_units=20,
        relative_speed=_tops(10),
    ),
    AcceleratorFacts(
        name="AMD XDNA 2 NPU (Strix)",
        kind="npu",
        vendor="amd",
        compute_units=32,
        relative_speed=_tops(50),
    ),
)

# Coral: 4 TOPS at ~2 W, ~0.5 W idle, 8 MiB of on-chip memory (Coral datasheet).
# Hailo-8: 26 TOPS at ~2.5 W typical (Hailo datasheet). Qualcomm Cloud AI,
# Rockchip and Ascend NPUs come in SoCs/cards of very different sizes: no numbers.
_OTHER_NPUS = (
    AcceleratorFacts(
        name="Coral Edge TPU",
        kind="npu",
        vendor="google",
        compute_units=1,
        memory_bytes=8 * _MIB,
        idle_power_w=0.5,
        max_power_w=2.0,
        relative_speed=_tops(4),
    ),
    AcceleratorFacts(
        name="Hailo-8", kind="npu", vendor="hailo", max_power_w=2.5, relative_speed=_tops(26)
    ),
    AcceleratorFacts(name="Qualcomm Cloud AI 100", kind="npu", vendor="qualcomm"),
    AcceleratorFacts(name="Qualcomm Cloud AI", kind="npu", vendor="qualcomm"),
    AcceleratorFacts(name="Rockchip NPU", kind="npu", vendor="rockchip"),
    AcceleratorFacts(name="Huawei Ascend NPU", kind="npu", vendor="huawei"),
)


# Power capping: training throughput of a data-center GPU held to a share of its
# default power limit, relative to the default (1.0), as (limit share, throughput)
# points, linear between them. The shape of the published power-limit sweeps of
# DNN training: Zeus (You, Chung, Chowdhury, NSDI '23) on V100 and A100, where
# energy per epoch falls as the limit drops until the slowdown outweighs the lower
# draw; McDonald et al., "Great Power, Great Responsibility" (2022): a V100 capped
# at 60 % of its 250 W trains BERT for about 15 % less energy at a few percent more
# time; Zhao et al., "Sustainable Supercomputing for AI" (2024): a 60 % cap across
# a research centre cut energy at small job slowdowns. One curve for every GPU: a
# prior, as relative_speed is; measured power (telemetry) replaces the energy side.
POWER_CAP_THROUGHPUT: tuple[tuple[float, float], ...] = (
    (0.4, 0.66),
    (0.5, 0.80),
    (0.6, 0.90),
    (0.7, 0.95),
    (0.8, 0.98),
    (1.0, 1.0),
)
# The lowest share greenfed asks for where a model's driver minimum is not known.
MIN_POWER_LIMIT_SHARE = 0.5


def capped_throughput(limit_share: float) -> float:
    """Training throughput at ``limit_share`` of the default power limit (0..1], from
    POWER_CAP_THROUGHPUT; 1.0 at or above the default."""
    if limit_share >= 1.0:
        return 1.0
    points = POWER_CAP_THROUGHPUT
    if limit_share <= points[0][0]:
        return points[0][1] * limit_share / points[0][0]
    for (low_share, low), (high_share, high) in pairwise(points):
        if limit_share <= high_share:
            return low + (high - low) * (limit_share - low_share) / (high_share - low_share)
    return 1.0


def capped_speed(speed: float, power_limit_w: float | None, max_power_w: float) -> float:
    """The relative speed of a device of ``speed`` held to ``power_limit_w`` (None: its
    default limit, or no power figure to compare with: ``speed``)."""
    if power_limit_w is None or not max_power_w > 0:
        return speed
    return speed * capped_throughput(power_limit_w / max_power_w)


def lowest_power_share(model: str) -> float:
    """The lowest share of its default limit a device of ``model`` (its table name or
    its NVML name) may be capped at."""
    facts = ACCELERATORS.get(model) or nvidia_gpu_facts(model)
    if facts is None or facts.min_power_limit_w is None or not facts.max_power_w:
        return MIN_POWER_LIMIT_SHARE
    return min(1.0, facts.min_power_limit_w / facts.max_power_w)


def _by_name(entries: Iterable[AcceleratorFacts]) -> Mapping[str, AcceleratorFacts]:
    table: dict[str, AcceleratorFacts] = {}
    for entry in entries:
        if entry.name in table:
            raise ValueError(f"accelerator {entry.name!r} is in the table twice")
        table[entry.name] = entry
    return MappingProxyType(table)


ACCELERATORS: Mapping[str, AcceleratorFacts] = _by_name(
    (*_NVIDIA_GPUS, *_JETSONS, *_SOC_NPUS, *_OTHER_NPUS)
)


def nvidia_gpu_facts(nvml_name: str) -> AcceleratorFacts | None:
    """The entry whose pattern first matches an NVML device name, or None."""
    for entry in ACCELERATORS.values():
        if entry.nvml_name_pattern is not None and entry.nvml_name_pattern.search(nvml_name):
            return entry
    return None


def required(value: _T | None, facts: AcceleratorFacts, figure: str) -> _T:
    """One of `facts`' figures, for a user that cannot do without it."""
    if value is None:
        raise ValueError(f"shared.accelerators has no {figure} for {facts.name!r}")
    return value
