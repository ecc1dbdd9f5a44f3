"""Quota per MIG profile: a tenant's ``mig_nominal`` ("1g.10gb": 7 slices).

A slice is a seventh of a GPU or more, never a GPU: counted as one against the gpu
quota, a tenant with a quota of 7 GPUs could hold 7 slices (one GPU's worth) and
nothing else. So where a tenant's quotas name a profile, its slices of that profile
count against that profile's quota alone (``ClusterState.mig_usage``), and work
asking for the profile (``mig_profile``) is admitted by it, not by the gpu quota.
Slices of such a profile are the quota's alone: the tenant's work that does not ask
for the profile is kept off them (mig.py, filter ``model``), since it is admitted by
the gpu quota while the slices would count against the profile's, and so would be
held under neither. A slice quota is the tenant's own: no cohort borrowing or lending,
no reclaiming what the cohort borrowed of the gpu quota, and no eviction makes room
under it (its own lower-priority slices are not preempted for it); work over it
waits, pending for quota. A tenant whose quotas name no profile counts a slice as one
GPU, as before.
"""

from __future__ import annotations

from typing import Final

from .model import Tenant, TrainingJob, Work
from .plan import NeverFits
from .quota import Admission, QuotaState
from .shape import WorkShape
from .state import ClusterState

# Admitted by the slice quota (``mig_block`` before each member), not by a kind's: no
# borrowing and no reclaim rights over the cohort's GPU borrowers.
WITHIN: Final = Admission("slices", 0, None)


def governs(state: ClusterState, work: Work) -> bool:
    """The work asks for a MIG profile its tenant has a quota for."""
    profiles = state.mig_quota_profiles.get(work.tenant)
    return profiles is not None and work.mig_profile in profiles


def slices_beyond_quota(work: Work, tenant: Tenant, total: int) -> NeverFits | None:
    """The whole job (a deployment: its minimum) asks for more slices of its profile
    than the tenant's quota for it: it could never run (slice quotas are not borrowed)."""
    assert work.mig_profile is not None
    nominal = tenant.mig_nominal[work.mig_profile]
    if total <= nominal:
        return None
    if isinstance(work, TrainingJob):
        field = "workers" if work.workers > 1 else "accelerators_per_worker"
    else:
        field = "replicas" if work.min_replicas is None else "min_replicas"
    return NeverFits(
        field,
        f"tenant {tenant.name} may hold at most {nominal} mig-{work.mig_profile} slices (its "
        f"quota; slice quotas are not borrowed); the work needs {total}",
    )


def mig_block(state: ClusterState, shape: WorkShape) -> Admission | None:
    """The denial when one more member would take the tenant over its quota for the
    work's profile; None when it fits (or no slice quota governs the work)."""
    work = shape.work
    if work.mig_profile is None or not governs(state, work):
        return None
    tenant = state.snapshot.tenants[work.tenant]
    nominal = tenant.mig_nominal[work.mig_profile]
    usage = state.mig_usage.get((work.tenant, work.mig_profile), 0)
    if usage + shape.accelerators <= nominal:
        return None
    quota = QuotaState(
        mode="denied",
        tenant=work.tenant,
        kind=f"mig-{work.mig_profile}",
        usage=usage,
        requested=shape.accelerators * shape.members,
        nominal=nominal,
        borrowing_limit=0,
        cohort=None,
        cohort_usage=usage,
        cohort_nominal=nominal,
    )
    return Admission("denied", usage + shape.accelerators - nominal, quota)
