"""What an admin set on nodes: cordoned, extra taints and labels (table `node_admin`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import msgspec
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from cloud.store.engine import Backend
from cloud.store.schema import node_admin
from cloud.store.sql import upsert

_TAINTS = msgspec.json.Decoder(tuple[str, ...])
_LABELS = msgspec.json.Decoder(dict[str, str])


@dataclass(frozen=True, slots=True)
class NodeAdminRecord:
    node_id: str
    cordoned: bool = False
    draining: bool = False  # cordoned, and its work moved elsewhere (cloud/loop/drain.py)
    taints: tuple[str, ...] = ()  # `key=value:Effect` (shared/taints.py)
    labels: Mapping[str, str] = field(default_factory=dict)
    updated_at: float = 0.0


async def put_node_admin(
    connection: AsyncConnection, backend: Backend, record: NodeAdminRecord
) -> None:
    await connection.execute(
        upsert(
            backend,
            node_admin,
            {
                "node_id": record.node_id,
                "cordoned": record.cordoned,
                "draining": record.draining,
                "taints": msgspec.json.encode(record.taints),
                "labels": msgspec.json.encode(dict(record.labels)),
                "updated_at": record.updated_at,
            },
            ["node_id"],
        )
    )


async def select_node_admin(connection: AsyncConnection) -> dict[str, NodeAdminRecord]:
    rows = await connection.execute(select(node_admin))
    return {
        row.node_id: NodeAdminRecord(
            node_id=row.node_id,
            cordoned=bool(row.cordoned),
            draining=bool(row.draining),
            taints=_TAINTS.decode(row.taints),
            labels=_LABELS.decode(row.labels),
            updated_at=float(row.updated_at),
        )
        for row in rows
    }
