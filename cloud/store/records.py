"""What the store takes and returns: frozen value types, never database rows.

Specs and event payloads are JSON documents carried as `bytes`: the store keeps them
opaque (it checks only that they are JSON objects) and the REST layer decodes them
straight into its own msgspec types.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Final, TypeVar

import msgspec

from cloud.store.states import HoldKind
from shared.messages import AcceleratorKind
from shared.work_literals import (
    PRIORITY_CLASSES,
    AllocationState,
    DependencyCondition,
    PriorityClass,
    WorkKind,
    WorkState,
)

ACCELERATOR_KINDS: Final[tuple[AcceleratorKind, ...]] = ("gpu", "npu", "cpu")
_Key = TypeVar("_Key", bound=str)
# A tenant's quotas: per kind, and per MIG profile ("mig-1g.10gb": slices).
QuotaCounts = Mapping[AcceleratorKind, int] | Mapping[str, int]


def _frozen(mapping: Mapping[_Key, int]) -> Mapping[_Key, int]:
    return MappingProxyType(dict(mapping))


# ---- tenants ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class NewTenant:
    """What `Store.create_tenant` needs; quotas are accelerator counts per kind."""

    name: str
    # Per kind, and per MIG profile ("mig-1g.10gb": slices), shared/mig_profiles.py.
    quotas: QuotaCounts = field(default_factory=dict)
    borrowing_limit: Mapping[AcceleratorKind, int] = field(default_factory=dict)
    cohort: str | None = None
    allowed_priorities: tuple[PriorityClass, ...] = PRIORITY_CLASSES
    admin: bool = False
    max_running: int | None = None  # work items placed at once; None: no cap
    max_queued: int | None = None  # work items pending at once; None: no cap
    # Of its unused quota, what its cohort's other members may borrow; {}: all of it.
    lending_limit: Mapping[AcceleratorKind, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "quotas", MappingProxyType(dict(self.quotas)))
        object.__setattr__(self, "borrowing_limit", _frozen(self.borrowing_limit))
        object.__setattr__(self, "lending_limit", _frozen(self.lending_limit))


@dataclass(frozen=True, slots=True, kw_only=True)
class TenantRecord:
    tenant_id: str
    name: str
    quotas: QuotaCounts  # per kind, and per MIG profile ("mig-1g.10gb")
    borrowing_limit: Mapping[AcceleratorKind, int]
    cohort: str | None
    allowed_priorities: tuple[PriorityClass, ...]
    admin: bool
    created_at: float  # UTC epoch seconds
    max_running: int | None = None  # at most this many of its work items placed at once
    max_queued: int | None = None  # at most this many pending; a submission beyond is refused
    lending_limit: Mapping[AcceleratorKind, int] = field(default_factory=dict)  # {}: all

    def __post_init__(self) -> None:
        object.__setattr__(self, "quotas", MappingProxyType(dict(self.quotas)))
        object.__setattr__(self, "borrowing_limit", _frozen(self.borrowing_limit))
        object.__setattr__(self, "lending_limit", _frozen(self.lending_limit))

    @property
    def accelerators_managed(self) -> bool:
        """Accelerator quotas apply: some are set, or it borrows within a cohort (a kind
        not listed then has a quota of 0). Otherwise it may use any accelerators."""
        return bool(self.quotas) or self.cohort is not None

    @property
    def unlimited(self) -> bool:
        """No quota of any kind applies to it."""
        return (
            not self.accelerators_managed and self.max_running is None and (self.max_queued is None)
        )


class Keep(enum.Enum):
    """The value of a `TenantChanges` field that leaves the tenant's as it is."""

    KEEP = "keep"


KEEP: Final = Keep.KEEP


