"""A cluster's accelerator type names (Slurm GRES types: `a100`, `h100`, `t4`) as
greenfed's accelerator models (shared/accelerators.py), whose speed and power the
scheduler and the energy model know.

A registration may map its own names (`gres_models`: `{"a100_80g": "NVIDIA
A100-SXM4-80GB"}`); otherwise the common names below apply. A type that maps to no
model is never guessed: its devices are counted and shown with the cluster
(`unknown_accelerator_types`), and greenfed places nothing on them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from shared.accelerators import ACCELERATORS, AcceleratorFacts

COMMON_TYPES: Final[Mapping[str, str]] = {
    "a100": "NVIDIA A100-SXM4-80GB",
    "a100-80gb": "NVIDIA A100-SXM4-80GB",
    "a100_80gb": "NVIDIA A100-SXM4-80GB",
    "a100-40gb": "NVIDIA A100-SXM4-40GB",
    "a100_40gb": "NVIDIA A100-SXM4-40GB",
    "h100": "NVIDIA H100 80GB HBM3",
    "h100-pcie": "NVIDIA H100 PCIe",
    "h200": "NVIDIA H200",
    "v100": "Tesla V100-SXM2-32GB",
    "t4": "Tesla T4",
    "l4": "NVIDIA L4",
    "a10": "NVIDIA A10",
    "a10g": "NVIDIA A10G",
}


def accelerator_facts(type_name: str, mapping: Mapping[str, str]) -> AcceleratorFacts | None:
    """The model of a cluster's type name: the registration's mapping first, then the
    common names (case-insensitive); None: unknown."""
    model = mapping.get(type_name) or COMMON_TYPES.get(type_name.lower())
    return None if model is None else ACCELERATORS.get(model)


def unknown_models(mapping: Mapping[str, str]) -> list[str]:
    """Models a registration maps to that greenfed does not know (a typo, say)."""
    return sorted({model for model in mapping.values() if model not in ACCELERATORS})
