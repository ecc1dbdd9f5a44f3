"""`/v1/jobs` and `/v1/deployments` over HTTP, against the real app and both store backends."""

from __future__ import annotations

from cloud.store import NewAllocation, PassWrite, PlacementWrite
from tests.api.support import (
    Api,
    bearer,
    deployment_spec,
    encode,
    job_spec,
    problem,
)


async def test_a_submitted_job_is_committed_then_listed_and_shown(api: Api) -> None:
    token = await api.tenant("acme")
    response = await api.submit(token, job_spec(workers=2, memory_gib=40, priority="p2"))
    assert response.status == 201, await response.text()
    job = await response.json()
    assert response.headers["Location"] == f"/v1/jobs/{job['id']}"
    # Acknowledged only once committed: the store has it.
    stored = await api.store.get_work(await api.tenant_id(token), job["id"])
    assert stored is not None
    assert (stored.state, stored.priority, stored.kind) == ("pending", "p2", "training")
    assert job["state"] == "pending"
    assert (job["kind"], job["name"], job["tenant"], job["workers"]) == (
        "training",
        "train-resnet",
        "acme",
        2,
    )
    assert job["spec"]["memory_gib"] == 40
    assert job["spec"]["accelerator_kind"] == "gpu"  # defaults are filled in
    assert (job["allocations"], job["nodes"], job["attempts"]) == ([], [], 0)

    shown = await api.get(token, f"/v1/jobs/{job['id']}")
    assert shown.status == 200
    assert await shown.json() == job
    listed = await (await api.get(token, "/v1/jobs")).json()
    assert [item["id"] for item in listed["items"]] == [job["id"]]
    assert listed["items"][0]["state"] == "pending"
    assert listed["next_cursor"] is None
    # A job is not a deployment.
    await problem(await api.get(token, f"/v1/deployments/{job['id']}"), 404)
    deployments = await (await api.get(token, "/v1/deployments")).json()
    assert deployments["items"] == []


async def test_lists_filter_by_state_and_priority_and_page_newest_first(api: Api) -> None:
    token = await api.tenant("acme")
    ids = [
        await api.submitted(token, job_spec(name=f"job-{n}", priority=("p1", "p2")[n % 2]))
        for n in range(5)
    ]
    tenant_id = await api.tenant_id(token)
    await api.store.cancel_work(tenant_id, ids[0])

    first = await (await api.get(token, "/v1/jobs?limit=2")).json()
    assert [i["id"] for i in first["items"]] == [ids[4], ids[3]]
    second = await (await api.get(token, f"/v1/jobs?limit=2&cursor={first['next_cursor']}")).json()
    assert [i["id"] for i in second["items"]] == [ids[2], ids[1]]
    third = await (await api.get(token, f"/v1/jobs?limit=2&cursor={second['next_cursor']}")).json()
    assert [i["id"] for i in third["items"]] == [ids[0]]
    assert third["next_cursor"] is None

    pending = await (await api.get(token, "/v1/jobs?state=pending")).json()
    assert [i["id"] for i in pending["items"]] == ids[:0:-1]
    both = await (await api.get(token, "/v1/jobs?state=pending,cancelled&priority=p1")).json()
    assert [i["id"] for i in both["items"]] == [ids[4], ids[2], ids[0]]
    for query, name in (
        ("?state=sleeping", "state"),
        ("?priority=p9", "priority"),
        ("?limit=0", "limit"),
        # More digits than int() reads (4,300) was a 500.
        ("?limit=" + "1" * 4301, "limit"),
        ("?limit=" + "0" * 4300 + "1", "limit"),
        ("?cursor=nope", "cursor"),
        ("?sate=pending", "sate"),
    ):
        body = await problem(await api.get(token, f"/v1/jobs{query}"), 400)
        assert [p["name"] for p in body["invalid_params"]] == [name]