@dataclass(frozen=True, slots=True, kw_only=True)
class TenantChanges:
    """What `Store.update_tenant` changes; `KEEP` leaves a field as it is (None, where a
    field takes it, removes a cohort or a cap)."""

    quotas: QuotaCounts | Keep = KEEP
    borrowing_limit: Mapping[AcceleratorKind, int] | Keep = KEEP
    cohort: str | Keep | None = KEEP
    allowed_priorities: tuple[PriorityClass, ...] | Keep = KEEP
    max_running: int | Keep | None = KEEP
    max_queued: int | Keep | None = KEEP
    lending_limit: Mapping[AcceleratorKind, int] | Keep = KEEP

    def applied_to(self, record: TenantRecord) -> TenantRecord:
        changed = {
            name: value
            for name in (
                "quotas",
                "borrowing_limit",
                "cohort",
                "allowed_priorities",
                "max_running",
                "max_queued",
                "lending_limit",
            )
            if (value := getattr(self, name)) is not KEEP
        }
        return replace(record, **changed)


@dataclass(frozen=True, slots=True)
class CreatedTenant:
    tenant: TenantRecord
    token: str  # the only time the bearer token is visible; the store keeps its hash


# ---- work ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkRecord:
    work_id: str
    tenant_id: str
    kind: WorkKind
    spec: bytes  # the JSON document exactly as submitted
    priority: PriorityClass
    state: WorkState
    state_reason: str | None
    attempts: int  # placements so far: each pending -> scheduled adds one
    submitted_at: float  # UTC epoch seconds
    updated_at: float
    idempotency_key: str | None
    version: int  # bumped by every change; pass it back as `expected_version`
    failures: int = 0  # the job's own failures retried so far (its `max_retries` policy)
    not_before: float | None = None  # pending: not placed before this (a retry's backoff)
    # Pending work a person keeps out of the queue (cloud/store/job_control.py), and the
    # placements a person's requeue or suspend ended (not counted by `max_attempts`).
    hold: HoldKind | None = None
    requeues: int = 0
    # Submitted with an idempotency key: `submitted_spec_digest` of the spec as submitted,
    # which a retry is compared with (`spec` changes with a PATCH or an apply); None: no
    # key, or stored before store v25.
    submitted_spec_sha256: str | None = None


def submitted_spec_digest(document: bytes) -> str:
    """The SHA-256 (hex) of a spec document as a JSON value: keys sorted first, so the
    same spec encoded with its objects' keys in another order has the same digest."""
    canonical = msgspec.json.encode(msgspec.json.decode(document), order="sorted")
    return hashlib.sha256(canonical).hexdigest()


def submitted_as(record: WorkRecord, document: bytes) -> bool | None:
    """Whether `document` (a retry's spec, as the store would keep it) is the spec
    `record` was submitted with, where its digest can tell: None where it cannot, and the
    retry is compared with the spec as stored (stored before store v25, or a spec still
    as submitted, which a decoded comparison matches across an upgrade that added
    fields to specs: their bytes differ then, the specs do not)."""
    submitted = record.submitted_spec_sha256
    if submitted is None:
        return None
    if submitted_spec_digest(document) == submitted:
        return True
    try:
        unchanged = submitted_spec_digest(record.spec) == submitted
    except msgspec.DecodeError:
        return False
    # Changed since (a PATCH, an apply): only the digest knows what was submitted.
    return None if unchanged else False


@dataclass(frozen=True, slots=True)
class WorkExplanation:
    """The scheduler's latest explanation of one work item (`PassWrite.explanations`)."""

    work: WorkRecord
    explanation: bytes | None  # a JSON object; None: the scheduler has not looked at it yet
    explained_at: float | None  # UTC epoch seconds


@dataclass(frozen=True, slots=True)
class SubmitResult:
    work: WorkRecord
    created: bool  # False: an earlier submission with the same idempotency key


@dataclass(frozen=True, slots=True)
class WorkPage:
    items: tuple[WorkRecord, ...]
    next_cursor: str | None  # pass as `cursor` for the next page; None: this was the last


