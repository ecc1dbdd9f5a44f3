"""Live, real agents over Mosquitto, both databases: under the default policy (green) a
job that would miss its deadline takes the node from checkpointing work without a
deadline (reason `deadline`); the victim waits, says why, and runs again afterwards."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.store.databases import DatabaseUnderTest
from tests.support.control_plane import cancel, fleet, reaches, work

pytestmark = pytest.mark.timeout(120)


async def test_a_job_due_soon_takes_the_node_from_checkpointing_work_live(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    async with fleet(database, mosquitto_root, cloud_nodes=1) as running:
        api = running.api
        token = await api.tenant("acme")
        # Both hold all four GPUs of the one server, at the same priority.
        job = {"command": ["python", "train.py"], "accelerators_per_worker": 4}
        batch = await api.submitted(
            token,
            {**job, "name": "batch", "estimated_duration_s": 36_000, "checkpoint_interval_s": 600},
        )
        await reaches(api, token, batch, "running")
        # An hour of work due in two: the server frees in ten, so it would miss by waiting.
        due = (datetime.now(UTC) + timedelta(hours=2)).isoformat()
        late = await api.submitted(
            token, {**job, "name": "late", "estimated_duration_s": 3600, "deadline": due}
        )
        await reaches(api, token, late, "running", timeout_s=40)

        explained = await (await api.get(token, f"/v1/jobs/{late}/explain")).json()
        [victim] = explained["explanation"]["preemptions"]
        assert (victim["work_id"], victim["reason"]) == (batch, "deadline")
        assert f"It preempted {batch} on a100-0 (deadline)." in explained["message"]
        victim_now = await work(api, token, batch)
        assert victim_now["state"] == "pending"
        assert victim_now["reason"] == f"preempted by {late} (deadline)"

        # Once the late job is gone the victim runs again.
        await cancel(api, token, late)
        await reaches(api, token, batch, "running", timeout_s=40)
