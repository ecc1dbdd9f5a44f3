"""Whether work could ever run on this fleet, whatever else ran or waited.

The filters (filters.py) say where a member fits *now*; this says whether the fleet as
it is could ever hold the work and, if not, which of the work's fields asks for more
than any node has: "no node has 64 GPU; the largest has 8". The API refuses such work
at submission (a 422 naming the field) unless the spec opts out for a fleet that will
grow; the core gives work that is queued anyway (opted out, or the fleet shrank) the
pending code ``unschedulable`` with this exact cause, never "waiting for capacity".

Judged against every node of the snapshot at the work's sites, healthy or not (a node
that is down may come back), on what does not change while work runs, in this order: for
training, a node that isolates its workers as well as the job asks, with a container
runtime when it names an image, with a usable sealing key and tenants kept apart
(isolation user or sandbox) when it has secrets; a pool of an accepted kind, with enough
accelerators for one member, of an accepted model, with enough memory each; host memory
and CPU cores for one member on such a node; a training job's deadline on the fastest
such pool; the whole gang on all such nodes together; members kept apart by their own
anti-affinity on as many such nodes (self_anti_affinity.py); the gang within what the
tenant's quota and its cohort could ever give it. Labels, taints and start windows are
not judged: an operator changes them without the fleet changing.

Nothing registered at one of the work's sites is nothing to judge by (a node may
register there), with the one exception the API has always made: training only at
sites other than cloud needs a node there whose agent runs training (edge agents do
not by default).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from shared.clock import utc_from_epoch
from shared.messages import AcceleratorKind

from .arrays import BoolArray, IntArray
from .hierarchy import tree_of
from .mig import accepted_models, kept_off_profiles, restricts_models, wanted_models_text
from .mig_quota import slices_beyond_quota
from .model import ISOLATION_RANK, KIND_INDEX, KINDS, Tenant, TrainingJob, Work
from .plan import NeverFits
from .self_anti_affinity import apart_never_fits
from .snapshot import CPU_COLUMN, SITE_INDEX, NodeTable, Snapshot
from .topology import topology_never_fits

_GIB = 1 << 30


def never_fits(snapshot: Snapshot, work: Work) -> NeverFits | None:
    """Why no node of ``snapshot`` could ever run ``work`` (the first field at fault, in
    the order above), or None when some could, or when nothing tells. A training job
    with alternative gang shapes fits when any of its shapes does."""
    return FleetFit(snapshot).never_fits_in_any_shape(work)


@dataclass(frozen=True, slots=True)
class _Members:
    """Where one member of a shape fits on an empty fleet (shared by all work asking
    for the same member): per usable pool column its nodes, and per node how many."""

    kinds: str  # e.g. "GPU", "NPU/GPU"
    need: int  # accelerators per member
    usable: dict[int, BoolArray]
    per_node: IntArray
    total: int  # members the whole fleet could hold at once
    fastest: float  # relative speed of the fastest usable pool
    slowest: float  # and of the slowest


class FleetFit:
    """`never_fits` over one snapshot, remembering per member shape what the fleet
    could hold: a pass judges thousands of jobs, most of them alike."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self._members: dict[Hashable, _Members | NeverFits | None] = {}

    def at(self, now: float) -> FleetFit:
        """The same fleet judged at `now` (only deadlines are judged against it)."""
        return self._sharing(dataclasses.replace(self.snapshot, now=float(now)))

    def with_tenants(self, tenants: Sequence[Tenant]) -> FleetFit:
        """The same fleet with other tenants (quotas)."""
        return self._sharing(self.snapshot.with_tenants(tenants))

    def _sharing(self, snapshot: Snapshot) -> FleetFit:
        """A judge of `snapshot`, the same nodes as this one's, that remembers the shapes
        this one judged: where a member could fit depends on neither time nor quotas (but
        for the slice profiles a tenant's quota keeps its work off, which are in the key)."""
        fit = FleetFit(snapshot)
        fit._members = self._members
        return fit

    def never_fits_in_any_shape(self, work: Work) -> NeverFits | None:
        """``never_fits`` of the declared shape, unless one of a training job's
        alternative gang shapes could run (flexible shapes): what submission asks."""
        never = self.never_fits(work)
        if never is None or not isinstance(work, TrainingJob):
            return never
        for shape in work.alternative_shapes:
            if self.never_fits(work.reshaped(shape)) is None:
                return None
        return never

    def never_fits(self, work: Work) -> NeverFits | None:
        """Why the fleet could never run ``work`` in its declared shape; None: it could."""
        snapshot = self.snapshot
        if (
            isinstance(work, TrainingJob)
            and work.deadline is not None
            and (work.deadline <= snapshot.now)
        ):
            return NeverFits("deadline", f"{_iso(work.deadline)} has passed")
        kept_off = kept_off_profiles(work, snapshot.tenants)
        key = _member_key(work, kept_off)
        if key not in self._members:
            self._members[key] = _members(snapshot, work, kept_off)
        members = self._members[key]
        if not isinstance(members, _Members):
            return members
        if isinstance(work, TrainingJob):
            found = _deadline_or_gang(snapshot, work, members) or topology_never_fits(
                snapshot, work, members.per_node, members.need, members.kinds
            )
            if found is not None:
                return found
            wanted = work.workers
        else:
            wanted = work.replicas if work.min_replicas is None else work.min_replicas
        apart = apart_never_fits(work, members.per_node, wanted)
        if apart is not None:
            return apart
        tenant = snapshot.tenants.get(work.tenant)
        if tenant is None:
            return None
        found = _beyond_quota(snapshot, work, tenant, members.need * wanted)
        if found is None and isinstance(work, TrainingJob):
            found = _cores_beyond_quota(snapshot, work, tenant)
        return found


