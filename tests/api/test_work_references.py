"""Work reached by name or a unique id prefix wherever an id is taken (both databases)."""

from __future__ import annotations

from tests.api.support import Api, bearer, deployment_spec, job_spec, problem


async def test_a_job_is_reached_by_its_name_and_by_a_unique_prefix_of_its_id(api: Api) -> None:
    token = await api.tenant("acme")
    job_id = await api.submitted(token, job_spec(name="train-a"))
    other = await api.submitted(token, job_spec(name="train-b"))

    by_name = await api.get(token, "/v1/jobs/train-a")
    assert by_name.status == 200, await by_name.text()
    assert (await by_name.json())["id"] == job_id
    explained = await api.get(token, "/v1/jobs/train-b/explain")
    assert (await explained.json())["id"] == other
    # A prefix that only one id has: the ids share their leading time, so take the
    # longest common start of the two and one character more.
    common = 0
    while job_id[common] == other[common]:
        common += 1
    prefix = job_id[: max(common + 1, 4)]
    shown = await api.get(token, f"/v1/jobs/{prefix.lower()}")
    assert (await shown.json())["id"] == job_id

    # A prefix both ids start with is ambiguous, and the problem names them.
    if common >= 4:
        body = await problem(await api.get(token, f"/v1/jobs/{job_id[:common]}"), 409)
        assert body["invalid_params"][0]["name"] == "id"
        assert job_id in body["detail"]
        assert other in body["detail"]
    await problem(await api.get(token, "/v1/jobs/no-such-job"), 404)
    # A name is the job's, not a deployment's of the same name.
    await problem(await api.get(token, "/v1/deployments/train-a"), 404)

    # Cancel by name: the state change goes through the same route.
    cancelled = await api.client.delete("/v1/jobs/train-a", headers=bearer(token))
    assert cancelled.status == 200, await cancelled.text()
    assert (await cancelled.json())["state"] == "cancelled"


async def test_a_reused_name_means_the_live_work_else_the_newest(api: Api) -> None:
    token = await api.tenant("acme")
    first = await api.submitted(token, job_spec(name="nightly"))
    second = await api.submitted(token, job_spec(name="nightly"))
    body = await problem(await api.get(token, "/v1/jobs/nightly"), 409)
    assert first in body["detail"]
    assert second in body["detail"]
    assert "name 'nightly'" in body["detail"]

    await api.client.delete(f"/v1/jobs/{first}", headers=bearer(token))
    assert (await (await api.get(token, "/v1/jobs/nightly")).json())["id"] == second
    await api.client.delete(f"/v1/jobs/{second}", headers=bearer(token))
    # Both ended: the newest.
    assert (await (await api.get(token, "/v1/jobs/nightly")).json())["id"] == second


async def test_names_stay_within_the_tenant_and_the_admin_reaches_every_tenants(api: Api) -> None:
    acme = await api.tenant("acme")
    globex = await api.tenant("globex")
    model = await api.model(acme)
    deployment = await api.submitted(
        acme, deployment_spec(model, name="detector"), collection="deployments"
    )
    await problem(await api.get(globex, "/v1/deployments/detector"), 404)
    await problem(await api.get(globex, f"/v1/deployments/{deployment[:20]}"), 404)
    seen = await api.get(api.admin_token, "/v1/deployments/detector")
    assert (await seen.json())["id"] == deployment
    changed = await api.client.patch(
        "/v1/deployments/detector", json={"replicas": 3}, headers=bearer(acme)
    )
    assert changed.status == 200, await changed.text()
    assert (await changed.json())["replicas"] == 3


async def test_a_spec_waits_for_jobs_by_name_stored_by_their_ids(api: Api) -> None:
    token = await api.tenant("acme")
    prep = await api.submitted(token, job_spec(name="prep"))
    after = {"name": "train", "depends_on": [{"job": "prep"}]}
    train = await api.submit(token, job_spec(**after))
    assert train.status == 201, await train.text()
    body = await train.json()
    assert body["spec"]["depends_on"] == [{"job": prep, "condition": "succeeded"}]
    shown = await (await api.get(token, f"/v1/jobs/{body['id']}")).json()
    assert [waited["id"] for waited in shown["waits_for"]] == [prep]

    # Nothing of that name, or two live jobs of it: a 422 on the dependency.
    unknown = await api.submit(token, job_spec(name="x", depends_on=[{"job": "nothing"}]))
    assert [p["name"] for p in (await problem(unknown, 422))["invalid_params"]] == [
        "$.depends_on[0].job"
    ]
    await api.submitted(token, job_spec(name="prep"))
    twice = await api.submit(token, job_spec(name="y", depends_on=[{"job": "prep"}]))
    body = await problem(twice, 422)
    assert [p["name"] for p in body["invalid_params"]] == ["$.depends_on[0].job"]
    assert prep in body["detail"]


async def test_one_job_named_by_its_name_and_by_its_id_is_a_422_on_the_dependency(
    api: Api,
) -> None:
    """Once names are resolved to ids, a job waited for twice is refused as a spec that
    names one id twice is (before: a 500), by every route that resolves them."""
    token = await api.tenant("acme")
    prep = await api.submitted(token, job_spec(name="prep"))
    model = await api.model(token)
    twice = [{"job": "prep", "condition": "succeeded"}, {"job": prep, "condition": "failed"}]
    for method, path, spec in (
        ("POST", "/v1/jobs", job_spec(name="train", depends_on=twice)),
        ("PUT", "/v1/jobs/train", job_spec(name="train", depends_on=twice)),
        ("PUT", "/v1/jobs/train?dry_run=true", job_spec(name="train", depends_on=twice)),
        ("POST", "/v1/jobs/dry-run", job_spec(name="train", depends_on=twice)),
        ("POST", "/v1/deployments", deployment_spec(model, depends_on=twice)),
        ("PUT", "/v1/deployments/detector", deployment_spec(model, depends_on=twice)),
    ):
        response = await api.client.request(method, path, json=spec, headers=bearer(token))
        body = await problem(response, 422)
        assert body["invalid_params"] == [
            {"name": "$.depends_on[1].job", "reason": f"names job {prep} twice"}
        ], (method, path)
    assert [w.work_id for w in (await api.store.list_work(None, limit=10)).items] == [prep]
