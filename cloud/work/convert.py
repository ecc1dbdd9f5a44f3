"""From the REST contract (and the store's records) to the scheduler's types.

The scheduling loop calls `work_from_record` for every work item of a store snapshot
and `allocation_from_record` for every allocation; the API calls `check_convertible`
at submission, so a spec the scheduler would refuse is refused with a 422 instead of
failing a scheduling pass later.

The cluster's least isolation for training (`scheduling.min_isolation`) reaches a job
through `min_isolation`: a job gets the stronger of it and its own `isolation`.

Tenants: the scheduler identifies a tenant by a string. Pass the same string to every
function here (the loop uses the tenant's name, unique and never renamed, so that
explanations read "tenant acme uses 8 GPU"; `tenant_from_record` does the same).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Final

from cloud.scheduler.model import (
    KINDS,
    Allocation,
    GangShape,
    InferenceDeployment,
    LabelRequirement,
    StartWindow,
    Tenant,
    Toleration,
    TrainingJob,
    Work,
    rescue_marks,
    stronger_isolation,
)
from cloud.store.records import AllocationRecord, TenantRecord, WorkRecord
from cloud.work.specs import DeploymentSpec, TrainingJobSpec, WorkSpec, decode_spec
from shared.errors import FieldError, FieldPath
from shared.mig_profiles import slice_quotas
from shared.work_literals import IsolationRequirement, spec_kind_of


def _placement_fields(spec: WorkSpec) -> dict[str, object]:
    """Constraints training jobs and deployments share."""
    return {
        "memory_bytes": spec.memory_bytes,
        "host_memory_bytes": spec.host_memory_bytes,
        "accelerator_models": spec.accelerator_models,
        "mig_profile": spec.mig_profile,
        "preemptible": spec.preemptible,
        "sites": spec.sites,
        "node_selector": dict(spec.node_selector),
        "affinity": tuple(
            LabelRequirement(key=r.key, operator=r.operator, values=r.values) for r in spec.affinity
        ),
        "tolerations": tuple(Toleration(key=t.key, value=t.value) for t in spec.tolerations),
        "group": spec.group,
        "anti_affinity_groups": spec.anti_affinity_groups,
        "score_weights": dict(spec.score_weights),
    }


def training_job(
    spec: TrainingJobSpec,
    *,
    work_id: str,
    tenant: str,
    submitted_at: float,
    min_isolation: IsolationRequirement = "none",
) -> TrainingJob:
    """Raises FieldError when the scheduler refuses the job (e.g. an unknown score term)."""
    return TrainingJob(
        work_id=work_id,
        tenant=tenant,
        priority=spec.priority,
        submitted_at=submitted_at,
        workers=spec.workers,
        accelerators_per_worker=spec.accelerators_per_worker,
        alternative_shapes=tuple(
            GangShape(shape.workers, shape.accelerators_per_worker)
            for shape in spec.alternative_shapes
        ),
        accelerator_kind=spec.accelerator_kind,
        cpus_per_worker=spec.cpus_per_worker,
        duration_s=spec.estimated_duration_s,
        start_window=StartWindow.parse(spec.start_window) if spec.start_window else None,
        deadline=spec.deadline.timestamp() if spec.deadline is not None else None,
        max_delay_s=spec.max_delay_s,
        checkpoint_interval_s=spec.checkpoint_interval_s,
        topology=spec.topology,
        isolation=stronger_isolation(spec.isolation, min_isolation),
        image=spec.image,
        has_secrets=spec.has_secrets,
        **_placement_fields(spec),  # type: ignore[arg-type]
    )


def inference_deployment(
    spec: DeploymentSpec, *, work_id: str, tenant: str, submitted_at: float
) -> InferenceDeployment:
    """Raises FieldError when the scheduler refuses the deployment."""
    return InferenceDeployment(
        work_id=work_id,
        tenant=tenant,
        priority=spec.priority,
        submitted_at=submitted_at,
        replicas=spec.replicas,
        min_replicas=spec.min_replicas,
        accelerators_per_replica=spec.accelerators_per_replica,
        # MIG slices are GPUs: a mig_profile keeps a deployment to its GPU kind.
        accepted_kinds=("gpu",)
        if spec.mig_profile is not None and "gpu" in spec.accepted_kinds
        else spec.accepted_kinds,
        providers=spec.providers,
        latency_slo_ms=spec.latency_slo_ms,
        traffic_by_region=dict(spec.traffic_by_region),
        requests_per_s=expected_requests_per_s(spec),
        reference_ms_per_request=spec.reference_ms_per_request,
        max_replicas_per_node=spec.max_replicas_per_node,
        min_available=spec.min_available or 0,
        **_placement_fields(spec),  # type: ignore[arg-type]
    )


def to_work(
    spec: WorkSpec,
    *,
    work_id: str,
    tenant: str,
    submitted_at: float,
    min_isolation: IsolationRequirement = "none",
) -> Work:
    if isinstance(spec, TrainingJobSpec):
        return training_job(
            spec,
            work_id=work_id,
            tenant=tenant,
            submitted_at=submitted_at,
            min_isolation=min_isolation,
        )
    return inference_deployment(spec, work_id=work_id, tenant=tenant, submitted_at=submitted_at)


def expected_requests_per_s(spec: DeploymentSpec) -> float:
    """The load the scheduler sizes a deployment's replicas for: an autoscaler on a
    request-rate target keeps each replica near its target, whatever the peak."""
    scale = spec.autoscale
    expected = scale.expected_requests_per_s(spec.replicas) if scale is not None else None
    return spec.requests_per_s if expected is None else expected


def spec_of(record: WorkRecord) -> WorkSpec:
    """The record's spec as the API accepted it (raises msgspec errors for a corrupt one)."""
    return decode_spec(spec_kind_of(record.kind), record.spec)


