"""What a pass decides: placements, preemptions, reservations and pending work.

Every placement carries the score breakdown of the chosen node and of the
runners-up; every pending job carries machine-readable reasons and one sentence
for a person.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, NamedTuple

from shared.messages import AcceleratorKind
from shared.work_literals import PriorityClass, WorkKind

from .model import Allocation, GangShape
from .quota import QuotaState

PendingCode = Literal[
    "unschedulable",
    # Only cordoned or draining nodes could run it (cordon_block.py).
    "cordoned",
    "window",
    "deferred",
    "quota",
    "capacity",
    "reserved",
    "partial",
    "hook-failed",
    # Waits for other jobs to end (its depends_on): decided by the scheduling loop
    # before the core sees the queue (cloud/work/dependencies.py), never by the core.
    "dependency",
]
DeferralCause = Literal["temporal", "capacity"]
PreemptionReason = Literal["priority", "reclaim", "quota", "deadline"]
HookKind = Literal["score-term", "latency-estimator", "start-advisor"]


class TermScore(NamedTuple):
    name: str
    value: float  # normalised, 0..1
    weight: float


class ScoreBreakdown(NamedTuple):
    """Why a node scored what it did: ``total`` is the sum of weight x value.

    A named tuple: one is recorded for every candidate shown, so it must be cheap.
    """

    node_id: str
    accelerator_kind: AcceleratorKind
    total: float
    names: tuple[str, ...]
    values: tuple[float, ...]
    weights: tuple[float, ...]

    @property
    def terms(self) -> tuple[TermScore, ...]:
        return tuple(map(TermScore, self.names, self.values, self.weights))

    def term(self, name: str) -> TermScore:
        return self.terms[self.names.index(name)]

    def describe(self) -> str:
        parts = ", ".join(f"{t.name} {t.value:.2f}x{t.weight:g}" for t in self.terms if t.weight)
        return f"{self.node_id} {self.total:.3f} ({parts})"


@dataclass(frozen=True, slots=True)
class Placement:
    work_id: str
    work_kind: WorkKind
    member: int  # worker or replica number
    allocation_id: str
    node_id: str
    accelerator_kind: AcceleratorKind
    accelerators: int
    host_memory_bytes: int
    provider: str | None  # ONNX Runtime execution provider to use
    tenant: str
    priority: PriorityClass
    preemptible: bool
    borrowed: bool  # admitted on capacity borrowed from the tenant's cohort (informational)
    start_at: float
    expected_end: float | None
    chosen: ScoreBreakdown
    runners_up: tuple[ScoreBreakdown, ...]
    group: str | None = None
    anti_affinity_groups: tuple[str, ...] = ()
    # The job's start window was closed on this node and waived: waiting for it
    # would have missed the deadline.
    window_waived: bool = False
    start_window: str | None = None  # the window, as written, for explanations
    # The model of the node's pool it takes: which devices to hand out where a node has
    # several pools of the kind (MIG slices beside whole GPUs).
    accelerator_model: str = ""
    # Carbon-aware power capping (cloud/green/power_capping.py): each of its devices
    # held to this power limit for the run, ``expected_end`` already stretched for
    # the slower pace; None: the devices' default limit.
    power_limit_w: float | None = None
    cpu_cores: int = 0  # from the node's CPU pool beside the accelerators
    # Flexible shapes: the shape the job declared, where it was placed in one of its
    # alternatives instead (``reshaped``); None where it runs as declared.
    declared_shape: GangShape | None = None
    # Training that saves checkpoints; training with a deadline or a maximum delay
    # (``Allocation``'s fields of the same names).
    checkpointing: bool = False
    deadline_bound: bool = False
    # Its deployment's disruption budget (``Allocation.min_available``), carried into
    # ``to_allocation`` so that what runs from a plan keeps it; 0 for training.
    min_available: int = 0

    @property
    def reshaped(self) -> str | None:
        """ "reshaped to 2×4 (declared 1×8)", for explanations; None when not reshaped."""
        declared = self.declared_shape
        if declared is None:
            return None
        chosen = GangShape(declared.accelerators // self.accelerators, self.accelerators)
        return f"reshaped to {chosen} (declared {declared})"

    @property
    def started_at(self) -> float:
        return self.start_at

    def to_allocation(self) -> Allocation:
        return Allocation(
            allocation_id=self.allocation_id,
            work_id=self.work_id,
            work_kind=self.work_kind,
            tenant=self.tenant,
            priority=self.priority,
            preemptible=self.preemptible,
            node_id=self.node_id,
            accelerator_kind=self.accelerator_kind,
            accelerators=self.accelerators,
            host_memory_bytes=self.host_memory_bytes,
            started_at=self.start_at,
            expected_end=self.expected_end,
            borrowed=self.borrowed,
            group=self.group,
            anti_affinity_groups=self.anti_affinity_groups,
            accelerator_model=self.accelerator_model,
            power_limit_w=self.power_limit_w,
            cpu_cores=self.cpu_cores,
            checkpointing=self.checkpointing,
            deadline_bound=self.deadline_bound,
            min_available=self.min_available,
        )

    def explain(self) -> str:
        alternatives = "; ".join(r.describe() for r in self.runners_up) or "none"
        waived = (
            f"; start window {self.start_window} waived to meet the deadline"
            if self.window_waived
            else ""
        )
        capped = (
            f"; each device held to {self.power_limit_w:.0f} W (power capping)"
            if self.power_limit_w is not None
            else ""
        )
        reshaped = f"; {self.reshaped}" if self.declared_shape is not None else ""
        return (
            f"{self.allocation_id} on {self.chosen.describe()}"
            f" {self.accelerator_kind}x{self.accelerators}{waived}{capped}{reshaped};"
            f" runners-up: {alternatives}"
        )


@dataclass(frozen=True, slots=True)
class Preemption:
    allocation_id: str
    work_id: str
    node_id: str
    tenant: str
    priority: PriorityClass
    reason: PreemptionReason
    preempted_by: str


@dataclass(frozen=True, slots=True)
class Reservation:
    """Accelerators (and host memory, CPU cores) held for a blocked job from
    ``start_at``; backfill may not delay it."""

    work_id: str
    start_at: float
    accelerator_kind: AcceleratorKind
    nodes: tuple[str, ...]
    accelerators: tuple[int, ...]  # per node in ``nodes``
    host_memory_bytes: tuple[int, ...] = ()  # per node in ``nodes`` (empty: none needed)
    # CPU cores beside the accelerators, per node in ``nodes`` (empty: none needed)
    cpu_cores: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Deferral:
    """A flexible training job held back for a cleaner (or cheaper) window.

    ``expected_now`` and ``expected_then`` are what the advisor minimises (gCO2eq
    for carbon shifting) for the best start now and at ``start_at``.
    """

    start_at: float  # target start, UTC epoch seconds
    latest_start: float  # from then on the job starts regardless (latest safe start)
    zone: str  # grid zone of the best window
    saving_fraction: float  # 1 - expected_then / expected_now
    expected_now: float
    expected_then: float
    quantity: str = "CO2"  # what is saved, as worded in explanations
    unit: str = "gCO2eq"
    # What the deferral will take when it starts, so that later decisions of the same
    # pass see the capacity as booked: accelerators in all, for runtime_s.
    accelerator_kind: AcceleratorKind = "gpu"
    accelerators: int = 0
    runtime_s: float = 0.0
    # Which advisor held it: "temporal" (shifting.py: a cleaner window in its slack) or
    # "capacity" (waiting.py: cleaner capacity frees soon); the eval reports them apart.
    cause: DeferralCause = "temporal"

    def __post_init__(self) -> None:
        if self.latest_start < self.start_at:
            raise ValueError("a deferral must not target a start after its latest safe start")


@dataclass(frozen=True, slots=True, kw_only=True)
class HookFailure:
    """An extension hook failed for one work item: it raised, or returned values that do
    not match the item's candidates. The item waits (code ``hook-failed``); the rest of
    the pass is decided as if the item were not queued."""

    hook: HookKind
    name: str  # a score term's name; the class name of an estimator or advisor
    error: str  # the exception's type, e.g. "KeyError"
    detail: str  # the exception's text


@dataclass(frozen=True, slots=True)
class NeverFits:
    """Why no node of the fleet could ever run the work, whatever else ran or waited
    (unschedulable.py): the work's field at fault, by its name in the model
    (``accelerators_per_worker``, ``host_memory_bytes``, ``workers``, ``deadline``),
    and the reason, e.g. "no node has 64 GPU; the largest has 8"."""

    field: str
    reason: str


@dataclass(frozen=True, slots=True)
class Pending:
    work_id: str
    tenant: str
    priority: PriorityClass
    code: PendingCode
    message: str  # one line for a person
    nodes_total: int
    rejections: Mapping[str, int]  # nodes rejected per filter, in filter-chain order
    fitting_nodes: int  # nodes that could take one member right now
    members_needed: int
    members_placed: int  # > 0 only for a partially placed deployment
    quota: QuotaState | None = None
    reservation: Reservation | None = None
    retry_at: float | None = None  # when something is known to change (window, deferral)
    deferral: Deferral | None = None  # code "deferred": the target start and why
    hook_failure: HookFailure | None = None  # code "hook-failed": which hook, what error
    # code "unschedulable" where the fleet could never hold it: the exact cause
    never_fits: NeverFits | None = None


@dataclass(frozen=True, slots=True)
class Plan:
    now: float
    placements: tuple[Placement, ...]
    preemptions: tuple[Preemption, ...]
    pending: tuple[Pending, ...]
    reservations: tuple[Reservation, ...]
    order: tuple[str, ...]  # work ids in the order they were considered
    # Queued work this plan did not consider (a pass bounded by `max_decisions`, see
    # core.schedule): it keeps whatever the last plan that considered it said.
    undecided: frozenset[str] = frozenset()

    @property
    def deferrals(self) -> tuple[Pending, ...]:
        """Work held back until its start window opens or, by temporal shifting, until
        a cleaner window (``retry_at`` is when to look again in both cases)."""
        return tuple(p for p in self.pending if p.code in ("window", "deferred"))

    def placements_for(self, work_id: str) -> tuple[Placement, ...]:
        return tuple(p for p in self.placements if p.work_id == work_id)

    def pending_for(self, work_id: str) -> Pending | None:
        return next((p for p in self.pending if p.work_id == work_id), None)

    def explain(self, work_id: str) -> list[str]:
        lines = [p.explain() for p in self.placements_for(work_id)]
        pending = self.pending_for(work_id)
        if pending is not None:
            lines.append(pending.message)
        return lines
