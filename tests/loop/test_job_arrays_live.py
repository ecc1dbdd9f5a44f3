"""A job array in the live loop (issue 29), on the real Mosquitto with a real agent, on
SQLite and PostgreSQL: `array = "0-3%2"` on a node with room for all four tasks runs
them at most two at a time (the throttle, read back from the committed state changes),
each worker sees its own index in its environment, and the array's summary ends
`succeeded`; cancelling a running array (one task, then all) stops every worker."""

from __future__ import annotations

import msgspec
import pytest

from cloud.store import WORK_STATE_EVENT, WorkStateChanged
from tests.api.support import bearer
from tests.store.databases import DatabaseUnderTest
from tests.support.control_plane import fleet, reaches
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(90)

NODE = "a100-0"  # four A100s: room for every task at once


async def test_an_array_runs_at_most_its_throttle_at_once_with_a_real_agent(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    async with fleet(database, mosquitto_root, cloud_nodes=1) as running:
        api = running.api
        token = await api.tenant("acme")
        spec = {
            "name": "sweep",
            "command": ["python", "sweep.py"],
            "estimated_duration_s": 1.0,  # an A100 runs it in about a second
            "array": "0-3%2",
        }
        response = await api.submit(token, spec)
        assert response.status == 201, await response.text()
        array_id = (await response.json())["id"]

        done = await reaches(api, token, array_id, "succeeded", timeout_s=60.0)
        assert done["array"]["states"] == {"succeeded": 4}
        tasks = {task["id"]: task["index"] for task in done["array"]["tasks"]}

        # Never more than two placed at once: replay every committed state change.
        events = await api.store.list_events(tenant_id=await api.tenant_id(token), limit=1000)
        placed: set[str] = set()
        most = 0
        for event in events:
            if event.kind != WORK_STATE_EVENT or event.work_id not in tasks:
                continue
            change = msgspec.json.decode(event.payload, type=WorkStateChanged)
            if change.state in ("scheduled", "running"):
                placed.add(change.work_id)
            else:
                placed.discard(change.work_id)
            most = max(most, len(placed))
        assert most == 2

        # Each worker ran with its own index, its array's id and size.
        seen = {
            (desired.job_id, environment["GREENFED_ARRAY_TASK_ID"])
            for desired, environment, _ in running.launchers[NODE].runs
            if desired.job_id in tasks
        }
        assert seen == {(job_id, str(index)) for job_id, index in tasks.items()}
        environment = running.launchers[NODE].runs[-1][1]
        assert environment["GREENFED_ARRAY_JOB_ID"] == array_id
        assert environment["GREENFED_ARRAY_TASK_COUNT"] == "4"
        assert (environment["GREENFED_ARRAY_TASK_MIN"], environment["GREENFED_ARRAY_TASK_MAX"]) == (
            "0",
            "3",
        )


async def test_cancelling_a_running_array_stops_every_task_on_its_agent(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    async with fleet(database, mosquitto_root, cloud_nodes=1) as running:
        api = running.api
        token = await api.tenant("acme")
        spec = {"name": "sweep", "command": ["python", "sweep.py"], "array": "0-2"}
        response = await api.submit(token, spec)
        assert response.status == 201, await response.text()
        array_id = (await response.json())["id"]
        busy = await reaches(api, token, array_id, "running")
        tasks = [task["id"] for task in busy["array"]["tasks"]]
        for index in range(3):
            await reaches(api, token, f"{array_id}_{index}", "running")

        one = await api.client.delete(f"/v1/jobs/{array_id}_0", headers=bearer(token))
        assert one.status == 200, await one.text()
        every = await api.client.delete(f"/v1/jobs/{array_id}", headers=bearer(token))
        assert every.status == 200, await every.text()
        assert (await every.json())["array"]["states"] == {"cancelled": 3}

        runs = [run for desired, _, run in running.launchers[NODE].runs if desired.job_id in tasks]
        assert len(runs) == 3
        await eventually(
            lambda: all(run.status.reported().state == "stopped" for run in runs),
            message="the agent did not stop every task's worker",
        )
