"""Where a training gang's workers may be together: one region, zone or rack.

A gang exchanges gradients every step, so workers an ocean apart run at the pace of
the link between them. A gang therefore stays within one *domain* of its
``topology``: one region by default, one zone or one rack (the node label ``rack``)
when it asks, or anywhere with ``"any"``. Nodes without a rack label are in no rack
domain (a gang asking for a rack never goes there); an empty zone or region is a
domain of its own, as for nodes that never said where they are.

The core (core.py) anchors a gang: its first member goes to the best-scoring node
anywhere, the others within that node's domain, so a gang that fits there is placed
once, at no extra cost. Where it does not, the gang is placed as it would be without
topology, and one that spans domains is discarded and tried again within each of the
roomiest domains (at most ``MAX_DOMAINS_TRIED``, those that might hold it whole; not
the anchor's again), the best-scoring whole placement winning. None: the gang waits,
and its explanation names the constraint and the roomiest domain (``topology_note``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import numpy as np

from .arrays import BoolArray, IntArray
from .gang import members_per_node
from .model import TrainingJob
from .plan import NeverFits, Placement
from .snapshot import Snapshot

if TYPE_CHECKING:
    from .gang import JobContext
    from .shape import WorkShape

# At most this many domains are tried for one gang whose first placement spanned several.
MAX_DOMAINS_TRIED: Final = 4
RACK_LABEL: Final = "rack"


@dataclass(frozen=True, slots=True)
class Domains:
    """Per node, the index of its domain (-1: in none) at the gang's topology level."""

    level: str  # "region", "zone" or "rack"
    codes: IntArray
    names: tuple[str, ...]

    def nodes_in(self, domain: int) -> BoolArray:
        """Mask over all nodes: those in ``domain``."""
        inside: BoolArray = self.codes == domain
        return inside

    def name(self, domain: int) -> str:
        name = self.names[domain]
        return name or f"(no {self.level})"


def gang_domains(snapshot: Snapshot, shape: WorkShape) -> Domains | None:
    """The domains ``shape``'s gang must keep to; None when it may span (not a gang,
    or ``topology = "any"``)."""
    return job_domains(snapshot, shape.work) if shape.is_gang else None


def job_domains(snapshot: Snapshot, work: object) -> Domains | None:
    """The domains a training gang must keep to; None for other work, a single worker,
    or ``topology = "any"``."""
    if not isinstance(work, TrainingJob) or work.workers < 2 or work.topology == "any":
        return None
    nodes = snapshot.nodes
    if work.topology == "region":
        return Domains("region", nodes.region_code, nodes.regions)
    if work.topology == "zone":
        return Domains("zone", nodes.zone_code, nodes.zones)
    codes = nodes.label_codes.get(RACK_LABEL)
    if codes is None:
        return Domains("rack", np.full(len(nodes), -1, dtype=np.int64), ())
    return Domains("rack", codes, nodes.label_values[RACK_LABEL])


def topology_never_fits(
    snapshot: Snapshot, work: TrainingJob, per_node: IntArray, need: int, kinds: str
) -> NeverFits | None:
    """The gang is larger than any one domain of its topology could ever hold
    (``per_node``: the members each node could hold at once, unschedulable.py)."""
    domains = job_domains(snapshot, work)
    if domains is None:
        return None
    inside = domains.codes >= 0
    held = np.bincount(
        domains.codes[inside], weights=per_node[inside], minlength=len(domains.names)
    ).astype(np.int64)
    largest = int(held.max()) if held.size else 0
    if largest >= work.workers:
        return None
    where = (
        f"no node has a {domains.level} label"
        if held.size == 0
        else f"the largest, {domains.name(int(np.argmax(held)))}, could hold {largest}"
    )
    return NeverFits(
        "topology",
        f"no one {domains.level} could ever hold the gang's {work.workers} workers of {need} "
        f'{kinds} ({where}); topology = "any" lets it span {domains.level}s',
    )


def within_one(domains: Domains, snapshot: Snapshot, placements: Sequence[Placement]) -> bool:
    index = snapshot.nodes.index
    codes = {int(domains.codes[index[p.node_id]]) for p in placements}
    return len(codes) == 1 and min(codes) >= 0


def domain_room(job: JobContext, domains: Domains, *, preempt: bool) -> IntArray:
    """Per domain, how many members might fit there now (free accelerators, plus what
    lower-priority work holds when ``preempt``), within the job's speed class if it
    keeps to one. An estimate: quota, host memory and reservations are left to the
    attempt itself."""
    room = np.zeros(len(domains.names), dtype=np.int64)
    for option in job.options:
        nodes = option.cand.nodes
        members = members_per_node(job, option, preempt=preempt)
        if job.runtime_class_s is not None:
            members = np.where(option.runtime_s == job.runtime_class_s, members, 0)
        codes = domains.codes[nodes]
        inside = codes >= 0
        room += np.bincount(
            codes[inside], weights=members[inside], minlength=len(domains.names)
        ).astype(np.int64)
    return room


def domains_to_try(room: IntArray, members: int) -> list[int]:
    """Domains that might hold the whole gang, roomiest first (ties: first name),
    at most ``MAX_DOMAINS_TRIED``."""
    fitting = [int(d) for d in np.flatnonzero(room >= members)]
    fitting.sort(key=lambda d: (-int(room[d]), d))
    return fitting[:MAX_DOMAINS_TRIED]


def topology_note(job: JobContext) -> str | None:
    """Why a gang that keeps to one domain waits, when the domain is the obstacle (its
    members would fit now if it could span domains), naming the roomiest domain:
    "needs 2 workers × 4 GPU within one region (topology): the roomiest region,
    europe-west3, has room for 1 now". None otherwise."""
    domains = gang_domains(job.state.snapshot, job.shape)
    if domains is None or not job.options:
        return None
    shape = job.shape
    room = domain_room(job, domains, preempt=False)
    if room.size and int(room.max()) >= shape.members:
        return None  # it would fit within one: something else (quota, memory) is in the way
    if _total_room(job) < shape.members:
        return None  # it would not fit even across domains: capacity explains it
    kind = job.state.snapshot.nodes.kinds[job.options[0].k].kind
    need = (
        f"needs {shape.members} workers × {shape.accelerators} {kind.upper()} within one "
        f"{domains.level} (topology)"
    )
    if room.size == 0:
        return f"{need}: no candidate node has a {domains.level}"
    best = int(np.argmax(room))
    return (
        f"{need}: the roomiest {domains.level}, {domains.name(best)}, has room for "
        f"{int(room[best])} now"
    )


def _total_room(job: JobContext) -> int:
    shape = job.shape
    total = 0
    for option in job.options:
        members = job.state.free[option.k][option.cand.nodes] // shape.accelerators
        if shape.max_per_node is not None:
            members = np.minimum(members, shape.max_per_node)
        total += int(members.sum())
    return total
