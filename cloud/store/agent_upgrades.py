"""Agent packages and their rollouts (cloud/upgrades/): one row per published version,
one per rollout with its nodes' states as JSON (`RolloutState`)."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import msgspec
from sqlalchemy import Row, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from cloud.store.errors import AgentPackageExistsError, AgentRolloutRunningError
from cloud.store.schema import agent_packages, agent_rollouts
from cloud.upgrades.views import ACTIVE_PHASE, STATE_DECODER, RolloutPhase, RolloutState


@dataclass(frozen=True, slots=True)
class AgentPackageRecord:
    version: str
    sha256: str
    size_bytes: int
    signature: str
    published_at: float
    published_by: str  # the admin tenant's id


@dataclass(frozen=True, slots=True)
class AgentRolloutRecord:
    rollout_id: str
    version: str
    phase: RolloutPhase
    created_at: float
    created_by: str
    state: RolloutState


_PACKAGE_COLUMNS = (
    agent_packages.c.version,
    agent_packages.c.sha256,
    agent_packages.c.size_bytes,
    agent_packages.c.signature,
    agent_packages.c.published_at,
    agent_packages.c.published_by,
)


def _package(row: Row[Any, Any, Any, Any, Any, Any]) -> AgentPackageRecord:
    return AgentPackageRecord(
        version=row.version,
        sha256=row.sha256,
        size_bytes=int(row.size_bytes),
        signature=row.signature,
        published_at=float(row.published_at),
        published_by=row.published_by,
    )


def _rollout(row: Row[Any]) -> AgentRolloutRecord:
    return AgentRolloutRecord(
        rollout_id=row.rollout_id,
        version=row.version,
        phase=row.phase,
        created_at=float(row.created_at),
        created_by=row.created_by,
        state=STATE_DECODER.decode(row.state),
    )


async def insert_package(
    connection: AsyncConnection, record: AgentPackageRecord, content: bytes
) -> None:
    try:
        await connection.execute(
            insert(agent_packages).values(
                version=record.version,
                sha256=record.sha256,
                size_bytes=record.size_bytes,
                signature=record.signature,
                published_at=record.published_at,
                published_by=record.published_by,
                content_base64=base64.b64encode(content).decode("ascii"),
            )
        )
    except IntegrityError:
        raise AgentPackageExistsError(record.version) from None


async def select_packages(connection: AsyncConnection) -> tuple[AgentPackageRecord, ...]:
    rows = await connection.execute(
        select(*_PACKAGE_COLUMNS).order_by(agent_packages.c.published_at)
    )
    return tuple(_package(row) for row in rows)


async def select_package(connection: AsyncConnection, version: str) -> AgentPackageRecord | None:
    row = (
        await connection.execute(
            select(*_PACKAGE_COLUMNS).where(agent_packages.c.version == version)
        )
    ).first()
    return _package(row) if row is not None else None


async def select_package_content(connection: AsyncConnection, version: str) -> bytes | None:
    row = (
        await connection.execute(
            select(agent_packages.c.content_base64).where(agent_packages.c.version == version)
        )
    ).first()
    return base64.b64decode(row.content_base64) if row is not None else None


async def insert_rollout(connection: AsyncConnection, record: AgentRolloutRecord) -> None:
    """Raises `AgentRolloutRunningError` while another rollout runs (one at a time: two
    would ask the same nodes for two versions)."""
    running = await _running_rollout(connection)
    if running is not None:
        raise AgentRolloutRunningError(running)
    statement = insert(agent_rollouts).values(
        rollout_id=record.rollout_id,
        version=record.version,
        phase=record.phase,
        created_at=record.created_at,
        created_by=record.created_by,
        state=msgspec.json.encode(record.state),
    )
    try:
        # A savepoint: after a refusal the transaction can still read which one runs.
        async with connection.begin_nested():
            await connection.execute(statement)
    except IntegrityError:
        # Another start got in between the check and the insert (PostgreSQL reads
        # committed rows; the unique index on running rollouts, v0022, decides).
        running = await _running_rollout(connection)
        if running is None:
            raise
        raise AgentRolloutRunningError(running) from None


async def _running_rollout(connection: AsyncConnection) -> str | None:
    query = select(agent_rollouts.c.rollout_id).where(agent_rollouts.c.phase == ACTIVE_PHASE)
    return (await connection.execute(query)).scalar()


async def update_rollout(
    connection: AsyncConnection,
    rollout_id: str,
    phase: RolloutPhase,
    state: RolloutState,
    *,
    from_phase: RolloutPhase,
) -> bool:
    """Whether the rollout was still in `from_phase` and is now in `phase`. Two writers
    each read a rollout before they write it (the loop moving it on, an admin cancelling
    it): neither undoes the other. The loop's save finds a cancel that committed first
    (the phase it read is gone) and changes nothing. A cancel takes only when and why
    the rollout ended from `state` (`_cancel`), so progress the loop saved after the
    cancel read the rollout stands. On PostgreSQL the second writer waits for the
    first's row lock, then checks its condition against the committed row."""
    if phase == "cancelled":
        return await _cancel(connection, rollout_id, state, from_phase=from_phase)
    result = await connection.execute(
        update(agent_rollouts)
        .where(agent_rollouts.c.rollout_id == rollout_id, agent_rollouts.c.phase == from_phase)
        .values(phase=phase, state=msgspec.json.encode(state))
    )
    return result.rowcount == 1


async def _cancel(
    connection: AsyncConnection,
    rollout_id: str,
    ended: RolloutState,
    *,
    from_phase: RolloutPhase,
) -> bool:
    """Cancel the rollout as the store holds it now: its nodes' states, wave and timings
    are the loop's to write, and may have moved since the admin's request read them
    while the phase stayed `running`; only `ended`'s finished_at and detail are taken.
    Read and written under the row's lock (FOR UPDATE on PostgreSQL; on SQLite the
    write transaction holds the database's one write lock from BEGIN IMMEDIATE)."""
    stored = (
        await connection.execute(
            select(agent_rollouts.c.phase, agent_rollouts.c.state)
            .where(agent_rollouts.c.rollout_id == rollout_id)
            .with_for_update()
        )
    ).first()
    if stored is None or stored.phase != from_phase:
        return False
    state = msgspec.structs.replace(
        STATE_DECODER.decode(stored.state), finished_at=ended.finished_at, detail=ended.detail
    )
    await connection.execute(
        update(agent_rollouts)
        .where(agent_rollouts.c.rollout_id == rollout_id)
        .values(phase="cancelled", state=msgspec.json.encode(state))
    )
    return True


async def select_latest_rollout_head(connection: AsyncConnection) -> tuple[str, str] | None:
    """(rollout id, phase) of the latest rollout, without its state."""
    row = (
        await connection.execute(
            select(agent_rollouts.c.rollout_id, agent_rollouts.c.phase)
            .order_by(agent_rollouts.c.created_at.desc())
            .limit(1)
        )
    ).first()
    return (row.rollout_id, row.phase) if row is not None else None


async def select_rollouts(
    connection: AsyncConnection, *, limit: int = 50
) -> tuple[AgentRolloutRecord, ...]:
    """The latest rollouts, newest first."""
    rows = await connection.execute(
        select(agent_rollouts).order_by(agent_rollouts.c.created_at.desc()).limit(limit)
    )
    return tuple(_rollout(row) for row in rows)


async def select_rollout(connection: AsyncConnection, rollout_id: str) -> AgentRolloutRecord | None:
    row = (
        await connection.execute(
            select(agent_rollouts).where(agent_rollouts.c.rollout_id == rollout_id)
        )
    ).first()
    return _rollout(row) if row is not None else None
