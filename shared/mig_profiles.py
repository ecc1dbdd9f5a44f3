"""MIG profiles: how a slice of an NVIDIA GPU is named, defined once for discovery's
names, the simulated fleet, the spec's ``mig_profile`` and the scheduler's filter.

NVML names a MIG instance after its GPU and its profile, "NVIDIA A100-SXM4-80GB MIG
1g.10gb": ``<g>g.<memory>gb``, g being the instance's share of the GPU's compute in
sevenths (1, 2, 3, 4 or 7) and the memory its own in GB.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

# A profile as a spec names it ("1g.10gb", "3g.40gb").
MIG_PROFILE_PATTERN: Final = r"^[1-7]g\.[1-9][0-9]{0,2}gb$"
_PROFILE: Final = re.compile(MIG_PROFILE_PATTERN)
_IN_MODEL: Final = re.compile(r"\bMIG ([1-7]g\.[1-9][0-9]{0,2}gb)$")
# A MIG-capable GPU is divided into this many compute slices.
COMPUTE_SLICES: Final = 7
_GB: Final = 1000**3


# A tenant's quotas are per accelerator kind, or per MIG profile: "mig-1g.10gb" counts
# that profile's slices (cloud/scheduler/mig_quota.py).
MIG_QUOTA_PREFIX: Final = "mig-"
QUOTA_RESOURCE_PATTERN: Final = r"^(gpu|npu|cpu|mig-[1-7]g\.[1-9][0-9]{0,2}gb)$(?!\n)"
_QUOTA_RESOURCE: Final = re.compile(QUOTA_RESOURCE_PATTERN)


def is_quota_resource(text: str) -> bool:
    """gpu, npu, cpu, or a MIG slice quota such as mig-1g.10gb."""
    return _QUOTA_RESOURCE.search(text) is not None


def slice_quotas(quotas: Iterable[tuple[str, int]]) -> dict[str, int]:
    """The MIG profile quotas among a tenant's quotas (their items), by profile
    ("1g.10gb": 7)."""
    return {
        key.removeprefix(MIG_QUOTA_PREFIX): count
        for key, count in quotas
        if key.startswith(MIG_QUOTA_PREFIX)
    }


def is_mig_profile(text: str) -> bool:
    return _PROFILE.fullmatch(text) is not None


def mig_profile_of(model: str) -> str | None:
    """The profile of a MIG instance's model name ("1g.10gb"); None for a whole GPU."""
    match = _IN_MODEL.search(model)
    return match.group(1) if match is not None else None


def slice_model(gpu_model: str, profile: str) -> str:
    """The model name NVML gives an instance of ``profile`` on a ``gpu_model``."""
    return f"{gpu_model} MIG {profile}"


def compute_sevenths(profile: str) -> int:
    """The instance's compute share in sevenths of its GPU ("3g.40gb": 3)."""
    return int(profile.split("g.", 1)[0])


def mig_memory_bytes(profile: str) -> int:
    """The instance's memory as its name says it ("1g.10gb": 10 GB)."""
    return int(profile.split(".", 1)[1].removesuffix("gb")) * _GB