async def test_a_retry_with_the_idempotency_key_returns_the_original(api: Api) -> None:
    token = await api.tenant("acme")
    spec = job_spec(workers=2)
    first = await api.submit(token, spec, key="run-42")
    assert first.status == 201
    original = await first.json()
    # The same document, written differently (field order, defaults spelled out).
    retry = await api.client.post(
        "/v1/jobs",
        data=encode({"workers": 2, "priority": "p1", **job_spec()}),
        headers={**bearer(token), "Idempotency-Key": "run-42", "Content-Type": "application/json"},
    )
    assert retry.status == 200
    assert await retry.json() == original
    listed = await (await api.get(token, "/v1/jobs")).json()
    assert len(listed["items"]) == 1

    other_body = await problem(await api.submit(token, job_spec(workers=3), key="run-42"), 409)
    assert other_body["type"].endswith("/idempotency-key-reused")
    as_deployment = await api.submit(
        token, deployment_spec(await api.model(token)), collection="deployments", key="run-42"
    )
    await problem(as_deployment, 409)
    # A spec stored by an older greenfed lacks fields added since (they decode to their
    # defaults): its retry after an upgrade still finds it.
    old_document = encode({"kind": "training", "priority": "p1", **job_spec(workers=5)})
    stored = await api.store.submit_work(
        await api.tenant_id(token),
        kind="training",
        spec=old_document,
        priority="p1",
        idempotency_key="before-upgrade",
    )
    upgraded = await api.submit(token, job_spec(workers=5), key="before-upgrade")
    assert upgraded.status == 200
    assert (await upgraded.json())["id"] == stored.work.work_id
    # Keys are per tenant: another tenant's same key is a new job.
    other = await api.tenant("globex")
    assert (await api.submit(other, spec, key="run-42")).status == 201
    await problem(await api.submit(token, spec, key=""), 400)


async def test_deployments_have_their_own_collection(api: Api) -> None:
    token = await api.tenant("acme")
    model = await api.model(token)
    response = await api.submit(
        token, deployment_spec(model, min_replicas=1), collection="deployments"
    )
    assert response.status == 201, await response.text()
    deployment = await response.json()
    assert (deployment["kind"], deployment["replicas"], deployment["priority"]) == (
        "deployment",
        2,
        "p0",
    )
    assert deployment["spec"]["accepted_kinds"] == ["npu", "gpu", "cpu"]
    stored = await api.store.get_work(await api.tenant_id(token), deployment["id"])
    assert stored is not None
    assert stored.kind == "inference"
    listed = await (await api.get(token, "/v1/deployments")).json()
    assert [i["id"] for i in listed["items"]] == [deployment["id"]]
    await problem(await api.get(token, f"/v1/jobs/{deployment['id']}"), 404)
    await problem(
        await api.client.delete(f"/v1/jobs/{deployment['id']}", headers=bearer(token)), 404
    )
    cancelled = await api.client.delete(
        f"/v1/deployments/{deployment['id']}", headers=bearer(token)
    )
    assert (await cancelled.json())["state"] == "cancelled"
    bad = await api.submit(token, deployment_spec(model, min_replicas=3), collection="deployments")
    body = await problem(bad, 422)
    assert body["invalid_params"][0]["name"] == "$.min_replicas"
    # The model must be one of the tenant's own.
    others = await api.model(await api.tenant("globex"))
    for missing in ("no-such-model", others):
        unknown = await api.submit(token, deployment_spec(missing), collection="deployments")
        body = await problem(unknown, 422)
        assert body["invalid_params"][0]["name"] == "$.model_id"
        assert "upload it first" in body["detail"]


