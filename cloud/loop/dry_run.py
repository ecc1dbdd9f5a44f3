"""Where a spec would go now, decided and stored nowhere (`--dry-run` of submit and
apply: `POST /v1/jobs/dry-run`, `POST /v1/deployments/dry-run`).

The scheduler core is pure, so a dry run is an ordinary pass over the current store
and registry with the new work added to the queue (as the newest submission of its
tenant: behind what is already queued at its priority), of which only that work's
part of the plan is read. Nothing of the plan is committed, published or audited.

It sees what a pass sees of fair share, the configured cohort tree (whose quotas a
pass enforces) and each tenant's decayed past usage, and advances no accumulator:
without them a dry run said "Placed" of work that a cohort's quota holds back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING, Final

from cloud.fleet.registry import NodeRecord
from cloud.loop.fair_share import FairShareLedger, FairShareStore
from cloud.loop.inputs import build_inputs
from cloud.scheduler import Policy, schedule
from cloud.store import StoreSnapshot, WorkRecord
from cloud.work.explain import explanations_for_plan
from cloud.work.explanation import Explanation, decode_explanation
from cloud.work.specs import WorkSpec, encode_spec
from shared.settings import SchedulingSettings
from shared.work_literals import WorkKind

if TYPE_CHECKING:
    from cloud.loop.loop import SchedulingLoop

# Sorts after every real id (ids begin with their time), so it is the newest work.
DRY_RUN_ID: Final = "7ZZZZZZZZZZZZZZZZZZZZZZZZZ"


async def dry_run_fair_share(
    store: FairShareStore, settings: SchedulingSettings, scheduler: SchedulingLoop | None
) -> FairShareLedger:
    """The fair share a pass would see: the ledger of this replica's passes while it
    leads; elsewhere (an API replica, one that does not lead) one that starts from what
    the leader last wrote, as a new leader's first pass does. That is at most
    `PERSIST_INTERVAL_S` behind, against a half-life of days."""
    ledger = scheduler.leading_fair_share() if scheduler is not None else None
    if ledger is None:
        ledger = FairShareLedger(settings.fair_share_half_life_s, settings.cohorts)
        await ledger.load(store)
    return ledger


def dry_run_explanation(
    now: float,
    nodes: Iterable[NodeRecord],
    store: StoreSnapshot,
    *,
    tenant_id: str,
    kind: WorkKind,
    spec: WorkSpec,
    policy: Policy,
    fair_share: FairShareLedger,
) -> Explanation | None:
    """What a pass would decide now about `spec`, submitted by the tenant at `now`; None
    when the pass would not look at it (its spec cannot be scheduled: checked before).
    `fair_share`: from `dry_run_fair_share`."""
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
    inputs = fair_share.preview(build_inputs(now, nodes, with_it), now)
    plan = schedule(inputs.snapshot, policy)
    document = explanations_for_plan(plan, (DRY_RUN_ID,)).get(DRY_RUN_ID)
    return None if document is None else decode_explanation(document)
