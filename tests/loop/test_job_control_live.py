"""Job control in the live loop (cloud/api/job_control.py), on the real Mosquitto with a
real agent, on SQLite and PostgreSQL: a held job stays pending with its reason while
capacity is free and is placed once released; a suspended training job that
checkpoints is stopped by its agent and, resumed, runs again as its next attempt (its
workers continue from their checkpoint); a requeued job is placed again."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.support import Api, bearer
from tests.store.databases import DatabaseUnderTest
from tests.support.control_plane import fleet, reaches
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(90)

NODE = "a100-0"  # four A100s


def job(name: str, gpus: int, **fields: Any) -> dict[str, Any]:
    return {
        "name": name,
        "command": ["python", "train.py"],
        "accelerators_per_worker": gpus,
        "estimated_duration_s": 3600.0,
        **fields,
    }


async def control(api: Api, token: str, job_id: str, action: str) -> dict[str, Any]:
    response = await api.client.post(f"/v1/jobs/{job_id}/{action}", headers=bearer(token))
    assert response.status == 200, await response.text()
    body: dict[str, Any] = await response.json()
    return body


async def test_hold_release_suspend_resume_and_requeue_with_a_real_agent(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    async with fleet(database, mosquitto_root, cloud_nodes=1) as running:
        api = running.api
        token = await api.tenant("acme")
        blocker = await api.submitted(token, job("blocker", 4))
        await reaches(api, token, blocker, "running")
        trainer = await api.submitted(token, job("trainer", 2, checkpoint_interval_s=60.0))
        held = await control(api, token, trainer, "hold")
        assert (held["state"], held["hold"]) == ("pending", "held")

        # Capacity frees: a job submitted after the hold is placed, the held one is not.
        response = await api.client.delete(f"/v1/jobs/{blocker}", headers=bearer(token))
        assert response.status == 200, await response.text()
        other = await api.submitted(token, job("other", 2))
        await reaches(api, token, other, "running")
        waiting = await reaches(api, token, trainer, "pending")
        assert (waiting["reason"], waiting["hold"], waiting["attempts"]) == (
            "held by acme", "held", 0,
        )  # fmt: skip

        await control(api, token, trainer, "release")
        placed = await reaches(api, token, trainer, "running")
        assert (placed["nodes"], placed["attempts"]) == ([NODE], 1)
        [(_, _, first_run)] = [r for r in running.launchers[NODE].runs if r[0].job_id == trainer]

        suspended = await control(api, token, trainer, "suspend")
        assert (suspended["state"], suspended["hold"]) == ("pending", "suspended")
        await eventually(
            lambda: first_run.status.reported().state == "stopped",
            message="the agent did not stop the suspended job's worker",
        )
        resumed = await control(api, token, trainer, "resume")
        assert resumed["hold"] is None
        again = await reaches(api, token, trainer, "running")
        assert again["attempts"] == 2
        second = [r for r in running.launchers[NODE].runs if r[0].job_id == trainer][-1]
        # The next attempt: a worker that checkpoints resumes from its newest one.
        assert (second[0].attempt, second[1]["GREENFED_ATTEMPT"]) == (2, "2")

        requeued = await control(api, token, other, "requeue")
        assert requeued["reason"] == "requeued by acme; starts over"
        replaced = await reaches(api, token, other, "running")
        assert replaced["attempts"] == 2
        events = await api.store.list_events(tenant_id=await api.tenant_id(token), limit=1000)
        kinds = [event.kind for event in events]
        assert kinds.count("work.hold") == 4  # held, released, suspended, resumed
