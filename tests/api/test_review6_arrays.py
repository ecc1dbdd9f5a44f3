"""Review 6, job arrays and idempotent retries. Both databases.

Bug A: `PUT /v1/jobs/{name}` of a live job array's name answers a 409 naming the array
once (its id, its tasks not ended, what to do instead), however many tasks it has, as
every other route taking a name counts an array once: never its tasks one by one, nor
the one task left of it taken for the name's job.

Bug B: work submitted with an Idempotency-Key before store v25 keeps no record of what
was submitted. Once a PATCH changed it, a retry of the original cannot be told from
another body: it stays a 409 (nothing proves it is the same submission), and the 409
says why and what to do instead of "another request body"."""

from __future__ import annotations

from typing import Any

from aiohttp import ClientResponse
from sqlalchemy import text

from tests.api.support import Api, bearer, deployment_spec, job_spec, problem

TASKS = "0-11"  # 12 tasks: more than a name lookup reads at once (11)


async def _apply(api: Api, token: str, spec: dict[str, Any], query: str = "") -> ClientResponse:
    return await api.client.put(f"/v1/jobs/{spec['name']}{query}", json=spec, headers=bearer(token))


async def _task_ids(api: Api, token: str, array_id: str) -> list[str]:
    shown = await (await api.get(token, f"/v1/jobs/{array_id}")).json()
    return [task["id"] for task in shown["array"]["tasks"]]


async def _job_count(api: Api, token: str) -> int:
    count: int = (await (await api.get(token, "/v1/jobs")).json())["count"]
    return count


async def test_applying_a_live_arrays_name_names_the_array_once(api: Api) -> None:
    token = await api.tenant("vision")
    array_id = await api.submitted(token, job_spec(name="sweep", array=TASKS))
    task_ids = await _task_ids(api, token, array_id)

    for query in ("", "?dry_run=true"):
        response = await _apply(api, token, job_spec(name="sweep", workers=2), query)
        raw = await response.text()
        body = await problem(response, 409)
        assert body["type"].endswith("/job-array")
        assert body["detail"].count(array_id) == 3  # the array, how to cancel it, its tasks
        assert "job sweep is job array" in body["detail"]
        assert "(12 tasks not ended)" in body["detail"]
        assert f"greenfed cancel {array_id}" in body["detail"]
        assert [p["name"] for p in body["invalid_params"]] == ["id"]
        assert not [task_id for task_id in task_ids if task_id in raw]
    assert await _job_count(api, token) == 12


async def test_applying_the_name_of_an_array_with_one_task_left_changes_no_task(
    api: Api,
) -> None:
    token = await api.tenant("vision")
    array_id = await api.submitted(token, job_spec(name="sweep", array="0-1"))
    cancelled = await api.client.delete(f"/v1/jobs/{array_id}_0", headers=bearer(token))
    assert cancelled.status == 200, await cancelled.text()

    body = await problem(await _apply(api, token, job_spec(name="sweep", workers=2)), 409)
    assert body["type"].endswith("/job-array")
    assert f"job array {array_id} (1 task not ended)" in body["detail"]
    left = await (await api.get(token, f"/v1/jobs/{array_id}_1")).json()
    assert (left["workers"], left["version"]) == (1, 1)


async def test_applying_a_name_of_a_job_and_an_array_lists_the_array_once(api: Api) -> None:
    token = await api.tenant("vision")
    single = await api.submitted(token, job_spec(name="sweep"))
    array_id = await api.submitted(token, job_spec(name="sweep", array=TASKS))
    task_ids = await _task_ids(api, token, array_id)

    response = await _apply(api, token, job_spec(name="sweep", workers=2))
    raw = await response.text()
    body = await problem(response, 409)
    assert body["type"].endswith("/ambiguous-reference")
    assert single in body["detail"]
    assert f"{array_id} (job array, 12 tasks not ended, submitted " in body["detail"]
    assert not [task_id for task_id in task_ids if task_id in raw]
    single_now = await (await api.get(token, f"/v1/jobs/{single}")).json()
    assert single_now["workers"] == 1


async def _forget_submitted_specs(api: Api, key: str) -> None:
    """As if stored before store v25: no digest of the spec as submitted."""
    async with api.store._engine.begin() as connection:
        await connection.execute(
            text("UPDATE work SET submitted_spec_sha256 = NULL WHERE idempotency_key = :key"),
            {"key": key},
        )


async def _patched(api: Api, token: str, path: str, body: dict[str, Any]) -> None:
    response = await api.client.patch(path, json=body, headers=bearer(token))
    assert response.status == 200, await response.text()


def _assert_says_why(body: dict[str, Any], shown_at: str) -> None:
    assert body["type"].endswith("/idempotency-key-reused")
    detail = body["detail"]
    assert "another request body" not in detail
    assert "store schema 25" in detail
    assert "changed since by a PATCH or an apply" in detail
    assert f"GET {shown_at} to see whether it is this submission" in detail
    assert "else use a new key" in detail


async def test_a_retry_of_a_job_from_before_v25_patched_since_says_why_it_is_refused(
    api: Api,
) -> None:
    token = await api.tenant("acme")
    spec = job_spec(name="old")
    job_id = await api.submitted(token, spec, key="old-1")
    await _forget_submitted_specs(api, "old-1")
    await _patched(api, token, f"/v1/jobs/{job_id}", {"workers": 2})

    body = await problem(await api.submit(token, spec, key="old-1"), 409)
    _assert_says_why(body, f"/v1/jobs/{job_id}")
    assert await _job_count(api, token) == 1
    # Work with its digest: another body is plainly another body.
    await api.submitted(token, job_spec(name="new"), key="new-1")
    reused = await problem(await api.submit(token, job_spec(name="other"), key="new-1"), 409)
    assert "was used for another request body" in reused["detail"]


async def test_a_retry_of_an_array_from_before_v25_patched_since_says_why_it_is_refused(
    api: Api,
) -> None:
    token = await api.tenant("acme")
    spec = job_spec(name="sweep", array="0-2")
    array_id = await api.submitted(token, spec, key="sweep-1")
    await _forget_submitted_specs(api, "sweep-1")
    await _patched(api, token, f"/v1/jobs/{array_id}_0", {"priority": "p0"})

    body = await problem(await api.submit(token, spec, key="sweep-1"), 409)
    _assert_says_why(body, f"/v1/jobs/{array_id}")
    # The key of an array retried as a single job: another submission, whatever it was.
    single = await problem(await api.submit(token, job_spec(name="sweep"), key="sweep-1"), 409)
    assert "was used for another request body" in single["detail"]
    assert await _job_count(api, token) == 3


async def test_a_retry_of_a_deployment_from_before_v25_updated_since_says_why(
    api: Api,
) -> None:
    token = await api.tenant("acme")
    spec = deployment_spec(await api.model(token))
    deployment_id = await api.submitted(token, spec, collection="deployments", key="serve-1")
    await _forget_submitted_specs(api, "serve-1")
    await _patched(api, token, f"/v1/deployments/{deployment_id}", {"replicas": 3})

    retried = await api.submit(token, spec, collection="deployments", key="serve-1")
    _assert_says_why(await problem(retried, 409), f"/v1/deployments/{deployment_id}")
    listed = await (await api.get(token, "/v1/deployments")).json()
    assert [item["id"] for item in listed["items"]] == [deployment_id]
