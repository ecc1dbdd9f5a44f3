"""Registered clusters (cloud/clusters/): one row each, what the admin registered kept
as its JSON `ClusterSpec`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec
from sqlalchemy import Row, delete, insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from cloud.clusters.views import SPEC_DECODER, ClusterSpec
from cloud.store.errors import ClusterExistsError, ClusterNotFoundError
from cloud.store.schema import clusters


@dataclass(frozen=True, slots=True)
class ClusterRecord:
    spec: ClusterSpec
    created_at: float
    created_by: str  # the admin tenant's id


def _record(row: Row[Any]) -> ClusterRecord:
    return ClusterRecord(
        spec=SPEC_DECODER.decode(row.spec),
        created_at=float(row.created_at),
        created_by=row.created_by,
    )


async def insert_cluster(connection: AsyncConnection, record: ClusterRecord) -> None:
    try:
        await connection.execute(
            insert(clusters).values(
                name=record.spec.name,
                kind=record.spec.kind,
                created_at=record.created_at,
                created_by=record.created_by,
                spec=msgspec.json.encode(record.spec),
            )
        )
    except IntegrityError:
        raise ClusterExistsError(record.spec.name) from None


async def select_clusters(connection: AsyncConnection) -> tuple[ClusterRecord, ...]:
    rows = await connection.execute(select(clusters).order_by(clusters.c.name))
    return tuple(_record(row) for row in rows)


async def delete_cluster(connection: AsyncConnection, name: str) -> ClusterRecord:
    row = (await connection.execute(select(clusters).where(clusters.c.name == name))).first()
    if row is None:
        raise ClusterNotFoundError(name)
    await connection.execute(delete(clusters).where(clusters.c.name == name))
    return _record(row)
