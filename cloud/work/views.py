"""REST representations of work (jobs and deployments), tenants and events.

The CLI decodes them too, so this module imports nothing of the database stack."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Literal

import msgspec

from cloud.usage.views import WorkUsage
from cloud.work.array_views import JobArrayView
from cloud.work.explanation import Explanation
from cloud.work.specs import DeploymentSpec, Name, TrainingJobSpec
from shared.clock import utc_from_epoch
from shared.errors import worded_pattern
from shared.messages import (
    TRAINING_RUN_LIVE_STATES,
    AcceleratorKind,
    DeploymentSample,
    ReplicaSample,
    TrainingRunState,
)
from shared.mig_profiles import QUOTA_RESOURCE_PATTERN
from shared.printable import printable
from shared.work_literals import AllocationState, DependencyCondition, PriorityClass, WorkState

if TYPE_CHECKING:  # the CLI decodes these types without the database stack
    from cloud.fleet.registry import NodeRegistry
    from cloud.store import AllocationRecord, EventRecord, TenantRecord


class AllocationView(msgspec.Struct, frozen=True, kw_only=True):
    member: int  # worker rank (jobs) or replica number (deployments)
    node_id: str
    accelerator_kind: AcceleratorKind
    accelerators: int
    accelerator_ids: tuple[str, ...]
    host_memory_bytes: int
    state: AllocationState  # assigned: sent to the node; running: the node reported it
    started_at: datetime  # when the placement was committed
    expected_end: datetime | None
    borrowed: bool
    # Carbon-aware power capping: each of its devices held to this many watts for the
    # run (the run is slower and uses less energy); null: the devices' default limit.
    power_limit_w: float | None = None
    cpu_cores: int = 0  # CPU cores it holds on the node beside its devices (cpus_per_worker)
    # What its node last reported of that limit (training): the limit it holds the
    # devices to (null: their default, or nothing reported yet), and why it does not
    # hold the asked one ("": it does, or nothing was asked). NVML lets only root set
    # power limits, so an asked limit is not always a held one.
    power_limit_held_w: float | None = None
    power_limit_note: str = ""
    power_limit_reported: bool = False  # the node has reported this worker's limit
    # What its node last reported of the worker while it is live (training): `starting`
    # or `running` (null: nothing reported yet), and what it said of it ("": nothing);
    # a cluster's node says why the job waits in the cluster's own queue.
    worker_state: TrainingRunState | None = None
    worker_reason: str = ""


def allocation_view(record: AllocationRecord) -> AllocationView:
    return AllocationView(
        member=record.member_index,
        node_id=record.node_id,
        accelerator_kind=record.accelerator_kind,
        accelerators=record.accelerators,
        accelerator_ids=record.accelerator_ids,
        host_memory_bytes=record.host_memory_bytes,
        state=record.state,
        started_at=utc_from_epoch(record.started_at),
        expected_end=None if record.expected_end is None else utc_from_epoch(record.expected_end),
        borrowed=record.borrowed,
        power_limit_w=record.power_limit_w,
        cpu_cores=record.cpu_cores,
    )


class WorkFields(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    name: str
    tenant: str
    priority: PriorityClass
    state: WorkState
    reason: str | None  # why it waits, failed or was cancelled
    attempts: int  # placements so far
    version: int  # grows with every change
    submitted_at: datetime
    updated_at: datetime


class JobSummary(WorkFields, frozen=True, kw_only=True):
    kind: Literal["training"] = "training"
    workers: int
    accelerators_per_worker: int
    accelerator_kind: AcceleratorKind
    failures: int = 0  # its own failures so far, each retried by its max_retries
    retry_at: datetime | None = None  # queued after a failure: not placed before then
    # Pending, out of the queue until a person lifts it: "held" (release) or
    # "suspended" (resume); null: queued as usual (cloud/api/job_control.py).
    hold: Literal["held", "suspended"] | None = None
    # A task of a job array: the array's id and its index (null: not a task). The array
    # itself is shown by GET /v1/jobs/{array id} (docs/rest.md#job-arrays).
    array_id: str | None = None
    array_index: int | None = None


class DeploymentSummary(WorkFields, frozen=True, kw_only=True):
    kind: Literal["deployment"] = "deployment"
    model_id: str | None
    replicas: int
    accelerators_per_replica: int


class DependencyView(msgspec.Struct, frozen=True, kw_only=True):
    """One link of a dependency chain, seen from the work shown: a job it waits for
    (`waits_for`), or work that waits for it (`needed_by`)."""

    id: str  # the other work's id
    kind: Literal["training", "deployment"]
    name: str
    state: WorkState  # the other work's state
    condition: DependencyCondition  # how the job waited for must end
    # holds: that job ended so; waits: not yet; never: it ended otherwise (the work
    # that waited was cancelled)
    verdict: Literal["holds", "waits", "never"]


class JobView(JobSummary, frozen=True, kw_only=True):
    idempotency_key: str | None
    nodes: tuple[str, ...]  # where it runs, in member order (empty unless placed)
    allocations: tuple[AllocationView, ...]
    # Energy, emissions, cost and emissions avoided so far (None: nothing metered yet).
    usage: WorkUsage | None = None
    spec: TrainingJobSpec
    waits_for: tuple[DependencyView, ...] = ()  # its depends_on, with those jobs' states
    needed_by: tuple[DependencyView, ...] = ()  # work whose depends_on names this job
    array: JobArrayView | None = None  # the view of a job array: its summary and tasks


class ServingView(msgspec.Struct, frozen=True, kw_only=True):
    """A replica's latest serving figures (one telemetry interval): its own, or where
    its agent predates 1.13, those of the deployment's replicas on its node together."""

    interval_s: float
    requests_per_s: float
    errors: int
    rejected: int  # refused with 429: the queue was full
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    latency_p99_ms: float | None
    mean_batch_size: float | None