# ---- allocations and plans -------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class NewAllocation:
    """One gang member or replica of a placement, on one node."""

    member_index: int
    node_id: str
    accelerator_kind: AcceleratorKind
    accelerators: int
    accelerator_ids: tuple[str, ...] = ()  # device indices or UUIDs; empty: count only
    host_memory_bytes: int = 0
    expected_end: float | None = None  # None: long-running (inference replicas)
    borrowed: bool = False
    power_limit_w: float | None = None  # each device held to this (power capping); None: default
    cpu_cores: int = 0  # CPU cores held beside a GPU/NPU member's devices (cpus_per_worker)

    def __post_init__(self) -> None:
        if self.member_index < 0:
            raise ValueError("member_index must be >= 0")
        if self.accelerators < 1:
            raise ValueError("accelerators must be >= 1")
        if self.accelerator_ids and len(self.accelerator_ids) != self.accelerators:
            raise ValueError(
                f"{len(self.accelerator_ids)} accelerator ids for {self.accelerators} accelerators"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class AllocationRecord:
    work_id: str
    member_index: int
    node_id: str
    accelerator_kind: AcceleratorKind
    accelerators: int
    accelerator_ids: tuple[str, ...]
    host_memory_bytes: int
    started_at: float  # when the plan that made it committed
    expected_end: float | None
    borrowed: bool
    state: AllocationState
    # From the work it belongs to, so a snapshot needs no second lookup.
    tenant_id: str
    work_kind: WorkKind
    priority: PriorityClass
    power_limit_w: float | None = None  # each device held to this (power capping); None: default
    cpu_cores: int = 0  # CPU cores held beside a GPU/NPU member's devices (cpus_per_worker)

    @property
    def allocation_id(self) -> str:
        return f"{self.work_id}/{self.member_index}"


@dataclass(frozen=True, slots=True, kw_only=True)
class PlacementWrite:
    """Work's complete set of allocations; replaces whatever it held before.

    Pending work becomes scheduled (one more attempt); scheduled or running work keeps
    its state (a deployment that grows or moves replicas).
    """

    work_id: str
    allocations: tuple[NewAllocation, ...]
    reason: str | None = None
    expected_version: int | None = None

    def __post_init__(self) -> None:
        if not self.allocations:
            raise ValueError(f"placement of {self.work_id} has no allocations")
        members = [allocation.member_index for allocation in self.allocations]
        if len(set(members)) != len(members):
            raise ValueError(f"placement of {self.work_id} repeats a member index")


@dataclass(frozen=True, slots=True, kw_only=True)
class EvictionWrite:
    """Preempted or lost work: back to pending, or failed once its attempts are used up.

    ``retry_not_before`` set: the job failed by itself and its retry policy runs it
    again, not before then; counted in `WorkRecord.failures`, not in the attempts
    that bound infrastructure losses."""

    work_id: str
    reason: str
    expected_version: int | None = None
    retry_not_before: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class StateWrite:
    work_id: str
    to_state: WorkState
    reason: str | None = None
    expected_version: int | None = None
    actor: str | None = None  # the tenant who asked for it (a cancellation), by name


@dataclass(frozen=True, slots=True, kw_only=True)
class NewEvent:
    kind: str  # e.g. "work.explained"; the store itself writes "work.state"
    payload: bytes  # a JSON object
    tenant_id: str | None = None
    work_id: str | None = None
    event_id: str | None = None  # an agent's event id: a second copy is dropped


@dataclass(frozen=True, slots=True, kw_only=True)
class PassWrite:
    """One scheduling pass, committed by `Store.commit_pass` as one transaction.

    Applied in this order: evictions, state changes, placements, pending reasons, events.
    """

    placements: tuple[PlacementWrite, ...] = ()
    evictions: tuple[EvictionWrite, ...] = ()
    state_changes: tuple[StateWrite, ...] = ()
    # Why work stays pending ("0/12 nodes: 8 no GPU, 4 over quota"); stored, no event.
    pending_reasons: Mapping[str, str] = field(default_factory=dict)
    events: tuple[NewEvent, ...] = ()
    # The scheduler's latest explanation per work id (a JSON object: why pending, or the
    # score breakdown of its placement); replaces the previous one, no event, no version.
    explanations: Mapping[str, bytes] = field(default_factory=dict)
    # Draining nodes whose drain waits, and why (cloud/loop/drain.py): replaces what is
    # stored, for the replicas that do not lead; None leaves it as it is.
    drain_waiting: Mapping[str, tuple[str, ...]] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "pending_reasons", MappingProxyType(dict(self.pending_reasons)))
        object.__setattr__(self, "explanations", MappingProxyType(dict(self.explanations)))
        if self.drain_waiting is not None:
            object.__setattr__(self, "drain_waiting", MappingProxyType(dict(self.drain_waiting)))