def work_from_record(
    record: WorkRecord, *, tenant: str, min_isolation: IsolationRequirement = "none"
) -> Work:
    """The scheduler's view of stored work; the record's priority is authoritative."""
    spec = spec_of(record)
    work = to_work(
        spec,
        work_id=record.work_id,
        tenant=tenant,
        submitted_at=record.submitted_at,
        min_isolation=min_isolation,
    )
    if work.priority != record.priority:
        work = dataclasses.replace(work, priority=record.priority)
    return work


def allocation_from_record(
    record: AllocationRecord, work: Work, *, accelerator_model: str = ""
) -> Allocation:
    """A stored allocation as the scheduler sees it; `work` is its work, converted;
    `accelerator_model` the model of the node's devices it holds (which pool)."""
    checkpointing, deadline_bound = rescue_marks(work)
    return Allocation(
        allocation_id=record.allocation_id,
        work_id=record.work_id,
        work_kind=record.work_kind,
        tenant=work.tenant,
        priority=record.priority,
        preemptible=work.preemptible,
        node_id=record.node_id,
        accelerator_kind=record.accelerator_kind,
        accelerators=record.accelerators,
        host_memory_bytes=record.host_memory_bytes,
        started_at=record.started_at,
        expected_end=record.expected_end,
        borrowed=record.borrowed,
        group=work.group,
        anti_affinity_groups=work.anti_affinity_groups,
        accelerator_model=accelerator_model,
        power_limit_w=record.power_limit_w,
        cpu_cores=record.cpu_cores,
        min_available=work.min_available if isinstance(work, InferenceDeployment) else 0,
        checkpointing=checkpointing,
        deadline_bound=deadline_bound,
    )


def tenant_from_record(record: TenantRecord) -> Tenant | None:
    """The scheduler's tenant, named by the tenant's name (see the module docstring).

    None for a tenant with neither quotas nor a cohort: the scheduler treats tenants it
    has no record of as unmanaged (no quota applies), whereas a record with no quotas
    would give it a nominal quota of zero for every kind.
    """
    if not record.accelerators_managed:
        return None
    return Tenant(
        name=record.name,
        cohort=record.cohort,
        nominal={kind: record.quotas[kind] for kind in KINDS if kind in record.quotas},
        mig_nominal=slice_quotas(record.quotas.items()),
        borrowing_limit=dict(record.borrowing_limit),
        lending_limit=dict(record.lending_limit),
    )


def running_limits(records: Iterable[TenantRecord]) -> dict[str, int]:
    """Tenant name -> its `max_running`, for the tenants that have one (the snapshot's
    `running_limits`: a cap on work items, apart from accelerator quotas)."""
    return {r.name: r.max_running for r in records if r.max_running is not None}


# The scheduler's fields that the spec spells otherwise (in its units); the rest match.
_SPEC_FIELDS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "memory_bytes": "memory_gib",
        "host_memory_bytes": "host_memory_gib",
        "duration_s": "estimated_duration_s",
        "has_secrets": "secret_env",
    }
)


def spec_field_name(scheduler_field: str) -> str:
    """The spec's name of a field of the scheduler's types (refusals name those)."""
    return _SPEC_FIELDS.get(scheduler_field, scheduler_field)


def spec_field(spec: WorkSpec, scheduler_field: str) -> FieldPath:
    """The path of the spec's field for a field of the scheduler's type; empty (the
    spec as a whole) where the spec has none."""
    name = spec_field_name(scheduler_field)
    return (name,) if name in spec.__struct_fields__ else ()


def check_convertible(spec: WorkSpec) -> FieldError | None:
    """None when the scheduler accepts the spec, else why not (for a 422). The error's
    path names a field of the scheduler's type (`score_weights`, `duration_s`), which is
    often, not always, the spec's field of that name; an empty path: the value as a whole
    (e.g. a start window that never opens)."""
    try:
        to_work(spec, work_id="submitted", tenant="tenant", submitted_at=0.0)
    except FieldError as error:
        return error
    except ValueError as error:  # a check not yet typed still answers 422, never 500
        return FieldError((), str(error))
    return None
