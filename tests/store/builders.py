"""Small builders for store tests."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from cloud.store import CreatedTenant, NewAllocation, NewTenant, PlacementWrite, Store, SubmitResult
from shared.messages import AcceleratorKind
from shared.work_literals import PriorityClass, WorkKind


async def make_tenant(
    store: Store,
    name: str,
    *,
    quotas: Mapping[AcceleratorKind, int] | None = None,
    cohort: str | None = None,
    admin: bool = False,
) -> CreatedTenant:
    return await store.create_tenant(
        NewTenant(name=name, quotas=quotas or {}, cohort=cohort, admin=admin)
    )


def spec(**fields: object) -> bytes:
    return msgspec.json.encode({"command": ["python", "train.py"], **fields})


async def submit(
    store: Store,
    tenant_id: str,
    *,
    kind: WorkKind = "training",
    priority: PriorityClass = "p1",
    key: str | None = None,
    **fields: object,
) -> SubmitResult:
    return await store.submit_work(
        tenant_id, kind=kind, spec=spec(**fields), priority=priority, idempotency_key=key
    )


def placement(work_id: str, *nodes: str, accelerators: int = 1) -> PlacementWrite:
    """One member per node, `accelerators` GPUs each."""
    return PlacementWrite(
        work_id=work_id,
        allocations=tuple(
            NewAllocation(
                member_index=index,
                node_id=node,
                accelerator_kind="gpu",
                accelerators=accelerators,
                accelerator_ids=tuple(str(i) for i in range(accelerators)),
            )
            for index, node in enumerate(nodes)
        ),
    )