@dataclass(frozen=True, slots=True)
class CommitResult:
    """What changed: the work whose state or allocations changed, and the nodes whose
    desired state changed with their new generations (publish these)."""

    work: tuple[WorkRecord, ...]
    node_generations: Mapping[str, int]
    duplicate: bool = False  # an agent event already applied: nothing was changed


# ---- events and desired state ----------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class EventRecord:
    seq: int  # strictly increasing in commit order: the SSE id for Last-Event-ID
    tenant_id: str | None
    work_id: str | None
    kind: str
    payload: bytes
    at: float
    event_id: str | None


@dataclass(frozen=True, slots=True)
class NodeDesired:
    """A node's desired state: everything allocated to it, and its generation."""

    node_id: str
    generation: int  # 0: never had anything allocated
    allocations: tuple[AllocationRecord, ...]


@dataclass(frozen=True, slots=True)
class StoreSnapshot:
    """One consistent read of what the scheduler needs, taken in a single transaction."""

    tenants: tuple[TenantRecord, ...]
    work: tuple[WorkRecord, ...]  # every non-terminal item, oldest first
    allocations: tuple[AllocationRecord, ...]
    node_generations: Mapping[str, int]
    # What pending work waits for (its depends_on), with each job's state as of this read.
    dependencies: tuple[DependencyRecord, ...] = ()


# ---- dependencies between work ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NewDependency:
    """Work being submitted waits for `job_id` (the tenant's training job) to have ended
    as `condition` says."""

    job_id: str
    condition: DependencyCondition


@dataclass(frozen=True, slots=True, kw_only=True)
class DependencyRecord:
    """`work_id` waits for `job_id`; `job_state` is that job's state when read."""

    work_id: str
    position: int  # its index in the dependent's depends_on
    job_id: str
    condition: DependencyCondition
    job_state: WorkState
    job_reason: str | None  # why the job is in that state (failed: its error)


@dataclass(frozen=True, slots=True)
class WorkLinks:
    """One work item's dependencies both ways: what it waits for, with those jobs, and
    what waits for it, with that work."""

    needs: tuple[tuple[DependencyRecord, WorkRecord], ...]
    needed_by: tuple[tuple[DependencyRecord, WorkRecord], ...]


# ---- models ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ModelTensor:
    """One input or output of an ONNX model: dims are sizes, symbolic names or None."""

    name: str
    dtype: str  # numpy's name: float32, int64, ...
    shape: tuple[int | str | None, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class NewModel:
    name: str
    sha256: str
    size_bytes: int
    opset: int
    inputs: tuple[ModelTensor, ...]
    outputs: tuple[ModelTensor, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelRecord:
    model_id: str
    tenant_id: str
    name: str
    sha256: str  # of the file; it is stored content-addressed under this
    size_bytes: int
    opset: int
    inputs: tuple[ModelTensor, ...]
    outputs: tuple[ModelTensor, ...]
    created_at: float


@dataclass(frozen=True, slots=True)
class ModelPage:
    items: tuple[ModelRecord, ...]
    next_cursor: str | None
