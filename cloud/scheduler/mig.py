"""Which pools of a kind work may take, by model: its ``accelerator_models`` and its
``mig_profile`` (the filter ``model`` and the never-fits check both ask here).

A MIG slice is a pool of its own (snapshot.py: one column per profile beside the whole
GPUs). Work with a ``mig_profile`` takes only slices of that profile, each counting as
one of its accelerators; work without one may take any pool its other filters allow
(a small model may serve from a slice).
"""

from __future__ import annotations

from collections.abc import Sequence

from shared.mig_profiles import mig_profile_of

from .model import Work


def restricts_models(work: Work) -> bool:
    return bool(work.accelerator_models) or work.mig_profile is not None


def accepted_models(work: Work, models: Sequence[str]) -> list[int]:
    """Indexes into ``models`` (a column's vocabulary) of the models ``work`` accepts."""
    return [
        index
        for index, model in enumerate(models)
        if (not work.accelerator_models or model in work.accelerator_models)
        and (work.mig_profile is None or mig_profile_of(model) == work.mig_profile)
    ]


def wanted_models_text(work: Work) -> str:
    """The models ``work`` accepts, for a person: "MIG 1g.10gb", "A100, H100"."""
    parts = []
    if work.mig_profile is not None:
        parts.append(f"MIG {work.mig_profile}")
    if work.accelerator_models:
        parts.append(", ".join(work.accelerator_models))
    return " of ".join(parts)
