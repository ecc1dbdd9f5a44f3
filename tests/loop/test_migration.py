"""Migration in the live loop: a running job that checkpoints moves to the cleaner zone
when capacity frees there, as one stop-and-resume with the next attempt number, on
the real Mosquitto with real agents, on SQLite and PostgreSQL.

The grid signals are the default ones: the shipped 2023 traces replayed at today's
date and time, in which Johannesburg (ZA, coal, ~700 gCO2eq/kWh) is always several
times dirtier than Toronto (CA-ON, nuclear and hydro).
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest

from cloud.app_keys import SCHEDULER
from tests.api.support import bearer
from tests.store.databases import DatabaseUnderTest
from tests.support.control_plane import FAST_LOOP, fleet, reaches, work
from tests.support.waiting import eventually_async

pytestmark = pytest.mark.timeout(90)

DIRTY, CLEAN = "a100-0", "a100-1"
ZONES = [("ZA", "africa-south1"), ("CA-ON", "northamerica-northeast2")]
MIGRATING = msgspec.structs.replace(FAST_LOOP, migration_cooldown_s=0.0, migration_interval_s=0.0)


def job(name: str, **fields: Any) -> dict[str, Any]:
    return {
        "name": name,
        "command": ["python", "train.py"],
        "accelerators_per_worker": 4,
        "estimated_duration_s": 3600.0,
        **fields,
    }


async def test_a_checkpointing_job_moves_to_the_cleaner_zone_when_it_frees(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    async with fleet(
        database, mosquitto_root, cloud_nodes=2, cloud_zones=ZONES, scheduling=MIGRATING
    ) as running:
        api = running.api
        token = await api.tenant("acme")
        blocker = await api.submitted(token, job("blocker"))
        assert (await reaches(api, token, blocker, "running"))["nodes"] == [CLEAN]
        mover = await api.submitted(token, job("mover", checkpoint_interval_s=60.0))
        body = await reaches(api, token, mover, "running")
        assert body["nodes"] == [DIRTY]  # the only room left
        assert body["attempts"] == 1
        [(_, _, first_run)] = [r for r in running.launchers[DIRTY].runs if r[0].job_id == mover]

        response = await api.client.delete(f"/v1/jobs/{blocker}", headers=bearer(token))
        assert response.status in (200, 202), await response.text()

        moved: dict[str, Any] = {}

        async def on_the_clean_node() -> bool:
            moved.update(await work(api, token, mover))
            return bool(moved["nodes"] == [CLEAN] and moved["state"] == "running")

        await eventually_async(
            on_the_clean_node, timeout_s=20, message=lambda: f"not moved: {moved}"
        )
        assert moved["attempts"] == 2
        explained = await (await api.get(token, f"/v1/jobs/{mover}/explain")).json()
        assert explained["explanation"]["outcome"] == "moved"
        assert explained["message"].startswith(f"Moved from {DIRTY} to {CLEAN} for ")
        assert "less CO2" in explained["message"]
        # The old worker was stopped; the new one knows it is a restart.
        assert first_run.status.reported().state == "stopped"
        [(spec, env, _)] = [r for r in running.launchers[CLEAN].runs if r[0].job_id == mover]
        assert spec.attempt == 2
        assert env["GREENFED_ATTEMPT"] == "2"
        metrics = await (await api.client.get("/metrics")).text()
        assert "greenfed_scheduling_migrations_total 1.0" in metrics


@pytest.mark.parametrize(
    ("policy", "checkpoint"),
    [("green", None), ("fifo-binpack", 60.0)],
    ids=["no-checkpoints", "carbon-agnostic-policy"],
)
async def test_jobs_without_checkpoints_and_policies_that_do_not_migrate_stay(
    database: DatabaseUnderTest,
    mosquitto_root: tuple[str, str],
    policy: str,
    checkpoint: float | None,
) -> None:
    clean_first = [ZONES[1], ZONES[0]]  # a100-0 clean, a100-1 dirty
    settings = msgspec.structs.replace(MIGRATING, policy=policy)
    async with fleet(
        database, mosquitto_root, cloud_nodes=2, cloud_zones=clean_first, scheduling=settings
    ) as running:
        api = running.api
        token = await api.tenant("acme")
        first = await api.submitted(token, job("first"))
        assert (await reaches(api, token, first, "running"))["nodes"] == ["a100-0"]
        extra = {} if checkpoint is None else {"checkpoint_interval_s": checkpoint}
        second = await api.submitted(token, job("second", **extra))
        assert (await reaches(api, token, second, "running"))["nodes"] == ["a100-1"]
        response = await api.client.delete(f"/v1/jobs/{first}", headers=bearer(token))
        assert response.status in (200, 202), await response.text()
        await reaches(api, token, first, "cancelled")
        # Passes after the clean node freed have moved nothing.
        loop = running.api.app[SCHEDULER]
        for _ in range(3):
            loop.wake()
            async with asyncio.timeout(10):
                await loop.wait_for_pass()
        body = await work(api, token, second)
        assert body["nodes"] == ["a100-1"]
        assert body["attempts"] == 1
        assert loop.stats.migrated == 0


async def test_small_jobs_move_to_make_room_for_a_waiting_worker(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    """Two 4-GPU nodes with 2 GPUs free on each and a 4-GPU job waiting: the
    checkpointing 2-GPU job moves beside the other one, and the waiting job runs on the
    node it left (cloud/green/room.py)."""
    same_zone = [ZONES[1], ZONES[1]]  # no node is cleaner: only room makes it move
    settings = msgspec.structs.replace(MIGRATING, make_room_after_s=0.0)
    async with fleet(
        database, mosquitto_root, cloud_nodes=2, cloud_zones=same_zone, scheduling=settings
    ) as running:
        api = running.api
        token = await api.tenant("acme")
        small = await api.submitted(
            token, job("small", accelerators_per_worker=2, checkpoint_interval_s=60.0)
        )
        [first] = (await reaches(api, token, small, "running"))["nodes"]
        [other] = {"a100-0", "a100-1"} - {first}
        whole = await api.submitted(token, job("whole"))  # only the other node has room
        assert (await reaches(api, token, whole, "running"))["nodes"] == [other]
        beside = await api.submitted(token, job("beside", accelerators_per_worker=2))
        assert (await reaches(api, token, beside, "running"))["nodes"] == [first]

        async def cancel(work_id: str) -> None:
            response = await api.client.delete(f"/v1/jobs/{work_id}", headers=bearer(token))
            assert response.status in (200, 202), await response.text()
            await reaches(api, token, work_id, "cancelled")

        await cancel(whole)
        pinned = await api.submitted(token, job("pinned", accelerators_per_worker=2))
        assert (await reaches(api, token, pinned, "running"))["nodes"] == [other]
        await cancel(beside)
        # 2 GPUs free on each node: a 4-GPU worker has no node with room.
        waiting = await api.submitted(token, job("waiting"))

        body = await reaches(api, token, waiting, "running")
        assert body["nodes"] == [first]
        moved = await work(api, token, small)
        assert moved["nodes"] == [other]
        assert moved["attempts"] == 2
        explained = await (await api.get(token, f"/v1/jobs/{small}/explain")).json()
        assert explained["explanation"]["outcome"] == "moved"
        assert f"to make room for {waiting}" in explained["message"]
        # The job without checkpoints stayed where it was.
        assert (await work(api, token, pinned))["attempts"] == 1