def _member_key(work: Work, kept_off: frozenset[str]) -> Hashable:
    """Everything `_members` reads of the work, and the slice profiles its tenant's
    quota keeps it off (mig.py)."""
    common = (
        kept_off,
        work.sites,
        work.accelerator_models,
        work.mig_profile,
        work.memory_bytes,
        work.host_memory_bytes,
    )
    if isinstance(work, TrainingJob):
        return (
            "training",
            *common,
            work.accelerator_kind,
            work.accelerators_per_worker,
            work.cpus_per_worker,
            work.isolation,
            work.image is not None,
            work.has_secrets,
        )
    return ("inference", *common, work.accepted_kinds, work.accelerators_per_replica)


def _members(
    snapshot: Snapshot, work: Work, kept_off: frozenset[str]
) -> _Members | NeverFits | None:
    """Where one member could ever fit, or why nowhere (None: nothing to judge by);
    ``kept_off``: the slice profiles its tenant's quota keeps it off (mig.py)."""
    training = isinstance(work, TrainingJob)
    table = snapshot.nodes
    eligible = table.runs_training if training else np.ones(len(table), dtype=np.bool_)
    by_site = {site: eligible & (table.site_code == SITE_INDEX[site]) for site in work.sites}
    if not any(mask.any() for mask in by_site.values()):
        if training and "cloud" not in work.sites:
            return NeverFits(
                "sites",
                f"no node at {', '.join(work.sites)} runs training (an edge agent runs it "
                "with agent.training_enabled = true); name cloud, or enable training there",
            )
        return None
    if not all(mask.any() for mask in by_site.values()):
        return None  # a node may yet register at a site that has none
    at_sites: BoolArray = np.logical_or.reduce(list(by_site.values()))
    if isinstance(work, TrainingJob):
        contained = _containing(table, work, at_sites)
        if isinstance(contained, NeverFits):
            return contained
        at_sites = contained

    if isinstance(work, TrainingJob):
        kind_field, count_field = "accelerator_kind", "accelerators_per_worker"
        need = work.accelerators_per_worker
        kind_codes: tuple[int, ...] = (KIND_INDEX[work.accelerator_kind],)
        cores = work.cpus_per_worker
    else:
        kind_field, count_field = "accepted_kinds", "accelerators_per_replica"
        need = work.accelerators_per_replica
        kind_codes = tuple(KIND_INDEX[kind] for kind in work.accepted_kinds)
        cores = 0
    kinds = "/".join(KINDS[k].upper() for k in kind_codes)
    columns = [c for k in kind_codes for c in table.kind_columns[k]]

    # Per pool column of an accepted kind: the nodes where one member's devices fit.
    usable = {c: at_sites & (table.kinds[c].capacity > 0) for c in columns}
    if not _any(usable):
        return NeverFits(kind_field, f"no node at {', '.join(work.sites)} has a {kinds}")
    largest = int(_most(usable, lambda c: table.kinds[c].capacity))
    usable = {c: mask & (table.kinds[c].capacity >= need) for c, mask in usable.items()}
    if not _any(usable):
        return NeverFits(count_field, f"no node has {need} {kinds}; the largest has {largest}")
    if restricts_models(work, kept_off):
        for c, mask in usable.items():
            pools = table.kinds[c]
            accepted = accepted_models(work, pools.models, kept_off)
            usable[c] = mask & np.isin(pools.model_code, accepted)
        if not _any(usable):
            return _no_model(work, need, kinds, kept_off)
    if work.memory_bytes:
        most = int(_most(usable, lambda c: table.kinds[c].memory_bytes))
        usable = {
            c: mask & (table.kinds[c].memory_bytes >= work.memory_bytes)
            for c, mask in usable.items()
        }
        if not _any(usable):
            return NeverFits(
                "memory_bytes",
                f"no node has {kinds} with {_gib(work.memory_bytes)} of memory each; "
                f"the most is {_gib(most)}",
            )

    # The nodes that could hold one member's devices, then what else a member needs.
    holders = np.zeros(len(table), dtype=np.bool_)
    for mask in usable.values():
        holders |= mask
    holder = f"no node with {need} {kinds}"
    if work.host_memory_bytes:
        most = int(table.host_memory_total[holders].max())
        holders &= table.host_memory_total >= work.host_memory_bytes
        if not holders.any():
            return NeverFits(
                "host_memory_bytes",
                f"{holder} has {_gib(work.host_memory_bytes)} of host memory; the most is "
                f"{_gib(most)}",
            )
    if cores:
        node_cores = table.kinds[CPU_COLUMN].capacity
        most = int(node_cores[holders].max())
        holders &= node_cores >= cores
        if not holders.any():
            return NeverFits(
                "cpus_per_worker", f"{holder} has {cores} CPU cores; the most is {most}"
            )
    usable = {c: mask & holders for c, mask in usable.items()}
    per_node = _per_node(snapshot, work, usable, need, cores)
    return _Members(
        kinds=kinds,
        need=need,
        usable=usable,
        per_node=per_node,
        total=int(per_node.sum()),
        fastest=float(_most(usable, lambda c: table.kinds[c].relative_speed)),
        slowest=-float(_most(usable, lambda c: -table.kinds[c].relative_speed)),
    )