async def test_tenants_never_see_each_others_work(api: Api) -> None:
    acme, globex = await api.tenant("acme"), await api.tenant("globex")
    job = await api.submitted(acme, job_spec())
    deployment = await api.submitted(
        acme, deployment_spec(await api.model(acme)), collection="deployments"
    )
    for path in (
        f"/v1/jobs/{job}",
        f"/v1/jobs/{job}/explain",
        f"/v1/jobs/{job}/logs",
        f"/v1/deployments/{deployment}",
        f"/v1/deployments/{deployment}/explain",
    ):
        body = await problem(await api.get(globex, path), 404)
        assert body["status"] == 404
    await problem(await api.client.delete(f"/v1/jobs/{job}", headers=bearer(globex)), 404)
    for collection in ("jobs", "deployments"):
        listed = await (await api.get(globex, f"/v1/{collection}")).json()
        assert listed["items"] == []
    # Untouched by the attempts above.
    assert (await (await api.get(acme, f"/v1/jobs/{job}")).json())["state"] == "pending"
    # Not found and not someone else's look exactly alike.
    missing = await problem(await api.get(globex, "/v1/jobs/01ARZ3NDEKTSV4RRFFQ69G5FAV"), 404)
    foreign = await problem(await api.get(globex, f"/v1/jobs/{job}"), 404)
    assert missing["title"] == foreign["title"]


async def test_tokens_are_required_and_checked(api: Api) -> None:
    token = await api.tenant("acme")
    for path in ("/v1/jobs", "/v1/deployments", "/v1/events", "/v1/nodes", "/v1/signals"):
        response = await api.client.get(path)
        body = await problem(response, 401)
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
        assert body["type"].endswith("/unauthenticated")
    tampered = token[:-10] + ("A" if token[-10] != "A" else "B") + token[-9:]
    for bad in ("gf_0000000000000000_" + "x" * 43, "nonsense", tampered):
        response = await api.client.get("/v1/jobs", headers=bearer(bad))
        await problem(response, 401)
        assert 'error="invalid_token"' in response.headers["WWW-Authenticate"]
    response = await api.client.get("/v1/jobs", headers={"Authorization": f"Basic {token}"})
    await problem(response, 401)
    # Admin-only routes.
    body = await problem(await api.get(token, "/v1/tenants"), 403)
    assert body["type"].endswith("/admin-only")
    created = await api.client.post("/v1/tenants", json={"name": "x"}, headers=bearer(token))
    await problem(created, 403)
    # Public routes need nothing.
    for path in ("/healthz", "/metrics", "/openapi.json", "/v1/schemas"):
        assert (await api.client.get(path)).status == 200, path
    # Any valid token reads the fleet.
    assert (await api.get(token, "/v1/nodes")).status == 200
    assert (await api.get(token, "/v1/signals")).status == 200


_BAD_BODIES = [
    (b'{"name": "x", "command": ["a"]', 400, None),
    (b"[1, 2]", 422, "$"),
    (encode(job_spec(workers="two")), 422, "$.workers"),
    (encode(job_spec(workers=0)), 422, "$.workers"),
    (encode(job_spec(wokers=2)), 422, "$.wokers"),
    (encode({"command": ["a"]}), 422, "$.name"),
    (encode(job_spec(command=[])), 422, "$.command"),
    (encode(job_spec(start_window="25:00-06:00")), 422, "$.start_window"),
    (encode(job_spec(deadline="2030-01-01T00:00:00")), 422, "$.deadline"),
    (
        encode(job_spec(affinity=[{"key": "zone", "operator": "In"}])),
        422,
        "$.affinity[0].values",
    ),
    (
        encode(job_spec(tolerations=[{"key": "gpu", "effect": "x"}])),
        422,
        "$.tolerations[0].effect",
    ),
    (encode(job_spec(env={"CUDA_VISIBLE_DEVICES": "0"})), 422, "$.env"),
    (encode(job_spec(score_weights={"carbn": 1.0})), 422, "$.score_weights"),
    (encode(job_spec(kind="deployment")), 422, "$.kind"),
    # Past a float's range: refused by any decoding, named by the typed one.
    (b'{"name": "x", "command": ["a"], "memory_gib": 1e400}', 422, "$.memory_gib"),
    (b'{"name": "x", "command": ["a"], "workers": 1e400}', 422, "$.workers"),
]


