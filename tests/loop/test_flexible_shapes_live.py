"""Flexible shapes end to end: REST -> store -> scheduling loop -> signed `desired`
over the real Mosquitto -> real (simulated-hardware) agents. A job declared as one
8-GPU worker, allowed to run as two of 4, runs as two on a fleet of 4-GPU nodes, and
its workers' environment is that of the shape it runs in."""

from __future__ import annotations

import pytest

from tests.store.databases import DatabaseUnderTest
from tests.support.control_plane import fleet, reaches

pytestmark = pytest.mark.timeout(90)


async def test_a_job_runs_in_its_alternative_shape_and_its_env_follows(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    async with fleet(database, mosquitto_root, cloud_nodes=2) as running:
        api = running.api
        token = await api.tenant("acme")
        spec = {
            "name": "data-parallel",
            "command": ["python", "train.py"],
            "workers": 1,
            "accelerators_per_worker": 8,
            "alternative_shapes": [{"workers": 2, "accelerators_per_worker": 4}],
            "estimated_duration_s": 3.0,
        }
        job_id = await api.submitted(token, spec)

        body = await reaches(api, token, job_id, "running")
        # The job's own view keeps the declared shape and its alternatives.
        assert (body["workers"], body["accelerators_per_worker"]) == (1, 8)
        assert body["spec"]["alternative_shapes"] == [{"workers": 2, "accelerators_per_worker": 4}]
        assert len(body["allocations"]) == 2
        assert len(set(body["nodes"])) == 2
        explained = await (await api.get(token, f"/v1/jobs/{job_id}/explain")).json()
        assert explained["message"].startswith("Placed 2 workers on")
        assert "reshaped to 2×4 (declared 1×8)" in explained["message"]

        started = [
            (worker, env)
            for launcher in running.launchers.values()
            for worker, env, _ in launcher.runs
            if worker.job_id == job_id
        ]
        assert sorted(worker.rank for worker, _ in started) == [0, 1]
        for worker, env in started:
            # The chosen shape's numbers, in the signed document the agent accepted.
            assert worker.world_size == 2
            assert worker.processes == 1
            assert len(worker.accelerator_ids) == 4
            assert env["WORLD_SIZE"] == "2"
            assert env["RANK"] == str(worker.rank)
            assert len(env["CUDA_VISIBLE_DEVICES"].split(",")) == 4
        done = await reaches(api, token, job_id, "succeeded")
        assert done["attempts"] == 1