_ISOLATION_NAMES: dict[int, str] = {rank: name for name, rank in ISOLATION_RANK.items()}


def _containing(table: NodeTable, work: TrainingJob, at_sites: BoolArray) -> BoolArray | NeverFits:
    """The nodes of `at_sites` that contain the job's workers as it asks: isolation at
    least as strong, a container runtime for an image, for secrets a sealing key and
    tenants kept apart."""
    sites = ", ".join(work.sites)
    best = int(table.isolation_rank[at_sites].max())
    nodes = at_sites & (table.isolation_rank >= ISOLATION_RANK[work.isolation])
    if not nodes.any():
        if best == ISOLATION_RANK["unavailable"]:
            return NeverFits(
                "isolation",
                f"no node at {sites} can isolate training workers (each reports isolation "
                "unavailable; its operator may allow unisolated work with agent.isolation)",
            )
        return NeverFits(
            "isolation",
            f"no node at {sites} isolates training workers as {work.isolation}; the best "
            f"isolates as {_ISOLATION_NAMES[best]}",
        )
    held: list[str] = [] if work.isolation == "none" else [f"isolates as {work.isolation}"]
    if work.image is not None:
        nodes &= table.runs_containers
        if not nodes.any():
            return NeverFits(
                "image",
                f"no node at {sites}{_that(held)} has a container runtime (podman or docker) "
                "to run an image",
            )
        held.append("runs containers")
    if work.has_secrets:
        receiving = nodes & table.receives_secrets
        if not receiving.any():
            return NeverFits(
                "has_secrets",
                f"no node at {sites}{_that(held)} can receive sealed secrets "
                f"({_why_no_secrets(table, nodes)})",
            )
        nodes = receiving
    return nodes