class ReplicaView(msgspec.Struct, frozen=True, kw_only=True):
    """One replica as its node last reported it."""

    replica: int
    node_id: str
    # assigned: sent to the node, not reported yet; then the agent's word.
    state: Literal["assigned", "starting", "ready", "failed"]
    provider: str | None  # the ONNX Runtime execution provider it really runs on
    endpoint: str | None  # POST inference requests here (ready replicas)
    reason: str  # why it failed, or a provider fallback
    model_sha256: str | None  # the model file it serves
    serving: ServingView | None = None  # None: no telemetry from the node yet


# The events a scaling decision and a model rollout write (cloud/loop/scaling.py).
SCALED_EVENT = "work.scaled"
ROLLOUT_EVENT = "work.rollout"


class ScalingView(msgspec.Struct, frozen=True, kw_only=True):
    """A deployment's latest scaling decision (its `work.scaled` event)."""

    at: datetime
    from_replicas: int
    to_replicas: int
    reason: str


class DeploymentView(DeploymentSummary, frozen=True, kw_only=True):
    idempotency_key: str | None
    nodes: tuple[str, ...]
    allocations: tuple[AllocationView, ...]
    replica_states: tuple[ReplicaView, ...] = ()
    spec: DeploymentSpec
    # Energy, emissions, cost and emissions avoided so far (None: nothing metered yet).
    usage: WorkUsage | None = None
    last_scaling: ScalingView | None = None  # autoscaled deployments
    waits_for: tuple[DependencyView, ...] = ()  # its depends_on, with those jobs' states


class JobList(msgspec.Struct, frozen=True, kw_only=True):
    items: tuple[JobSummary, ...]
    count: int
    next_cursor: str | None  # pass as ?cursor= for the next (older) page


class DeploymentList(msgspec.Struct, frozen=True, kw_only=True):
    items: tuple[DeploymentSummary, ...]
    count: int
    next_cursor: str | None


