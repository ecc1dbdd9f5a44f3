"""A GPU that fails (issue 15), end to end on the real Mosquitto: its agent stops
getting readings for it, marks it unhealthy in a new birth, the control plane requeues
the job that ran on it and places nothing there; once it answers again it is used."""

from __future__ import annotations

import pytest

from cloud.app_keys import REGISTRY
from tests.api.support import Api
from tests.store.databases import DatabaseUnderTest
from tests.support.control_plane import fleet, reaches, work
from tests.support.waiting import eventually, eventually_async

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]


async def test_a_failing_gpu_is_fenced_off_and_its_job_moves_until_it_recovers(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    async with fleet(database, mosquitto_root, cloud_nodes=2) as running:
        api = running.api
        token = await api.tenant("acme")
        spec = {
            "name": "long",
            "command": ["python", "train.py"],
            "accelerators_per_worker": 4,
            "estimated_duration_s": 600.0,
        }
        job_id = await api.submitted(token, spec)
        first = (await reaches(api, token, job_id, "running"))["nodes"][0]
        other = next(node_id for node_id in running.agents if node_id != first)
        registry = api.app[REGISTRY]

        def health(node_id: str) -> dict[str, bool]:
            record = registry.get(node_id)
            assert record is not None
            return {a.id: a.healthy for a in record.status.accelerators if a.kind == "gpu"}

        running.simulated[first].fail("gpu1")
        await eventually(lambda: health(first)["gpu1"] is False, timeout_s=10)
        record = registry.get(first)
        assert record is not None
        (failed,) = [a for a in record.status.accelerators if a.id == "gpu1"]
        assert "no reading from its driver" in failed.health

        # The job leaves the node with the failed GPU for the other one.
        async def moved() -> bool:
            body = await work(api, token, job_id)
            return bool(body["state"] == "running" and body["nodes"] == [other])

        await eventually_async(moved, timeout_s=20, message="the job did not move")
        body = await work(api, token, job_id)
        assert body["attempts"] == 2
        # A second 4-GPU job cannot go on the node left with three working GPUs.
        second = await api.submitted(token, {**spec, "name": "second"})
        await eventually_async(
            lambda: _pending(api, token, second),
            timeout_s=10,
            message=lambda: "second was placed",
        )
        running.simulated[first].fail("gpu1", failed=False)
        await eventually(lambda: health(first)["gpu1"] is True, timeout_s=10)
        body = await reaches(api, token, second, "running")
        assert body["nodes"] == [first]


async def _pending(api: Api, token: str, job_id: str) -> bool:
    body = await work(api, token, job_id)
    # The node with the failed GPU counts three: "fewer than 4 GPU".
    return body["state"] == "pending" and "fewer than 4 GPU" in (body["reason"] or "")