def _why_no_secrets(table: NodeTable, nodes: BoolArray) -> str:
    """Why none of `nodes` receives secrets: a node needs the sealing key it enrolled with
    and to keep tenants apart (cloud/loop/nodes.py `receives_secrets`). The table does not
    say which nodes have a key, but one at isolation none receives no secrets with one."""
    at_none = nodes & (table.isolation_rank == ISOLATION_RANK["none"])
    if not at_none.any():
        return "none announces the sealing key it enrolled with"
    if np.array_equal(at_none, nodes):
        return (
            "each isolates as none, where every tenant's workers run as one user who could "
            "read them: a node needs isolation user or sandbox and the sealing key it "
            "enrolled with; a registered cluster needs accepts_secrets"
        )
    return (
        "those at isolation user or sandbox announce no sealing key they enrolled with, "
        "and the others isolate as none, where every tenant's workers run as one user"
    )


def _that(qualities: list[str]) -> str:
    return f" that {' and '.join(qualities)}" if qualities else ""


def _per_node(
    snapshot: Snapshot, work: Work, usable: dict[int, BoolArray], need: int, cores: int
) -> IntArray:
    """Members each node could hold at once: its usable pools, its host memory, its cores."""
    table = snapshot.nodes
    per_node: IntArray = np.zeros(len(table), dtype=np.int64)
    for c, mask in usable.items():
        per_node += np.where(mask, table.kinds[c].capacity // need, 0)
    if work.host_memory_bytes:
        per_node = np.minimum(per_node, table.host_memory_total // work.host_memory_bytes)
    if cores:
        per_node = np.minimum(per_node, table.kinds[CPU_COLUMN].capacity // cores)
    return per_node


def _deadline_or_gang(snapshot: Snapshot, work: TrainingJob, members: _Members) -> NeverFits | None:
    """A deadline the fastest usable pool cannot meet; a gang larger than the fleet (in
    time for its deadline: a slow pool holds none of its members)."""
    per_node, total = members.per_node, members.total
    if work.deadline is not None:
        needed_s = work.duration_s / members.fastest
        if snapshot.now + needed_s > work.deadline:
            return NeverFits(
                "deadline",
                f"{_iso(work.deadline)} is too soon: the job needs {needed_s:,.0f} s on the "
                f"fastest registered {work.accelerator_kind} (relative speed "
                f"{members.fastest:g}), so it would be late wherever it ran",
            )
        slowest_late = snapshot.now + work.duration_s / members.slowest > work.deadline
        if slowest_late and 1 < work.workers <= total:  # enough nodes: enough in time?
            table = snapshot.nodes
            in_time = {
                c: mask
                & (snapshot.now + work.duration_s / table.kinds[c].relative_speed <= work.deadline)
                for c, mask in members.usable.items()
            }
            per_node = _per_node(snapshot, work, in_time, members.need, work.cpus_per_worker)
            total = int(per_node.sum())
    if work.workers > 1 and total < work.workers:
        return NeverFits(
            "workers",
            f"the fleet could hold at most {total} workers of {members.need} {members.kinds} "
            f"at once (on {int(np.count_nonzero(per_node))} nodes); the gang has {work.workers}",
        )
    return None


def _no_model(work: Work, need: int, kinds: str, kept_off: frozenset[str]) -> NeverFits:
    """No pool with room for a member is of a model the work may take."""
    if work.accelerator_models or work.mig_profile is not None:
        field = "accelerator_models" if work.accelerator_models else "mig_profile"
        models = wanted_models_text(work)
        return NeverFits(field, f"no node has {need} {kinds} of model {models}")
    # Only slices its tenant's quota keeps for work asking for their profile would do.
    profiles = ", ".join(sorted(kept_off))
    return NeverFits(
        "mig_profile",
        f"no node has {need} {kinds} other than MIG slices of {profiles}, which tenant "
        f"{work.tenant}'s slice quota keeps for work asking for that profile (mig_profile)",
    )


def _beyond_quota(snapshot: Snapshot, work: Work, tenant: Tenant, total: int) -> NeverFits | None:
    """The whole job (a deployment: its minimum) asks for more of every accepted kind
    than the tenant could ever hold: its nominal quota, plus what its cohort could lend
    within its borrowing limit (quota.py's rules, with nothing else running)."""
    if work.mig_profile is not None and work.mig_profile in tenant.mig_nominal:
        return slices_beyond_quota(work, tenant, total)
    kinds = (work.accelerator_kind,) if isinstance(work, TrainingJob) else work.accepted_kinds
    ceilings = [(KIND_INDEX[kind], _ceiling(snapshot, tenant, kind)) for kind in kinds]
    if any(total <= ceiling for _, ceiling in ceilings):
        return None
    k, ceiling = max(ceilings, key=lambda item: item[1])
    kind = KINDS[k]
    source = _quota_source(snapshot, tenant, kind)
    if isinstance(work, TrainingJob):
        field = "workers" if work.workers > 1 else "accelerators_per_worker"
        asks = f"the job needs {total}"
    else:
        field = "replicas" if work.min_replicas is None else "min_replicas"
        asks = f"its replicas need {total}"
    return NeverFits(
        field,
        f"tenant {tenant.name} may hold at most {ceiling} {kind.upper()} ({source}); {asks}",
    )


def _cores_beyond_quota(snapshot: Snapshot, work: TrainingJob, tenant: Tenant) -> NeverFits | None:
    """The gang's CPU cores beside its devices, against the tenant's ``cpu`` quota where
    it has one (quota.py charges them there; without one they are capacity only)."""
    if not work.cpus_per_worker or "cpu" not in tenant.nominal:
        return None
    total = work.cpus_per_worker * work.workers
    ceiling = _ceiling(snapshot, tenant, "cpu")
    if total <= ceiling:
        return None
    return NeverFits(
        "cpus_per_worker",
        f"tenant {tenant.name} may hold at most {ceiling} CPU "
        f"({_quota_source(snapshot, tenant, 'cpu')}); the job's cpus_per_worker need {total}",
    )


def _quota_source(snapshot: Snapshot, tenant: Tenant, kind: AcceleratorKind) -> str:
    """Where a tenant's ceiling of ``kind`` comes from, for a person."""
    if tenant.cohort is None:
        return "its nominal quota; no cohort to borrow from"
    source = f"nominal {tenant.nominal.get(kind, 0)} plus what cohort {tenant.cohort} could lend"
    if tenant.cohort in snapshot.cohorts:
        source += " within the limits of the cohorts above it"
    limit = tenant.borrowing_limit.get(kind)
    if limit is not None:
        source += f", borrowing limit {limit}"
    return source


def _ceiling(snapshot: Snapshot, tenant: Tenant, kind: AcceleratorKind) -> int:
    """The most of ``kind`` the tenant could ever hold at once."""
    tree = tree_of(snapshot.tenants, snapshot.cohorts) if tenant.cohort is not None else None
    if tree is not None and tree.manages(tenant.name):
        return tree.ceiling(tenant.name, KIND_INDEX[kind])
    nominal = tenant.nominal.get(kind, 0)
    if tenant.cohort is None:
        return nominal
    cohort_total = sum(
        other.nominal.get(kind, 0)
        for other in snapshot.tenants.values()
        if other.cohort == tenant.cohort
    )
    limit = tenant.borrowing_limit.get(kind)
    return cohort_total if limit is None else min(cohort_total, nominal + limit)


def _any(usable: dict[int, BoolArray]) -> bool:
    return any(bool(mask.any()) for mask in usable.values())


def _most(usable: dict[int, BoolArray], values: Callable[[int], NDArray[Any]]) -> Any:
    """The largest of ``values(column)`` (one per node) over the usable pools."""
    return max(values(c)[mask].max().item() for c, mask in usable.items() if mask.any())


def _gib(amount_bytes: int) -> str:
    return f"{amount_bytes / _GIB:,.4g} GiB"


def _iso(timestamp: float) -> str:
    return utc_from_epoch(timestamp).isoformat()