class ExplainView(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    kind: Literal["training", "deployment"]
    state: WorkState
    reason: str | None
    explained_at: datetime | None  # when the scheduler last decided about it
    message: str  # one line for a person, also when there is no explanation yet
    explanation: Explanation | None


# ---- tenants ---------------------------------------------------------------------------

KindCounts = Annotated[
    dict[AcceleratorKind, Annotated[int, msgspec.Meta(ge=0, le=1_000_000)]],
    msgspec.Meta(description="Accelerator count per kind (gpu, npu, cpu)."),
]
Quotas = Annotated[
    dict[
        Annotated[
            str,
            msgspec.Meta(
                pattern=worded_pattern(
                    QUOTA_RESOURCE_PATTERN,
                    "must be gpu, npu, cpu or mig-<MIG profile>, e.g. mig-1g.10gb",
                )
            ),
        ],
        Annotated[int, msgspec.Meta(ge=0, le=1_000_000)],
    ],
    msgspec.Meta(
        description=(
            "Accelerator count per kind (gpu, npu, cpu), and MIG slices per profile "
            "(mig-1g.10gb): a tenant's slices of a profile listed here count against it, "
            "never against its gpu quota."
        )
    ),
]
Cap = Annotated[int, msgspec.Meta(ge=0, le=1_000_000)]
Priorities = Annotated[tuple[PriorityClass, ...], msgspec.Meta(min_length=1, max_length=3)]
BorrowingLimit = Annotated[
    KindCounts, msgspec.Meta(description="At most this many borrowed from the cohort, per kind.")
]
MaxRunning = Annotated[
    Cap,
    msgspec.Meta(description="At most this many of its jobs and deployments placed at once."),
]
MaxQueued = Annotated[
    Cap, msgspec.Meta(description="At most this many pending; a submission beyond is a 429.")
]


class TenantCreate(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: Annotated[
        str,
        msgspec.Meta(
            pattern=worded_pattern(
                r"^[a-z0-9][a-z0-9._-]{0,62}$(?!\n)",
                "must be lower-case letters, digits, '.', '_' and '-', starting with a letter "
                "or digit; at most 63 characters",
            ),
            description="Lower-case letters, digits, '.', '_' and '-'.",
        ),
    ]
    quotas: Quotas = {}
    borrowing_limit: BorrowingLimit = {}
    cohort: Name | None = None
    allowed_priorities: Priorities = ("p0", "p1", "p2")
    admin: bool = False
    max_running: MaxRunning | None = None
    max_queued: MaxQueued | None = None
    # Of its unused quota, what its cohort's other members may borrow; {}: all of it.
    lending_limit: BorrowingLimit = {}


class TenantUpdate(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`PATCH /v1/tenants/{tenant}`: a field left out stays as it is; null removes a
    cohort or a cap. The scheduler applies the change from its next pass."""

    quotas: Quotas | msgspec.UnsetType = msgspec.UNSET
    borrowing_limit: BorrowingLimit | msgspec.UnsetType = msgspec.UNSET
    cohort: Name | msgspec.UnsetType | None = msgspec.UNSET
    allowed_priorities: Priorities | msgspec.UnsetType = msgspec.UNSET
    max_running: MaxRunning | msgspec.UnsetType | None = msgspec.UNSET
    max_queued: MaxQueued | msgspec.UnsetType | None = msgspec.UNSET
    lending_limit: BorrowingLimit | msgspec.UnsetType = msgspec.UNSET


class TenantView(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    name: str
    quotas: dict[str, int]  # per kind, and per MIG profile ("mig-1g.10gb")
    borrowing_limit: dict[AcceleratorKind, int]
    cohort: str | None
    allowed_priorities: tuple[PriorityClass, ...]
    admin: bool
    created_at: datetime
    max_running: int | None = None  # null: no cap
    max_queued: int | None = None  # null: no cap
    # No quota of any kind applies: no accelerator quotas (none set, no cohort), no
    # max_running, no max_queued.
    unlimited: bool = False
    # Of its unused quota, what its cohort's other members may borrow; {}: all of it.
    lending_limit: dict[AcceleratorKind, int] = {}
    # Its place in fair sharing (`GET /v1/tenants` only; docs/scheduling.md).
    fair_share: FairShareView | None = None


class FairShareView(msgspec.Struct, frozen=True, kw_only=True):
    """A tenant's standing in fair sharing, as the scheduler would order it now."""

    parent_path: tuple[str, ...]  # its cohorts, the top one first; [] without a cohort
    dominant_share: float  # (held + decayed usage) / nominal, the largest over kinds
    held: dict[AcceleratorKind, int]  # accelerators its work holds now
    decayed_usage: dict[AcceleratorKind, float]  # its decayed past usage, in accelerators
    rank: int  # among its siblings (same parent cohort), 1 = served first
    siblings: int  # how many, itself included


class TenantCreated(TenantView, frozen=True, kw_only=True):
    token: str  # shown once: greenfed keeps only its hash


class TenantList(msgspec.Struct, frozen=True, kw_only=True):
    items: tuple[TenantView, ...]
    count: int


def tenant_fields(record: TenantRecord) -> dict[str, object]:
    return {
        "id": record.tenant_id,
        "name": record.name,
        "quotas": dict(record.quotas),
        "borrowing_limit": dict(record.borrowing_limit),
        "cohort": record.cohort,
        "allowed_priorities": record.allowed_priorities,
        "admin": record.admin,
        "created_at": utc_from_epoch(record.created_at),
        "max_running": record.max_running,
        "max_queued": record.max_queued,
        "lending_limit": dict(record.lending_limit),
        "unlimited": record.unlimited,
    }


def tenant_view(record: TenantRecord) -> TenantView:
    return TenantView(**tenant_fields(record))  # type: ignore[arg-type]


# ---- events ----------------------------------------------------------------------------


class EventView(msgspec.Struct, frozen=True, kw_only=True):
    """The `data` of one server-sent event; its SSE `id` is `seq`, its `event` is `kind`."""

    seq: int
    kind: str  # "work.state", or what the scheduler and agents record
    work_id: str | None
    at: datetime
    payload: msgspec.Raw  # for work.state: cloud.store.WorkStateChanged
    tenant: str | None = None  # whose work it is, by name (the admin sees every tenant's)


class _ScaledPayload(msgspec.Struct, frozen=True):
    from_replicas: int
    to_replicas: int
    reason: str


def scaling_view(event: EventRecord) -> ScalingView | None:
    """A `work.scaled` event as the deployment shows it (None: not readable)."""
    try:
        payload = msgspec.json.decode(event.payload, type=_ScaledPayload)
    except msgspec.DecodeError:
        return None
    return ScalingView(
        at=utc_from_epoch(event.at),
        from_replicas=payload.from_replicas,
        to_replicas=payload.to_replicas,
        reason=payload.reason,
    )


def worker_views(
    job_id: str,
    attempt: int,
    allocations: Sequence[AllocationView],
    registry: NodeRegistry,
) -> tuple[AllocationView, ...]:
    """Each training worker with what its node reports of it for the job's current
    attempt while it is live: its state and reason (a cluster's: why the job waits in
    its queue), and the power limit it holds its GPUs to (what a node says of another
    attempt is not read, as in cloud/loop/reports.py)."""
    views = []
    for view in allocations:
        node = registry.get(view.node_id)
        entry = node.training_report(job_id, attempt) if node is not None else None
        if entry is None or entry.state not in TRAINING_RUN_LIVE_STATES:
            views.append(view)
            continue
        views.append(
            msgspec.structs.replace(
                view,
                power_limit_held_w=entry.power_limit_w,
                power_limit_note=entry.power_limit_note,
                power_limit_reported=True,
                worker_state=entry.state,
                # A cluster's words come straight from its bridge, not through ingestion.
                worker_reason=printable(entry.reason),
            )
        )
    return tuple(views)


def replica_views(
    deployment_id: str, allocations: Sequence[AllocationRecord], registry: NodeRegistry
) -> tuple[ReplicaView, ...]:
    """Each allocated replica with what its node last reported of it."""
    views = []
    for allocation in allocations:
        node = registry.get(allocation.node_id)
        entry = node.replica_report(deployment_id, allocation.member_index) if node else None
        deployment = node.serving_sample(deployment_id) if node else None
        sample: DeploymentSample | ReplicaSample | None = deployment
        telemetry = node.telemetry if node is not None else None
        serving = None
        if deployment is not None and deployment.replicas:
            # An agent of 1.13 or later sends each replica's own figures: this one's,
            # not those of every replica of the deployment on its node together (none:
            # it served nothing in that interval).
            sample = next(
                (own for own in deployment.replicas if own.replica == allocation.member_index),
                None,
            )
        if telemetry is not None and sample is not None:
            serving = ServingView(
                interval_s=telemetry.interval_s,
                requests_per_s=sample.requests_per_s,
                errors=sample.errors,
                rejected=sample.rejected,
                latency_p50_ms=sample.latency_p50_ms,
                latency_p95_ms=sample.latency_p95_ms,
                latency_p99_ms=sample.latency_p99_ms,
                mean_batch_size=sample.mean_batch_size,
            )
        views.append(
            ReplicaView(
                replica=allocation.member_index,
                node_id=allocation.node_id,
                state="assigned" if entry is None else entry.state,
                provider=None if entry is None else entry.provider,
                endpoint=None if entry is None else entry.endpoint,
                reason="" if entry is None else entry.reason,
                model_sha256=None if entry is None else entry.model_sha256,
                serving=serving,
            )
        )
    return tuple(views)
