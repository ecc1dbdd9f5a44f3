"""Job lifecycle end to end: REST -> store -> scheduling loop -> `desired` over the real
Mosquitto -> simulated agents -> `reported` -> work states, on SQLite and PostgreSQL.

The agents are real (`edge.agent.Agent`) on simulated hardware; training workers are
the simulated runner, whose run time follows the job's estimate.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import msgspec
import numpy as np
import pytest

from cloud.app_keys import SCHEDULER
from tests.api.support import bearer
from tests.store.databases import DatabaseUnderTest
from tests.support.control_plane import fleet, reaches, work
from tests.support.onnx_models import mlp_reference
from tests.support.waiting import eventually_async

pytestmark = pytest.mark.timeout(90)


def job(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "command": ["python", "train.py"], **fields}


async def test_a_two_worker_gang_runs_on_two_cloud_nodes_and_succeeds(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    async with fleet(database, mosquitto_root, cloud_nodes=3) as running:
        api = running.api
        token = await api.tenant("acme")
        # Long enough to be seen running on a loaded machine (a pass that finds both
        # workers done already moves the job to succeeded in one step).
        spec = job("gang", workers=2, accelerators_per_worker=4, estimated_duration_s=3.0)
        job_id = await api.submitted(token, spec)

        body = await reaches(api, token, job_id, "running")
        assert len(set(body["nodes"])) == 2
        explained = await (await api.get(token, f"/v1/jobs/{job_id}/explain")).json()
        assert explained["explanation"]["outcome"] == "placed"
        assert explained["message"].startswith("Placed 2 workers on")

        started = [
            (worker, env)
            for launcher in running.launchers.values()
            for worker, env, _ in launcher.runs
            if worker.job_id == job_id
        ]
        assert sorted(worker.rank for worker, _ in started) == [0, 1]
        assert {worker.world_size for worker, _ in started} == {2}
        assert len({(worker.master_addr, worker.master_port) for worker, _ in started}) == 1
        for worker, env in started:
            assert env["RANK"] == str(worker.rank)
            assert env["WORLD_SIZE"] == "2"
            assert env["GREENFED_JOB_ID"] == job_id
            # Every GPU of its node, by UUID.
            gpus = running.launchers[next(iter(running.launchers))].inventory
            assert env["CUDA_VISIBLE_DEVICES"] == ",".join(
                gpu.uuid or "" for gpu in gpus if gpu.kind == "gpu"
            )

        done = await reaches(api, token, job_id, "succeeded")
        assert done["attempts"] == 1
        metrics = await (await api.client.get("/metrics")).text()
        assert "greenfed_scheduling_leader 1.0" in metrics
        placements = next(
            line
            for line in metrics.splitlines()
            if line.startswith("greenfed_scheduling_placements_total ")
        )
        assert float(placements.split()[1]) >= 1


async def test_a_deployment_with_three_replicas_runs_on_three_edge_nodes(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    async with fleet(database, mosquitto_root, edge_nodes=3) as running:
        api = running.api
        token = await api.tenant("acme")
        spec = {"name": "detector", "model_id": await api.model(token), "replicas": 3}
        deployment_id = await api.submitted(token, spec, collection="deployments")

        body = await reaches(api, token, deployment_id, "running", collection="deployments")
        assert sorted(body["nodes"]) == ["orin-0", "orin-1", "orin-2"]
        replicas = (await work(api, token, deployment_id, "deployments"))["replica_states"]
        assert [r["state"] for r in replicas] == ["ready"] * 3
        x = np.array([[1.0, -2.0, 0.5, 3.0]], dtype=np.float32)
        async with aiohttp.ClientSession() as http:
            for replica in replicas:
                async with http.post(
                    replica["endpoint"], json={"inputs": {"x": x.tolist()}}
                ) as answer:
                    assert answer.status == 200, await answer.text()
                    outputs = (await answer.json())["outputs"]
                np.testing.assert_allclose(outputs["y"], mlp_reference(x), rtol=1e-5)


async def test_a_p0_job_preempts_a_p2_job_which_is_requeued_and_finishes_later(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    # Every wait is for a lasting fact (a worker the node started, a terminal state, an
    # event in the history), never for a passing state a poll may miss on a loaded
    # machine: the urgent job runs for a second.
    async with fleet(database, mosquitto_root, cloud_nodes=1) as running:
        api = running.api
        launcher = running.launchers["a100-0"]
        token = await api.tenant("acme")
        # Long enough that it is still running when the urgent job is placed, however
        # slow the machine.
        low = await api.submitted(
            token, job("batch", priority="p2", accelerators_per_worker=4, estimated_duration_s=8)
        )

        async def low_started() -> bool:
            return any(spec.job_id == low for spec, _, _ in launcher.runs)

        await eventually_async(low_started, timeout_s=30, message="the p2 job never started")

        urgent = await api.submitted(
            token, job("urgent", priority="p0", accelerators_per_worker=4, estimated_duration_s=1)
        )
        await reaches(api, token, urgent, "succeeded", timeout_s=60)
        history = await api.store.list_events(tenant_id=await api.tenant_id(token), limit=500)
        reasons = [msgspec.json.decode(event.payload).get("reason") or "" for event in history]
        assert any(reason.startswith(f"preempted by {urgent}") for reason in reasons), reasons

        finished = await reaches(api, token, low, "succeeded", timeout_s=60)
        assert finished["attempts"] == 2
        attempts = [s.attempt for s, _, _ in launcher.runs if s.job_id == low]
        assert attempts == [1, 2]
        # The urgent job ran while the p2 job waited: its one worker started between the
        # p2 job's two.
        order = [(s.job_id, s.attempt) for s, _, _ in launcher.runs]
        assert order.index((low, 1)) < order.index((urgent, 1)) < order.index((low, 2))


async def test_cancelling_a_running_job_stops_its_worker(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    async with fleet(database, mosquitto_root, cloud_nodes=1) as running:
        api = running.api
        token = await api.tenant("acme")
        job_id = await api.submitted(token, job("long", estimated_duration_s=3600))
        await reaches(api, token, job_id, "running")
        (_, _, run), *_ = running.launchers["a100-0"].runs

        response = await api.client.delete(f"/v1/jobs/{job_id}", headers=bearer(token))
        assert response.status in (200, 202), await response.text()

        async def stopped() -> bool:
            return run.status.finished

        await eventually_async(stopped, timeout_s=10, message="the worker kept running")
        assert run.status.reported().state == "stopped"
        assert (await work(api, token, job_id))["state"] == "cancelled"


async def test_a_failing_worker_fails_the_job_with_its_exit_code(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    async with fleet(database, mosquitto_root, cloud_nodes=1) as running:
        api = running.api
        token = await api.tenant("acme")
        spec = job("crash", estimated_duration_s=0.2, env={"GREENFED_SIM_EXIT_CODE": "3"})
        job_id = await api.submitted(token, spec)
        failed = await reaches(api, token, job_id, "failed")
        assert "exit code 3" in failed["reason"]


async def test_a_failing_job_is_retried_by_its_policy_after_a_backoff_and_then_succeeds(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    """Two failed attempts, each queued again after the job's backoff (0.2 s, then
    0.4 s); the third succeeds. Its failures are counted apart from its attempts."""
    async with fleet(database, mosquitto_root, cloud_nodes=1) as running:
        api = running.api
        token = await api.tenant("acme")
        flaky = {"GREENFED_SIM_EXIT_CODE": "3", "GREENFED_SIM_FAILING_ATTEMPTS": "2"}
        spec = job("flaky", estimated_duration_s=0.1, env=flaky, max_retries=2, retry_backoff_s=0.2)
        job_id = await api.submitted(token, spec)
        done = await reaches(api, token, job_id, "succeeded")
        assert (done["attempts"], done["failures"], done["retry_at"]) == (3, 2, None)
        history = await api.store.list_events(tenant_id=await api.tenant_id(token), limit=500)
        states = [
            msgspec.json.decode(event.payload)
            for event in history
            if event.work_id == job_id and event.kind == "work.state"
        ]
        retries = [s for s in states if s["state"] == "pending" and s["previous_state"]]
        assert [r["failures"] for r in retries] == [1, 2]
        assert "exit code 3; retry 1 of 2 in 0.2 s" in retries[0]["reason"]
        assert "retry 2 of 2 in 0.4 s" in retries[1]["reason"]
        assert all(r["retry_at"] is not None for r in retries)

        # With its retries used up, the next failure is final.
        spec = job("broken", estimated_duration_s=0.1, env={"GREENFED_SIM_EXIT_CODE": "3"})
        broken_id = await api.submitted(token, {**spec, "max_retries": 1, "retry_backoff_s": 0})
        failed = await reaches(api, token, broken_id, "failed")
        assert failed["failures"] == 1
        assert "(failed 2 times, 1 retries used)" in failed["reason"]


async def test_work_on_a_lost_node_is_requeued_and_placed_elsewhere(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    async with fleet(database, mosquitto_root, cloud_nodes=2) as running:
        api = running.api
        token = await api.tenant("acme")
        job_id = await api.submitted(
            token, job("survivor", accelerators_per_worker=4, estimated_duration_s=3600)
        )
        body = await reaches(api, token, job_id, "running")
        (first_node,) = body["nodes"]

        await running.stop_agent(first_node)

        async def moved() -> bool:
            now = await work(api, token, job_id)
            return (
                now["state"] == "running" and bool(now["nodes"]) and first_node not in now["nodes"]
            )

        await eventually_async(moved, timeout_s=20, message="the job was not moved")
        again = await work(api, token, job_id)
        assert again["attempts"] == 2
        assert running.api.app[SCHEDULER].stats.passes > 0
