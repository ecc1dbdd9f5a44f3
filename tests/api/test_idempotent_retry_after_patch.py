"""A retry with an Idempotency-Key is safe after the work changed (docs/rest.md,
Idempotency): a PATCH, an apply or a deployment update changes the stored spec, and the
retry of the original submission still gets the work as it is now with 200, not a 409.
The key keeps naming what was submitted with it: another body is still a 409. Both
databases."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text

from tests.api.support import Api, bearer, deployment_spec, encode, job_spec, problem


async def _retried(api: Api, token: str, spec: dict[str, Any], key: str, **kwargs: Any) -> Any:
    response = await api.submit(token, spec, key=key, **kwargs)
    assert response.status == 200, await response.text()
    return await response.json()


async def _patched(api: Api, token: str, path: str, body: dict[str, Any]) -> Any:
    response = await api.client.patch(path, json=body, headers=bearer(token))
    assert response.status == 200, await response.text()
    return await response.json()


async def test_a_retry_after_a_patch_gets_the_job_as_it_is_now(api: Api) -> None:
    token = await api.tenant("acme")
    spec = job_spec(name="idem", accelerators_per_worker=4)
    job_id = await api.submitted(token, spec, key="run-1")
    await _patched(api, token, f"/v1/jobs/{job_id}", {"priority": "p0", "workers": 2})

    retried = await _retried(api, token, spec, "run-1")
    assert (retried["id"], retried["priority"], retried["workers"]) == (job_id, "p0", 2)
    assert retried == await (await api.get(token, f"/v1/jobs/{job_id}")).json()
    # The same submission however formatted: the key's fields in another order.
    reordered = await api.client.post(
        "/v1/jobs",
        data=encode({"accelerators_per_worker": 4, "command": spec["command"], "name": "idem"}),
        headers={**bearer(token), "Idempotency-Key": "run-1", "Content-Type": "application/json"},
    )
    assert reordered.status == 200, await reordered.text()
    assert (await reordered.json())["id"] == job_id

    # The key names what was submitted with it, not what the job became.
    as_patched = job_spec(name="idem", accelerators_per_worker=4, priority="p0", workers=2)
    reused = await problem(await api.submit(token, as_patched, key="run-1"), 409)
    assert reused["type"].endswith("/idempotency-key-reused")
    await problem(await api.submit(token, job_spec(name="other"), key="run-1"), 409)
    assert (await (await api.get(token, "/v1/jobs")).json())["count"] == 1


async def test_a_retry_after_an_apply_update_gets_the_job(api: Api) -> None:
    token = await api.tenant("acme")
    spec = job_spec(name="nightly")
    job_id = await api.submitted(token, spec, key="nightly-1")
    applied = await api.client.put(
        "/v1/jobs/nightly", json=job_spec(name="nightly", workers=3), headers=bearer(token)
    )
    assert applied.status == 200, await applied.text()
    assert (await applied.json())["action"] == "updated"

    retried = await _retried(api, token, spec, "nightly-1")
    assert (retried["id"], retried["workers"]) == (job_id, 3)


async def test_a_deployment_retry_after_an_update_gets_the_deployment(api: Api) -> None:
    token = await api.tenant("acme")
    spec = deployment_spec(await api.model(token))
    deployment_id = await api.submitted(token, spec, collection="deployments", key="serve-1")
    await _patched(api, token, f"/v1/deployments/{deployment_id}", {"replicas": 3})

    retried = await _retried(api, token, spec, "serve-1", collection="deployments")
    assert (retried["id"], retried["spec"]["replicas"]) == (deployment_id, 3)


async def test_an_array_retry_after_its_first_task_is_patched_gets_the_array(api: Api) -> None:
    token = await api.tenant("acme")
    spec = job_spec(name="sweep", array="0-2")
    array_id = await api.submitted(token, spec, key="sweep-1")
    # The first task holds the key: its spec is the one a retry is compared with.
    await _patched(api, token, f"/v1/jobs/{array_id}_0", {"priority": "p0"})

    retried = await _retried(api, token, spec, "sweep-1")
    assert retried["id"] == array_id
    assert [task["index"] for task in retried["array"]["tasks"]] == [0, 1, 2]
    assert retried["spec"]["array"] == "0-2"
    reused = await problem(
        await api.submit(token, job_spec(name="sweep", array="0-3"), key="sweep-1"), 409
    )
    assert reused["type"].endswith("/idempotency-key-reused")
    assert (await (await api.get(token, "/v1/jobs")).json())["count"] == 3


async def test_work_submitted_before_the_digest_is_compared_with_its_spec(api: Api) -> None:
    """A row from before store v25 has no digest: its retry is compared with the spec as
    stored, as before (a retry of it after a PATCH stays a 409 then)."""
    token = await api.tenant("acme")
    spec = job_spec(name="old")
    job_id = await api.submitted(token, spec, key="old-1")
    async with api.store._engine.begin() as connection:
        await connection.execute(
            text("UPDATE work SET submitted_spec_sha256 = NULL WHERE id = :id"), {"id": job_id}
        )
    assert (await _retried(api, token, spec, "old-1"))["id"] == job_id
    await problem(await api.submit(token, job_spec(name="old", workers=2), key="old-1"), 409)
