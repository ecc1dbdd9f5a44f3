"""What applying a spec by name would change in the work of that name (`greenfed apply`,
`greenfed diff`, `PUT /v1/jobs/{name}` and `PUT /v1/deployments/{name}`).

Pure: the stored spec and the applied one in, the changed top-level fields out, and
which of them the work cannot take without being placed again. Specs are compared as
the store keeps them (secrets encrypted: AES-SIV gives the same ciphertext for the same
value, so an unchanged secret compares equal).
"""

from __future__ import annotations

from typing import Final

import msgspec

from cloud.work.specs import DeploymentSpec, WorkSpec

# What a running deployment takes in place (as PATCH /v1/deployments/{id} does): the
# nodes switch model or batching between two batches; replicas and autoscale rescale.
IN_PLACE_DEPLOYMENT_FIELDS: Final = frozenset({"model_id", "batching", "replicas", "autoscale"})
# What a queued job (pending, never placed) takes, as PATCH /v1/jobs/{id} does
# (cloud/api/job_control.py): it runs nowhere yet, but what it waits for (depends_on), its
# name and how it runs are fixed once submitted.
QUEUED_JOB_FIELDS: Final = frozenset(
    {
        "priority",
        "workers",
        "accelerators_per_worker",
        "accelerator_kind",
        "memory_gib",
        "host_memory_gib",
        "cpus_per_worker",
        "estimated_duration_s",
        "deadline",
        "start_window",
    }
)
# Set by greenfed, never by a spec file: a model update's canary.
_MANAGED_FIELDS: Final = frozenset({"canary"})
_ENCODER: Final = msgspec.json.Encoder()


class FieldChange(msgspec.Struct, frozen=True, kw_only=True):
    """One top-level field of the spec: as stored, and as applied (JSON values)."""

    field: str
    before: msgspec.Raw
    after: msgspec.Raw


def spec_changes(stored: WorkSpec, applied: WorkSpec) -> tuple[FieldChange, ...]:
    """The fields `applied` changes, in declaration order. A deployment under autoscale
    (before and after) keeps its count: the autoscaler owns it, as an HPA owns a
    Deployment's replicas, so re-applying the file does not undo its last decision."""
    ignored = set(_MANAGED_FIELDS)
    if (
        isinstance(stored, DeploymentSpec)
        and isinstance(applied, DeploymentSpec)
        and stored.autoscale is not None
        and applied.autoscale is not None
    ):
        ignored.add("replicas")
    changes = []
    for name in type(applied).__struct_fields__:
        if name in ignored:
            continue
        before, after = getattr(stored, name), getattr(applied, name)
        if before != after:
            changes.append(
                FieldChange(
                    field=name,
                    before=msgspec.Raw(_ENCODER.encode(before)),
                    after=msgspec.Raw(_ENCODER.encode(after)),
                )
            )
    return tuple(changes)


def not_in_place(changes: tuple[FieldChange, ...], allowed: frozenset[str]) -> tuple[str, ...]:
    """The changed fields outside `allowed` (IN_PLACE_DEPLOYMENT_FIELDS for a deployment,
    QUEUED_JOB_FIELDS for a queued job): the work cannot take them as it is."""
    return tuple(c.field for c in changes if c.field not in allowed)


def applied_in_place(stored: DeploymentSpec, applied: DeploymentSpec) -> DeploymentSpec:
    """The applied deployment as it is kept once only in-place fields differ: under
    autoscale its current count (within the applied bounds), and its canary unless the
    model changed (a new model ends a rollout, as a PATCH of model_id alone does): as
    stored, which the API then brings to the kept count, or ends, as it does for a
    PATCH (cloud/api/work.py `rollout_after_update`). A canary in the applied spec is
    never taken: a rollout is asked with a PATCH, and is greenfed's to keep.
    Raises `FieldError` where the kept count breaks a rule of the applied spec."""
    replicas = applied.replicas
    scale = applied.autoscale
    if stored.autoscale is not None and scale is not None:
        replicas = max(scale.min_replicas, min(scale.max_replicas, stored.replicas))
    canary = stored.canary if stored.model_id == applied.model_id else None
    return msgspec.structs.replace(applied, replicas=replicas, canary=canary)
