"""Which pools of a kind work may take, by model: its ``accelerator_models``, its
``mig_profile`` and its tenant's slice quotas (the filter ``model`` and the never-fits
check both ask here).

A MIG slice is a pool of its own (snapshot.py: one column per profile beside the whole
GPUs). Work with a ``mig_profile`` takes only slices of that profile, each counting as
one of its accelerators; work without one may take any pool its other filters allow
(a small model may serve from a slice), except slices of a profile its tenant has a
quota for: those count against that quota alone, which admits only work asking for
the profile (mig_quota.py), so work the gpu quota admitted never lands on them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from shared.mig_profiles import mig_profile_of

from .model import Tenant, Work

NO_PROFILES: frozenset[str] = frozenset()


def kept_off_profiles(work: Work, tenants: Mapping[str, Tenant]) -> frozenset[str]:
    """The MIG profiles whose slices ``work`` may not take: those its tenant has a slice
    quota for, unless it asks for a profile (it then takes that profile's alone)."""
    if work.mig_profile is not None:
        return NO_PROFILES
    tenant = tenants.get(work.tenant)
    if tenant is None or not tenant.mig_nominal:
        return NO_PROFILES
    return frozenset(tenant.mig_nominal)


def restricts_models(work: Work, kept_off: frozenset[str] = NO_PROFILES) -> bool:
    return bool(work.accelerator_models) or work.mig_profile is not None or bool(kept_off)


def accepted_models(
    work: Work, models: Sequence[str], kept_off: frozenset[str] = NO_PROFILES
) -> list[int]:
    """Indexes into ``models`` (a column's vocabulary) of the models ``work`` accepts;
    ``kept_off``: the profiles of ``kept_off_profiles``."""
    accepted = []
    for index, model in enumerate(models):
        profile = mig_profile_of(model)
        if (
            (not work.accelerator_models or model in work.accelerator_models)
            and (work.mig_profile is None or profile == work.mig_profile)
            and (profile is None or profile not in kept_off)
        ):
            accepted.append(index)
    return accepted


def wanted_models_text(work: Work) -> str:
    """The models ``work`` accepts, for a person: "MIG 1g.10gb", "A100, H100"."""
    parts = []
    if work.mig_profile is not None:
        parts.append(f"MIG {work.mig_profile}")
    if work.accelerator_models:
        parts.append(", ".join(work.accelerator_models))
    return " of ".join(parts)
