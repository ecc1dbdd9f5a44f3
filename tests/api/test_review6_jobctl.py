"""Review 6, job control refusals that say what is true and what to do. Both databases.

Bug 1: hold, release, suspend, resume, requeue and PATCH of a job array's id or name
answered `404 job-not-found` ("no job 'ARRAYID'") while GET of the same id shows the
array. The array is many jobs: these (and logs) act on one task, so the answer is a 409
(`job-array`, as PUT of an array's name) naming a task to act on instead, or DELETE
for the whole array. Another tenant's array stays not found.

Bug 2: requeue of a held (or suspended) job said "a pending one is in the queue
already", which a held job is not: it says to release (resume) it instead."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import ClientResponse

from tests.api.support import Api, bearer, job_spec, problem

pytestmark = pytest.mark.timeout(60)

ACTIONS = ("hold", "release", "suspend", "resume", "requeue")


async def _act(api: Api, token: str, reference: str, action: str) -> ClientResponse:
    return await api.client.post(f"/v1/jobs/{reference}/{action}", headers=bearer(token))


async def _patch(api: Api, token: str, reference: str, body: dict[str, Any]) -> ClientResponse:
    return await api.client.patch(f"/v1/jobs/{reference}", json=body, headers=bearer(token))


async def _array(api: Api, token: str, array_id: str) -> dict[str, Any]:
    response = await api.get(token, f"/v1/jobs/{array_id}")
    assert response.status == 200, await response.text()
    shown: dict[str, Any] = (await response.json())["array"]
    return shown


async def _task_states(api: Api, token: str, array_id: str) -> list[tuple[str, Any, int]]:
    """Each task's (state, hold, version)."""
    tasks = (await _array(api, token, array_id))["tasks"]
    states = []
    for task in tasks:
        job = await (await api.get(token, f"/v1/jobs/{task['id']}")).json()
        states.append((job["state"], job["hold"], job["version"]))
    return states


def _assert_names_a_task(body: dict[str, Any], array_id: str, asked: str, task: str) -> None:
    assert body["type"].endswith("/job-array"), body
    assert "is a job array (3 tasks), not one job" in body["detail"] or (
        f"is job array {array_id} (3 tasks), not one job" in body["detail"]
    )
    assert f"{asked} acts on one task" in body["detail"]
    assert f"(e.g. {task})" in body["detail"]
    assert f"cancel the whole array (DELETE /v1/jobs/{array_id})" in body["detail"]
    assert [param["name"] for param in body["invalid_params"]] == ["id"]


async def test_controlling_an_arrays_id_or_name_is_refused_naming_a_task(api: Api) -> None:
    token = await api.tenant("vision")
    array_id = await api.submitted(token, job_spec(name="sweep", array="2-4"))
    before = await _task_states(api, token, array_id)

    for reference in (array_id, "sweep"):
        for action in ACTIONS:
            body = await problem(await _act(api, token, reference, action), 409)
            _assert_names_a_task(
                body,
                array_id,
                f"POST /v1/jobs/{{id}}/{action}",
                f"POST /v1/jobs/{array_id}_2/{action}",
            )
            assert body["detail"].startswith(f"job {reference} is ")
        body = await problem(await _patch(api, token, reference, {"workers": 2}), 409)
        _assert_names_a_task(body, array_id, "PATCH /v1/jobs/{id}", f"PATCH /v1/jobs/{array_id}_2")

    # Logs read one job's output too.
    body = await problem(await api.get(token, f"/v1/jobs/{array_id}/logs"), 409)
    _assert_names_a_task(
        body, array_id, "GET /v1/jobs/{id}/logs", f"GET /v1/jobs/{array_id}_2/logs"
    )

    assert await _task_states(api, token, array_id) == before  # no task was touched
    # What the refusal names works: the task's own path.
    held = await _act(api, token, f"{array_id}_2", "hold")
    assert held.status == 200, await held.text()
    assert (await held.json())["hold"] == "held"


async def test_an_array_refused_as_one_job_is_refused_after_it_ended_too(api: Api) -> None:
    token = await api.tenant("vision")
    array_id = await api.submitted(token, job_spec(name="sweep", array="0-2"))
    cancelled = await api.client.delete(f"/v1/jobs/{array_id}", headers=bearer(token))
    assert cancelled.status == 200, await cancelled.text()

    body = await problem(await _act(api, token, array_id, "hold"), 409)
    _assert_names_a_task(
        body, array_id, "POST /v1/jobs/{id}/hold", f"POST /v1/jobs/{array_id}_0/hold"
    )


async def test_another_tenants_array_stays_not_found_and_the_admin_is_told(api: Api) -> None:
    owner = await api.tenant("vision")
    stranger = await api.tenant("audio")
    array_id = await api.submitted(owner, job_spec(name="sweep", array="0-2"))

    for action in ACTIONS:
        body = await problem(await _act(api, stranger, array_id, action), 404)
        assert body["type"].endswith("/job-not-found")
    body = await problem(await _patch(api, stranger, array_id, {"workers": 2}), 404)
    assert body["type"].endswith("/job-not-found")

    body = await problem(await _act(api, api.admin_token, array_id, "suspend"), 409)
    _assert_names_a_task(
        body, array_id, "POST /v1/jobs/{id}/suspend", f"POST /v1/jobs/{array_id}_0/suspend"
    )


async def test_requeue_of_a_held_job_says_to_release_it(api: Api) -> None:
    token = await api.tenant("vision")
    job_id = await api.submitted(token, job_spec(name="train"))
    assert (await _act(api, token, job_id, "hold")).status == 200

    body = await problem(await _act(api, token, job_id, "requeue"), 409)
    assert body["type"].endswith("/not-placed")
    assert body["detail"] == (
        f"job {job_id} is held: only a scheduled or running job can be requeued; a held one "
        "is out of the queue: release it to queue it again"
    )
    assert "in the queue already" not in body["detail"]


async def test_requeue_of_a_suspended_job_says_to_resume_it(api: Api) -> None:
    token = await api.tenant("vision")
    job_id = await api.submitted(token, job_spec(name="train"))
    assert (await _act(api, token, job_id, "suspend")).status == 200

    body = await problem(await _act(api, token, job_id, "requeue"), 409)
    assert body["type"].endswith("/not-placed")
    assert body["detail"] == (
        f"job {job_id} is suspended: only a scheduled or running job can be requeued; a "
        "suspended one is out of the queue: resume it to queue it again"
    )


async def test_requeue_of_a_queued_job_still_says_it_is_queued(api: Api) -> None:
    token = await api.tenant("vision")
    job_id = await api.submitted(token, job_spec(name="train"))

    body = await problem(await _act(api, token, job_id, "requeue"), 409)
    assert body["detail"] == (
        f"job {job_id} is pending: only a scheduled or running job can be requeued; a "
        "pending one is in the queue already"
    )
