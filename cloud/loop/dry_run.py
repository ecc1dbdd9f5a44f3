"""Where a spec would go now, decided and stored nowhere (`--dry-run` of submit and
apply: `POST /v1/jobs/dry-run`, `POST /v1/deployments/dry-run`).

The scheduler core is pure, so a dry run is an ordinary pass over the current store
and registry with the new work added to the queue (as the newest submission of its
tenant: behind what is already queued at its priority), of which only that work's
part of the plan is read. Nothing of the plan is committed, published or audited.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Final

from cloud.fleet.registry import NodeRecord
from cloud.loop.inputs import build_inputs
from cloud.scheduler import Policy, schedule
from cloud.store import StoreSnapshot, WorkRecord
from cloud.work.explain import explanations_for_plan
from cloud.work.explanation import Explanation, decode_explanation
from cloud.work.specs import WorkSpec, encode_spec
from shared.work_literals import WorkKind

# Sorts after every real id (ids begin with their time), so it is the newest work.
DRY_RUN_ID: Final = "7ZZZZZZZZZZZZZZZZZZZZZZZZZ"


def dry_run_explanation(
    now: float,
    nodes: Iterable[NodeRecord],
    store: StoreSnapshot,
    *,
    tenant_id: str,
    kind: WorkKind,
    spec: WorkSpec,
    policy: Policy,
) -> Explanation | None:
    """What a pass would decide now about `spec`, submitted by the tenant at `now`; None
    when the pass would not look at it (its spec cannot be scheduled: checked before)."""
    record = WorkRecord(
        work_id=DRY_RUN_ID,
        tenant_id=tenant_id,
        kind=kind,
        spec=encode_spec(spec),
        priority=spec.priority,
        state="pending",
        state_reason=None,
        attempts=0,
        submitted_at=now,
        updated_at=now,
        idempotency_key=None,
        version=1,
    )
    with_it = dataclasses.replace(store, work=(*store.work, record))
    inputs = build_inputs(now, nodes, with_it)
    plan = schedule(inputs.snapshot, policy)
    document = explanations_for_plan(plan, (DRY_RUN_ID,)).get(DRY_RUN_ID)
    return None if document is None else decode_explanation(document)
