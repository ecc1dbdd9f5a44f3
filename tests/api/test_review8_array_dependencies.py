"""Review 8, job arrays with `depends_on`, and the array's view. Both databases.

Bug 1: every task of an array keeps its own copy of `depends_on`. The limits alone let
one submission write 10,000 tasks x 64 jobs = 640,000 dependency rows, in one write
transaction (one statement per task), every one then read by each scheduling pass: the
loop and the writer stalled for every tenant. An array has at most
MAX_ARRAY_DEPENDENCY_ROWS (tasks x depends_on): more is a 422 on `$.depends_on` that
stores nothing, and the rows of one that fits are written in one batched insert.

Bug 2: `GET /v1/jobs/{array id}` built the array's fields from task 0's spec as it is
now: after `PATCH /v1/jobs/ARRAYID_0` the array showed the patched priority and workers
while its other tasks (and the submission) said otherwise. It shows the spec submitted.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import event

from cloud.api import job_arrays
from tests.api.support import Api, bearer, job_spec, problem

TIMEOUT_S = 60


async def _job_count(api: Api, token: str) -> int:
    count: int = (await (await api.get(token, "/v1/jobs")).json())["count"]
    return count


async def _dependencies(api: Api, token: str, count: int) -> list[str]:
    return [await api.submitted(token, job_spec(name=f"prep-{i}")) for i in range(count)]


async def test_an_array_over_the_dependency_budget_is_refused_whole(api: Api) -> None:
    async with asyncio.timeout(TIMEOUT_S):
        token = await api.tenant("vision")
        needed = await _dependencies(api, token, 3)

        response = await api.submit(
            token,
            job_spec(name="sweep", array="0-9999", depends_on=[{"job": j} for j in needed]),
        )
        assert response.status == 422, response.status  # not the array's whole view
        body = await problem(response, 422)
        assert [p["name"] for p in body["invalid_params"]] == ["$.depends_on"]
        reason = body["invalid_params"][0]["reason"]
        assert "names 3 jobs for each of the array's 10000 tasks, 30000 dependencies" in reason
        assert f"at most {job_arrays.MAX_ARRAY_DEPENDENCY_ROWS}" in reason
        assert await _job_count(api, token) == 3  # no task stored


async def test_an_array_at_the_budget_is_accepted_one_over_it_refused(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with asyncio.timeout(TIMEOUT_S):
        token = await api.tenant("vision")
        depends_on = [{"job": j} for j in await _dependencies(api, token, 2)]
        monkeypatch.setattr(job_arrays, "MAX_ARRAY_DEPENDENCY_ROWS", 100, raising=False)

        refused = await api.submit(
            token, job_spec(name="sweep", array="0-50", depends_on=depends_on)
        )  # 51 tasks x 2 = 102
        assert refused.status == 422, refused.status
        body = await problem(refused, 422)
        assert "102 dependencies; an array has at most 100" in body["detail"]
        assert await _job_count(api, token) == 2

        accepted = await api.submit(
            token, job_spec(name="sweep", array="0-49", depends_on=depends_on)
        )  # 50 tasks x 2 = 100
        assert accepted.status == 201, await accepted.text()


async def test_an_arrays_tasks_wait_for_every_job_written_in_one_insert(api: Api) -> None:
    async with asyncio.timeout(TIMEOUT_S):
        token = await api.tenant("vision")
        needed = await _dependencies(api, token, 2)
        statements: list[str] = []

        def seen(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
            if statement.lstrip().upper().startswith("INSERT INTO WORK_DEPENDENCIES"):
                statements.append(statement)

        engine = api.store._engine.sync_engine
        event.listen(engine, "before_cursor_execute", seen)
        try:
            array_id = await api.submitted(
                token,
                job_spec(name="sweep", array="0-49", depends_on=[{"job": j} for j in needed]),
            )
        finally:
            event.remove(engine, "before_cursor_execute", seen)
        assert len(statements) == 1  # one batch of 100 rows, not one statement per task

        for index in (0, 49):
            task = await (await api.get(token, f"/v1/jobs/{array_id}_{index}")).json()
            assert [d["id"] for d in task["waits_for"]] == needed
        prep = await (await api.get(token, f"/v1/jobs/{needed[1]}")).json()
        assert len(prep["needed_by"]) == 50


async def _patch(api: Api, token: str, job: str, change: dict[str, Any]) -> None:
    response = await api.client.patch(f"/v1/jobs/{job}", json=change, headers=bearer(token))
    assert response.status == 200, await response.text()


@pytest.mark.parametrize("key", [None, "sweep-1"])
async def test_the_arrays_view_shows_the_spec_submitted_after_a_task_is_patched(
    api: Api, key: str | None
) -> None:
    async with asyncio.timeout(TIMEOUT_S):
        token = await api.tenant("vision")
        spec = job_spec(name="sweep", array="0-2", workers=1, allow_unschedulable=True)
        array_id = await api.submitted(token, spec, key=key)

        await _patch(api, token, f"{array_id}_0", {"workers": 4, "priority": "p2"})
        task = await (await api.get(token, f"/v1/jobs/{array_id}_0")).json()
        assert (task["priority"], task["workers"]) == ("p2", 4)

        shown = await (await api.get(token, f"/v1/jobs/{array_id}")).json()
        assert (shown["priority"], shown["workers"]) == ("p1", 1)
        assert (shown["spec"]["priority"], shown["spec"]["workers"]) == ("p1", 1)
        assert shown["spec"]["array"] == "0-2"
        assert shown["spec"]["array_task"] is None
        assert "GREENFED_ARRAY_TASK_ID" not in shown["spec"]["env"]

        if key is not None:  # a retry of the submission still gets the array
            retried = await api.submit(token, spec, key=key)
            assert retried.status == 200, await retried.text()
            assert (await retried.json())["id"] == array_id


async def test_the_arrays_view_answers_once_every_task_was_patched(api: Api) -> None:
    async with asyncio.timeout(TIMEOUT_S):
        token = await api.tenant("vision")
        spec = job_spec(name="sweep", array="0-1", workers=1, allow_unschedulable=True)
        array_id = await api.submitted(token, spec)
        for index in (0, 1):
            await _patch(api, token, f"{array_id}_{index}", {"workers": 2})

        response = await api.get(token, f"/v1/jobs/{array_id}")
        assert response.status == 200, await response.text()
        shown = await response.json()
        assert shown["array"]["count"] == 2
        assert shown["spec"]["array"] == "0-1"