async def test_invalid_bodies_are_problems_naming_the_field(api: Api) -> None:
    token = await api.tenant("acme")
    for body, status, name in _BAD_BODIES:
        response = await api.client.post(
            "/v1/jobs", data=body, headers={**bearer(token), "Content-Type": "application/json"}
        )
        found = await problem(response, status)
        if name is not None:
            assert [p["name"] for p in found["invalid_params"]] == [name], body
            assert name in found["detail"]
    listed = await (await api.get(token, "/v1/jobs")).json()
    assert listed["items"] == []


async def test_oversized_and_non_json_bodies_are_refused(api: Api) -> None:
    token = await api.tenant("acme")
    huge = encode(job_spec(env={"PAD": "x" * (1024 * 1024)}))
    response = await api.client.post(
        "/v1/jobs", data=huge, headers={**bearer(token), "Content-Type": "application/json"}
    )
    body = await problem(response, 413)
    assert body["type"].endswith("/payload-too-large")
    response = await api.client.post(
        "/v1/jobs",
        data=encode(job_spec()),
        headers={**bearer(token), "Content-Type": "application/x-www-form-urlencoded"},
    )
    body = await problem(response, 415)
    assert "application/json" in body["detail"]
    # Tenants are JSON too.
    form = await api.client.post(
        "/v1/tenants",
        data=b"name=x",
        headers={**bearer(api.admin_token), "Content-Type": "text/plain"},
    )
    await problem(form, 415)


async def test_a_priority_class_the_tenant_may_not_use_is_forbidden(api: Api) -> None:
    token = await api.tenant("interns", allowed_priorities=["p2"])
    body = await problem(await api.submit(token, job_spec(priority="p0")), 403)
    assert body["invalid_params"][0]["name"] == "$.priority"
    assert "p2" in body["detail"]
    # The deployment default (p0) is named too.
    body = await problem(
        await api.submit(token, deployment_spec("any-model"), collection="deployments"), 403
    )
    assert body["invalid_params"][0]["name"] == "$.priority"
    assert (await api.submit(token, job_spec(priority="p2"))).status == 201


async def test_cancelling_ends_work_once_and_frees_its_nodes(api: Api) -> None:
    token = await api.tenant("acme")
    tenant_id = await api.tenant_id(token)
    pending = await api.submitted(token, job_spec(name="waiting"))
    placed = await api.submitted(token, job_spec(name="placed", workers=2))
    lease = await api.store.try_acquire_leadership()
    assert lease is not None
    async with lease:
        await api.store.commit_pass(
            PassWrite(
                placements=(
                    PlacementWrite(
                        work_id=placed,
                        allocations=tuple(
                            NewAllocation(
                                member_index=index,
                                node_id=node,
                                accelerator_kind="gpu",
                                accelerators=1,
                                accelerator_ids=("0",),
                            )
                            for index, node in enumerate(("gpu-a", "gpu-b"))
                        ),
                    ),
                )
            ),
            lease=lease,
        )
    shown = await (await api.get(token, f"/v1/jobs/{placed}")).json()
    assert (shown["state"], shown["attempts"], shown["nodes"]) == (
        "scheduled",
        1,
        ["gpu-a", "gpu-b"],
    )
    assert [a["member"] for a in shown["allocations"]] == [0, 1]
    assert shown["allocations"][0]["accelerator_ids"] == ["0"]
    assert shown["allocations"][0]["state"] == "assigned"

    for work_id in (pending, placed):
        response = await api.client.delete(f"/v1/jobs/{work_id}", headers=bearer(token))
        assert response.status == 200, await response.text()
        body = await response.json()
        assert (body["state"], body["allocations"]) == ("cancelled", [])
        assert body["reason"] == "cancelled by the tenant"
        again = await problem(
            await api.client.delete(f"/v1/jobs/{work_id}", headers=bearer(token)), 409
        )
        assert again["type"].endswith("/already-finished")
    assert await api.store.work_allocations(tenant_id, placed) == ()
    assert (await api.store.node_generations())["gpu-a"] == 2  # told to stop it
