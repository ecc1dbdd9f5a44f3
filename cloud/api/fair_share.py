"""Each tenant's standing in fair sharing for `GET /v1/tenants` (`greenfed tenants`):
its cohort path, what it holds, its decayed past usage, its dominant share and its rank
among its siblings, by the scheduler's own rule (cloud/scheduler/fair_share.py) over
the cohort tree of the settings and the usage the scheduling leader last wrote."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from aiohttp import web

from cloud.app_keys import REGISTRY, SETTINGS, STORE
from cloud.loop.fair_share import scheduler_cohorts
from cloud.scheduler import KINDS, Tenant
from cloud.scheduler.fair_share import DecayedUsage, ShareBook, kind_usage, standings
from cloud.scheduler.hierarchy import tree_of
from cloud.store import TenantRecord
from cloud.work.convert import tenant_from_record
from cloud.work.views import FairShareView
from shared.messages import AcceleratorKind


def _capacity(app: web.Application) -> list[int]:
    """Accelerators of each kind in the fleet (an unmanaged tenant's share is over it)."""
    counts = [0] * len(KINDS)
    registry = app.get(REGISTRY)
    if registry is not None:
        for record in registry.nodes():
            for accelerator in record.status.accelerators:
                counts[KINDS.index(accelerator.kind)] += (
                    accelerator.compute_units if accelerator.kind == "cpu" else 1
                )
    return [max(count, 1) for count in counts]


def _per_kind(values: Sequence[float]) -> dict[AcceleratorKind, float]:
    return {kind: value for kind, value in zip(KINDS, values, strict=True) if value}


async def fair_share_views(
    app: web.Application, records: Sequence[TenantRecord], now: float | None = None
) -> dict[str, FairShareView]:
    """Tenant name -> its standing."""
    settings = app[SETTINGS].scheduling
    store = app[STORE]
    now = time.time() if now is None else now
    rows = await store.fair_share_usage()
    held_by_id = await store.held_by_tenant()
    tenants: dict[str, Tenant] = {}
    for record in records:
        tenant = tenant_from_record(record)
        if tenant is not None:
            tenants[tenant.name] = tenant
    cohorts = {cohort.name: cohort for cohort in scheduler_cohorts(settings.cohorts)}
    tree = tree_of(tenants, cohorts)
    nominal: Mapping[str, list[int]] = {
        name: [tenant.nominal.get(kind, 0) for kind in KINDS] for name, tenant in tenants.items()
    }
    half_life_s = settings.fair_share_half_life_s
    past = {
        name: DecayedUsage(kind_usage(row.accelerator_seconds), row.as_of).average(now, half_life_s)
        for name, row in rows.items()
    }
    held = {
        record.name: [held_by_id.get(record.tenant_id, {}).get(kind, 0) for kind in KINDS]
        for record in records
    }
    book = ShareBook(tree, nominal, _capacity(app), past)
    found = standings(book, {record.name: record.cohort for record in records}, held)
    return {
        name: FairShareView(
            parent_path=standing.parent_path,
            dominant_share=round(standing.dominant_share, 6),
            held={kind: count for kind, count in zip(KINDS, held[name], strict=True) if count},
            decayed_usage={
                kind: round(value, 6)
                for kind, value in _per_kind(past.get(name, (0.0,) * len(KINDS))).items()
            },
            rank=standing.rank,
            siblings=standing.siblings,
        )
        for name, standing in found.items()
    }
