"""What draining nodes' drains wait for, as the scheduling leader's latest pass found
(table `node_drain_waiting`; cloud/loop/drain.py): replaced whole with the pass's commit
when it changed (`PassWrite.drain_waiting`), read by the replicas that do not lead.
Only nodes whose drain waits have a row: a handful, whatever the fleet's size."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec
from sqlalchemy import delete, insert, select
from sqlalchemy.ext.asyncio import AsyncConnection

from cloud.store.rows import encode_json
from cloud.store.schema import node_drain_waiting

DrainWaiting = Mapping[str, tuple[str, ...]]  # node id -> why its drain waits

_WAITING = msgspec.json.Decoder(tuple[str, ...])


async def replace_drain_waiting(connection: AsyncConnection, waiting: DrainWaiting) -> None:
    await connection.execute(delete(node_drain_waiting))
    rows = [
        {"node_id": node_id, "waiting": encode_json(why)}
        for node_id, why in sorted(waiting.items())
        if why
    ]
    if rows:
        await connection.execute(insert(node_drain_waiting), rows)


async def select_drain_waiting(connection: AsyncConnection) -> dict[str, tuple[str, ...]]:
    rows = await connection.execute(select(node_drain_waiting))
    return {row.node_id: _WAITING.decode(row.waiting) for row in rows}
