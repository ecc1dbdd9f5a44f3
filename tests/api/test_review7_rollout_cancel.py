"""Cancelling an agent rollout while the scheduling loop moves it on, on SQLite and
PostgreSQL: whichever of the two commits first, neither undoes the other. The cancel
ends the rollout and keeps each node's progress the loop saved; a loop step that read
the rollout before the cancel leaves it cancelled."""

from __future__ import annotations

import asyncio
import time

import msgspec
import pytest

from cloud.app_keys import MODEL_URL_SIGNER, REGISTRY
from cloud.store.agent_upgrades import AgentRolloutRecord
from cloud.upgrades.controller import UpgradeController
from cloud.upgrades.views import NodeUpgradeState
from tests.api.support import Api, bearer
from tests.api.test_agent_upgrades import publish, register, start, wheel_bytes


async def started_rollout(api: Api) -> dict[str, object]:
    """A rollout of 9.0.0 to n1..n3 whose two canaries were asked to upgrade."""
    for node_id in ("n1", "n2", "n3"):
        register(api, node_id)
    assert (await publish(api, wheel_bytes("9.0.0"))).status == 201
    response = await start(api, version="9.0.0", canary_percent=34)
    assert response.status == 201, await response.text()
    rollout: dict[str, object] = await response.json()
    return rollout


def canaries_run_the_new_version(api: Api, canaries: list[str]) -> None:
    registry = api.app[REGISTRY]
    for node_id in canaries:
        record = registry.get(node_id)
        assert record is not None
        registry.apply_status(
            msgspec.structs.replace(
                record.status,
                agent_version="9.0.0",
                instance_id="i2",
                started_at=2.0,
                sent_at=2.0,
            )
        )


async def loop_step(api: Api, controller: UpgradeController) -> None:
    nodes = {node.node_id: node for node in api.app[REGISTRY].nodes()}
    await controller.step(nodes, time.time())


def node_states(record: AgentRolloutRecord) -> dict[str, NodeUpgradeState]:
    return {node_id: entry.state for node_id, entry in record.state.nodes.items()}


async def test_a_cancel_keeps_the_progress_the_loop_saved_after_the_cancel_read_it(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The admin's cancel reads the running rollout; before it writes, the canaries come
    back on 9.0.0 and the loop saves the next wave (phase still `running`). The
    cancelled rollout, stored and answered, shows the canaries upgraded and the next
    wave asked, not the nodes as the cancel first read them."""
    rollout = await started_rollout(api)
    rollout_id = str(rollout["rollout_id"])
    nodes = rollout["nodes"]
    assert isinstance(nodes, dict)
    canaries = sorted(n for n, entry in nodes.items() if entry["state"] == "upgrading")
    assert len(canaries) == 2
    store = api.store
    read = store.agent_rollout
    steps: list[str] = []
    saved_by_the_loop: list[dict[str, NodeUpgradeState]] = []

    async def read_then_the_loop_moves_on(wanted: str) -> AgentRolloutRecord | None:
        record = await read(wanted)
        if not steps:
            steps.append(wanted)  # before the step: the loop's own read comes through here
            canaries_run_the_new_version(api, canaries)
            await loop_step(api, UpgradeController(store, api.app[MODEL_URL_SIGNER]))
            moved = await read(wanted)
            assert moved is not None
            assert moved.phase == "running"
            saved_by_the_loop.append(node_states(moved))
        return record

    monkeypatch.setattr(store, "agent_rollout", read_then_the_loop_moves_on)
    async with asyncio.timeout(20):
        response = await api.client.post(
            f"/v1/agent-rollouts/{rollout_id}/cancel", headers=bearer(api.admin_token)
        )
    assert response.status == 200, await response.text()
    assert steps == [rollout_id]
    assert len(saved_by_the_loop) == 1
    progress = saved_by_the_loop[0]
    assert progress == {n: "upgraded" if n in canaries else "upgrading" for n in nodes}
    after = await read(rollout_id)
    assert after is not None
    assert (after.phase, after.state.detail) == ("cancelled", "cancelled by an admin")
    assert after.state.finished_at is not None
    assert node_states(after) == progress
    assert after.state.current_wave == 1
    answered = await response.json()
    assert (answered["phase"], answered["current_wave"]) == ("cancelled", 1)
    assert {n: entry["state"] for n, entry in answered["nodes"].items()} == progress


async def test_a_loop_step_that_read_the_rollout_before_a_cancel_leaves_it_cancelled(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop reads the running rollout; before it saves the next wave, an admin's
    cancel commits. The rollout stays cancelled, as the admin left it, and the loop
    asks no node to upgrade from then on."""
    rollout = await started_rollout(api)
    rollout_id = str(rollout["rollout_id"])
    nodes = rollout["nodes"]
    assert isinstance(nodes, dict)
    canaries = sorted(n for n, entry in nodes.items() if entry["state"] == "upgrading")
    canaries_run_the_new_version(api, canaries)
    store = api.store
    read = store.agent_rollout
    cancels: list[int] = []

    async def read_then_cancelled(wanted: str) -> AgentRolloutRecord | None:
        record = await read(wanted)
        if not cancels:
            cancels.append(0)  # before the post: the cancel's own read comes through here
            response = await api.client.post(
                f"/v1/agent-rollouts/{wanted}/cancel", headers=bearer(api.admin_token)
            )
            cancels[0] = response.status
        return record

    controller = UpgradeController(store, api.app[MODEL_URL_SIGNER])
    monkeypatch.setattr(store, "agent_rollout", read_then_cancelled)
    async with asyncio.timeout(20):
        await loop_step(api, controller)
    assert cancels == [200]
    after = await read(rollout_id)
    assert after is not None
    assert (after.phase, after.state.detail) == ("cancelled", "cancelled by an admin")
    assert after.state.finished_at is not None
    # The cancel read the canaries as asked; the loop's wave that followed was never saved.
    assert node_states(after) == {n: entry["state"] for n, entry in nodes.items()}
    async with asyncio.timeout(20):
        await loop_step(api, controller)
    assert all(controller.upgrade_for(node_id) is None for node_id in ("n1", "n2", "n3"))
    stays = await read(rollout_id)
    assert stays is not None
    assert (stays.phase, stays.state) == ("cancelled", after.state)
