"""Fair share's rows: each tenant's decayed past usage (`fair_share_usage`, v0018), and
what each tenant holds now, for `GET /v1/tenants` (cloud/api/fair_share.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import msgspec
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from cloud.store.engine import Backend
from cloud.store.rows import encode_json
from cloud.store.schema import allocations, fair_share_usage, work
from cloud.store.sql import dialect_insert

_SECONDS = msgspec.json.Decoder(dict[str, float])


@dataclass(frozen=True, slots=True)
class FairShareRow:
    """One tenant's accumulator (cloud/scheduler/fair_share.py `DecayedUsage`)."""

    tenant: str  # its name
    accelerator_seconds: Mapping[str, float]  # kind -> decayed accelerator-seconds
    as_of: float


def _decoded(value: object) -> dict[str, float]:
    if isinstance(value, (str, bytes)):
        return _SECONDS.decode(value)
    return msgspec.convert(value, dict[str, float])


async def select_fair_share(connection: AsyncConnection) -> dict[str, FairShareRow]:
    rows = await connection.execute(select(fair_share_usage))
    return {
        row.tenant: FairShareRow(row.tenant, _decoded(row.accelerator_seconds), row.as_of)
        for row in rows
    }


async def put_fair_share(
    connection: AsyncConnection, backend: Backend, rows: list[FairShareRow]
) -> None:
    if not rows:
        return
    statement = dialect_insert(backend, fair_share_usage)
    statement = statement.on_conflict_do_update(
        index_elements=["tenant"],
        set_={
            "accelerator_seconds": statement.excluded.accelerator_seconds,
            "as_of": statement.excluded.as_of,
        },
    )
    await connection.execute(
        statement,
        [
            {
                "tenant": row.tenant,
                "accelerator_seconds": encode_json(dict(row.accelerator_seconds)),
                "as_of": row.as_of,
            }
            for row in rows
        ],
    )


async def select_held(connection: AsyncConnection) -> dict[str, dict[str, int]]:
    """Tenant id -> accelerator kind -> accelerators its allocations hold now."""
    total = func.sum(allocations.c.accelerators)
    query = (
        select(work.c.tenant_id, allocations.c.accelerator_kind, total)
        .join(work, work.c.id == allocations.c.work_id)
        .group_by(work.c.tenant_id, allocations.c.accelerator_kind)
    )
    held: dict[str, dict[str, int]] = {}
    for tenant_id, kind, total in await connection.execute(query):
        held.setdefault(tenant_id, {})[kind] = int(total or 0)
    return held
