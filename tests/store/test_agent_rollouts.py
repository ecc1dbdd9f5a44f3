"""Agent rollouts in the store: one runs at a time, however many replicas start one at
once, and a database from before v0022 that holds several running comes out with one."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from sqlalchemy import text

from cloud.store import Actor, NewAudit, create_store_engine, open_store, resolve_database
from cloud.store.agent_upgrades import AgentRolloutRecord
from cloud.store.errors import AgentRolloutRunningError
from cloud.store.migrate import migrate
from cloud.store.migrations import MIGRATIONS
from cloud.upgrades.views import RolloutRequest, RolloutState
from tests.store.databases import DatabaseUnderTest
from tests.store.lock_waits import gate

AUDIT = NewAudit(
    actor=Actor("01JE0000000000000000000000", "admin"),
    action="agent_rollout.create",
    target="fleet",
)


def rollout(rollout_id: str, version: str, created_at: float) -> AgentRolloutRecord:
    state = RolloutState(
        rules=RolloutRequest(version=version),
        waves=1,
        current_wave=0,
        wave_started_at=created_at,
        nodes={},
    )
    return AgentRolloutRecord(
        rollout_id=rollout_id,
        version=version,
        phase="running",
        created_at=created_at,
        created_by="admin",
        state=state,
    )


async def test_two_rollouts_started_at_once_only_one_runs(database: DatabaseUnderTest) -> None:
    first, second = [await open_store(database.settings) for _ in range(2)]
    try:

        async def both_started() -> tuple[object, ...]:
            return await asyncio.gather(
                first.add_agent_rollout(rollout("R1", "1.0.1", 1000.0), audit=AUDIT),
                second.add_agent_rollout(rollout("R2", "1.0.2", 1000.0), audit=AUDIT),
                return_exceptions=True,
            )

        async with asyncio.timeout(20), asyncio.TaskGroup() as tasks:
            if database.kind == "postgresql":
                # Both have found no running rollout and wait to insert theirs; then both go.
                lock = "LOCK TABLE agent_rollouts IN SHARE MODE"
                async with gate(database, lock) as until_waiting:
                    starts = tasks.create_task(both_started())
                    await until_waiting(2)
            else:
                starts = tasks.create_task(both_started())
        results = starts.result()
        refused = [result for result in results if isinstance(result, AgentRolloutRunningError)]
        assert len(refused) == 1
        assert results.count(None) == 1
        running = [r.rollout_id for r in await first.list_agent_rollouts() if r.phase == "running"]
        assert running == [refused[0].rollout_id]
    finally:
        await first.close()
        await second.close()


async def _insert_rollout(connection: object, record: AgentRolloutRecord, phase: str) -> None:
    await connection.execute(  # type: ignore[attr-defined]
        text(
            "INSERT INTO agent_rollouts (rollout_id, version, phase, created_at, created_by, "
            "state) VALUES (:rollout_id, :version, :phase, :created_at, 'admin', :state)"
        ),
        {
            "rollout_id": record.rollout_id,
            "version": record.version,
            "phase": phase,
            "created_at": record.created_at,
            "state": msgspec.json.encode(record.state).decode(),
        },
    )


async def test_migrating_leaves_only_the_latest_of_several_running_rollouts_running(
    database: DatabaseUnderTest,
) -> None:
    """What two starts at once left before v0022: the loop drove only the latest, so the
    others are cancelled, saying why, and every row is kept."""
    earliest = rollout("R1", "1.0.1", 1000.0)
    older = rollout("R2", "1.0.2", 2000.0)
    latest = rollout("R3", "1.0.3", 2000.5)
    finished = rollout("R0", "1.0.0", 500.0)
    engine = create_store_engine(database.settings)
    try:
        await migrate(engine, resolve_database(database.settings), migrations=MIGRATIONS[:21])
        async with engine.begin() as connection:
            for record in (earliest, older, latest):
                await _insert_rollout(connection, record, "running")
            await _insert_rollout(connection, finished, "succeeded")
    finally:
        await engine.dispose()
    store = await open_store(database.settings)
    try:
        assert "0022_one_running_rollout" in store.migrations.applied
        after = {r.rollout_id: r for r in await store.list_agent_rollouts()}
        assert {r: after[r].phase for r in after} == {
            "R0": "succeeded",
            "R1": "cancelled",
            "R2": "cancelled",
            "R3": "running",
        }
        for superseded in ("R1", "R2"):
            state = after[superseded].state
            assert "rollout R3" in state.detail
            assert state.finished_at == 2000.5
            assert state.rules == RolloutRequest(version=after[superseded].version)
        assert after["R3"].state == latest.state
        assert after["R0"].state == finished.state
        with pytest.raises(AgentRolloutRunningError) as refused:
            await store.add_agent_rollout(rollout("R4", "1.0.4", 3000.0), audit=AUDIT)
        assert refused.value.rollout_id == "R3"
    finally:
        await store.close()
