"""Agent rollouts in the store: one runs at a time, however many replicas start one at
once, a database from before v0022 that holds several running comes out with one, and
the loop's progress and an admin's cancel never undo each other."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import msgspec
import pytest
from sqlalchemy import text

from cloud.fleet.registry import NodeRecord
from cloud.models.signing import ModelUrlSigner
from cloud.store import Actor, NewAudit, Store, create_store_engine, open_store, resolve_database
from cloud.store.agent_upgrades import AgentPackageRecord, AgentRolloutRecord
from cloud.store.audit import AuditQuery
from cloud.store.errors import AgentRolloutRunningError
from cloud.store.migrate import migrate
from cloud.store.migrations import MIGRATIONS
from cloud.upgrades.controller import UpgradeController
from cloud.upgrades.rollout import new_rollout
from cloud.upgrades.views import RolloutRequest, RolloutState
from tests.loop.builders import node
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


CANCEL = NewAudit(
    actor=Actor("01JE0000000000000000000000", "admin"),
    action="agent_rollout.cancel",
    target="R1",
)


def fleet_on(version: str, count: int) -> dict[str, NodeRecord]:
    records = {}
    for index in range(count):
        record = node(f"n{index}")
        status = msgspec.structs.replace(record.status, agent_version=version, self_upgrade=True)
        records[record.node_id] = dataclasses.replace(record, status=status)
    return records


async def started_rollout(store: Store, records: dict[str, NodeRecord]) -> AgentRolloutRecord:
    """A published 2.0 and a rollout of it whose canaries (2 of 3) are asked."""
    now = time.time()
    package = AgentPackageRecord(
        version="2.0",
        sha256="a" * 64,
        size_bytes=1,
        signature="c2ln",
        published_at=now,
        published_by="admin",
    )
    await store.add_agent_package(package, b"x", audit=AUDIT)
    rules = RolloutRequest(version="2.0", canary_percent=34)
    record = AgentRolloutRecord(
        rollout_id="R1",
        version="2.0",
        phase="running",
        created_at=now,
        created_by="admin",
        state=new_rollout("R1", rules, records, records, now),
    )
    await store.add_agent_rollout(record, audit=AUDIT)
    return record


async def cancel(store: Store, rollout_id: str) -> None:
    """What POST /v1/agent-rollouts/{id}/cancel stores (cloud/api/agent_upgrades.py)."""
    record = await store.agent_rollout(rollout_id)
    assert record is not None
    state = msgspec.structs.replace(
        record.state, finished_at=time.time(), detail="cancelled by an admin"
    )
    assert await store.save_agent_rollout(
        rollout_id, "cancelled", state, from_phase="running", audit=CANCEL
    )


async def test_a_cancel_that_commits_while_the_loop_moves_the_rollout_on_stands(
    database: DatabaseUnderTest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The leader's loop reads the rollout, an admin's cancel commits on another replica,
    then the loop saves the next wave: the rollout stays cancelled and asks nobody."""
    loop_store, api_store = [await open_store(database.settings) for _ in range(2)]
    try:
        records = fleet_on("1.0", 3)
        rollout = await started_rollout(loop_store, records)
        for node_id, entry in rollout.state.nodes.items():
            if entry.state == "upgrading":  # the canaries' births say they run 2.0
                status = msgspec.structs.replace(records[node_id].status, agent_version="2.0")
                records[node_id] = dataclasses.replace(records[node_id], status=status)
        read = loop_store.agent_rollout

        cancels: list[str] = []

        async def read_then_cancelled(rollout_id: str) -> AgentRolloutRecord | None:
            record = await read(rollout_id)
            if not cancels:
                cancels.append(rollout_id)
                await cancel(api_store, rollout_id)
            return record

        controller = UpgradeController(loop_store, ModelUrlSigner("k" * 32, "http://x"))
        monkeypatch.setattr(loop_store, "agent_rollout", read_then_cancelled)
        async with asyncio.timeout(20):
            await controller.step(records, time.time())
        assert cancels == ["R1"]
        after = await read("R1")
        assert after is not None
        assert (after.phase, after.state.detail) == ("cancelled", "cancelled by an admin")
        assert all(controller.upgrade_for(node_id) is None for node_id in records)
        async with asyncio.timeout(20):
            await controller.step(records, time.time())
        assert all(controller.upgrade_for(node_id) is None for node_id in records)
    finally:
        await loop_store.close()
        await api_store.close()


async def test_a_rollout_is_saved_only_in_the_phase_it_was_read_in(
    database: DatabaseUnderTest,
) -> None:
    """A cancel read while the rollout ran, written after the loop halted it, changes
    nothing and audits nothing; and a running rollout's progress is saved."""
    store = await open_store(database.settings)
    try:
        record = rollout("R1", "1.0.1", 1000.0)
        await store.add_agent_rollout(record, audit=AUDIT)
        moved = msgspec.structs.replace(record.state, current_wave=1)
        assert await store.save_agent_rollout("R1", "running", moved, from_phase="running")
        halted = msgspec.structs.replace(moved, detail="wave 2: 1 of 1 nodes failed")
        assert await store.save_agent_rollout("R1", "halted", halted, from_phase="running")
        assert not await store.save_agent_rollout(
            "R1", "cancelled", record.state, from_phase="running", audit=CANCEL
        )
        after = await store.agent_rollout("R1")
        assert after is not None
        assert (after.phase, after.state) == ("halted", halted)
        cancels = await store.list_audit(AuditQuery(actions=("agent_rollout.cancel",)))
        assert cancels.items == ()
    finally:
        await store.close()
