"""The admin's view of the whole fleet's work: every tenant's jobs and deployments
(`?tenant=` to pick one), any one of them, every tenant's events, cancelling another
tenant's work (named in its reason and event, and audited); the audit log; tenant
changes (`PATCH /v1/tenants/{tenant}`) and the queue cap. Both backends."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from urllib.parse import quote

from cloud.app_keys import REGISTRY
from tests.api.support import Api, SseReader, bearer, deployment_spec, job_spec, problem
from tests.loop.builders import node


async def listed(api: Api, token: str, path: str) -> list[tuple[str, str]]:
    response = await api.get(token, path)
    assert response.status == 200, await response.text()
    return [(item["tenant"], item["name"]) for item in (await response.json())["items"]]


async def audit(api: Api, query: str = "") -> list[dict[str, Any]]:
    response = await api.get(api.admin_token, f"/v1/audit{query}")
    assert response.status == 200, await response.text()
    body = await response.json()
    items: list[dict[str, Any]] = body["items"]
    return items


async def test_the_admin_sees_every_tenants_work_and_a_tenant_only_its_own(api: Api) -> None:
    acme = await api.tenant("acme")
    globex = await api.tenant("globex")
    await api.submitted(acme, job_spec(name="a-job"))
    theirs = await api.submitted(globex, job_spec(name="g-job"))
    await api.submitted(globex, deployment_spec(await api.model(globex)), collection="deployments")

    admin = api.admin_token
    assert await listed(api, admin, "/v1/jobs") == [("globex", "g-job"), ("acme", "a-job")]
    assert await listed(api, admin, "/v1/jobs?tenant=*") == [
        ("globex", "g-job"),
        ("acme", "a-job"),
    ]
    assert await listed(api, admin, "/v1/jobs?tenant=acme") == [("acme", "a-job")]
    assert await listed(api, admin, "/v1/deployments") == [("globex", "detector")]
    assert await listed(api, admin, "/v1/deployments?tenant=acme") == []
    await problem(await api.get(admin, "/v1/jobs?tenant=nobody"), 404)
    # A tenant sees its own, may name itself, and may not name another.
    assert await listed(api, acme, "/v1/jobs") == [("acme", "a-job")]
    assert await listed(api, acme, "/v1/jobs?tenant=acme") == [("acme", "a-job")]
    for query in ("?tenant=globex", "?tenant=*"):
        found = await problem(await api.get(acme, "/v1/jobs" + query), 403)
        assert found["type"].endswith("/admin-only")

    # One job of another tenant: the admin sees it and why it waits; a tenant does not.
    shown = await (await api.get(admin, f"/v1/jobs/{theirs}")).json()
    assert (shown["tenant"], shown["name"]) == ("globex", "g-job")
    assert (await api.get(admin, f"/v1/jobs/{theirs}/explain")).status == 200
    await problem(await api.get(acme, f"/v1/jobs/{theirs}"), 404)
    await problem(await api.client.delete(f"/v1/jobs/{theirs}", headers=bearer(acme)), 404)


async def test_the_admin_cancels_another_tenants_job_named_in_its_event_and_the_audit(
    api: Api,
) -> None:
    acme = await api.tenant("acme")
    globex = await api.tenant("globex")
    theirs = await api.submitted(globex, job_spec(name="g-job"))
    own = await api.submitted(acme, job_spec(name="a-job"))
    stream = await api.client.get("/v1/events?after=0", headers=bearer(api.admin_token))
    reader = SseReader(stream)
    try:
        response = await api.client.delete(f"/v1/jobs/{theirs}", headers=bearer(api.admin_token))
        assert response.status == 200, await response.text()
        cancelled = await response.json()
        assert (cancelled["state"], cancelled["tenant"]) == ("cancelled", "globex")
        assert cancelled["reason"] == "cancelled by admin admin"
        # The tenant sees who did it.
        seen = await (await api.get(globex, f"/v1/jobs/{theirs}")).json()
        assert seen["reason"] == "cancelled by admin admin"
        assert (await api.client.delete(f"/v1/jobs/{own}", headers=bearer(acme))).status == 200

        # The admin's stream carries every tenant's events, with whose they are.
        events = [await reader.next() for _ in range(4)]
    finally:
        stream.close()
    states = [
        (e.data["tenant"], e.data["payload"]["work_id"], e.data["payload"]["state"],
         e.data["payload"]["actor"])
        for e in events
    ]  # fmt: skip
    assert states == [
        ("globex", theirs, "pending", None),
        ("acme", own, "pending", None),
        ("globex", theirs, "cancelled", "admin"),
        ("acme", own, "cancelled", "acme"),
    ]
    # A tenant's stream holds only its own; it may not ask for another's.
    own_stream = await api.client.get("/v1/events?after=0", headers=bearer(globex))
    try:
        mine = [await SseReader(own_stream).next() for _ in range(2)]
    finally:
        own_stream.close()
    assert {e.data["tenant"] for e in mine} == {"globex"}
    await problem(await api.get(globex, "/v1/events?tenant=acme"), 403)
    one = await api.client.get("/v1/events?after=0&tenant=acme", headers=bearer(api.admin_token))
    try:
        picked = [await SseReader(one).next() for _ in range(2)]
    finally:
        one.close()
    assert [e.data["payload"]["work_id"] for e in picked] == [own, own]

    # The admin's cancellation is audited; the tenant's own is not an admin action.
    (entry,) = await audit(api, "?action=work.cancel")
    assert (entry["actor"], entry["target"]) == ("admin", theirs)
    assert entry["detail"] == {"tenant": "globex", "kind": "job", "state": "pending"}


async def test_the_audit_log_records_admin_actions_newest_first_a_page_at_a_time(
    api: Api,
) -> None:
    api.app[REGISTRY].apply_status(node("gpu-1").status)
    await api.tenant("acme", quotas={"gpu": 4})
    admin = bearer(api.admin_token)
    patched = await api.client.patch("/v1/tenants/acme", json={"max_running": 2}, headers=admin)
    assert patched.status == 200, await patched.text()
    for action in ("cordon", "uncordon", "drain"):
        response = await api.client.post(f"/v1/nodes/gpu-1/{action}", headers=admin)
        assert response.status == 200, await response.text()
    response = await api.client.post("/v1/nodes/join-tokens", json={}, headers=admin)
    assert response.status == 201, await response.text()
    join_token = (await response.json())["id"]

    entries = await audit(api)
    assert [(e["action"], e["target"]) for e in entries] == [
        ("join-token.create", join_token),
        ("node.drain", "gpu-1"),
        ("node.uncordon", "gpu-1"),
        ("node.cordon", "gpu-1"),
        ("tenant.update", "acme"),
        ("tenant.create", "acme"),
    ]
    assert {e["actor"] for e in entries} == {"admin"}
    assert entries[4]["detail"] == {"max_running": {"from": None, "to": 2}}
    assert entries[5]["detail"]["quotas"] == {"gpu": 4}
    first = await (await api.get(api.admin_token, "/v1/audit?limit=2")).json()
    assert [e["action"] for e in first["items"]] == ["join-token.create", "node.drain"]
    rest = await audit(api, f"?limit=10&cursor={first['next_cursor']}")
    assert [e["action"] for e in rest] == [e["action"] for e in entries[2:]]
    assert [e["action"] for e in await audit(api, "?action=node.cordon,tenant.create")] == [
        "node.cordon",
        "tenant.create",
    ]
    assert await audit(api, "?actor=acme") == []
    times = [datetime.fromisoformat(e["at"].replace("Z", "+00:00")) for e in entries[:2]]
    since = quote((times[1] + (times[0] - times[1]) / 2).isoformat())
    assert [e["action"] for e in await audit(api, f"?since={since}")] == ["join-token.create"]
    bad = await problem(await api.get(api.admin_token, "/v1/audit?action=coffee.make"), 400)
    assert bad["invalid_params"][0]["name"] == "action"
    tenant = await api.tenant("globex")
    await problem(await api.get(tenant, "/v1/audit"), 403)


async def test_patching_a_tenant_changes_what_is_named_and_unlimited_is_explicit(
    api: Api,
) -> None:
    admin = bearer(api.admin_token)
    await api.tenant("acme")
    tenants = {
        t["name"]: t
        for t in (await (await api.get(api.admin_token, "/v1/tenants")).json())["items"]
    }
    assert tenants["acme"]["unlimited"] is True
    assert (tenants["acme"]["max_running"], tenants["acme"]["max_queued"]) == (None, None)

    response = await api.client.patch(
        "/v1/tenants/acme",
        json={"quotas": {"gpu": 2}, "cohort": "lab", "allowed_priorities": ["p1"], "max_queued": 5},
        headers=admin,
    )
    assert response.status == 200, await response.text()
    body = await response.json()
    assert (body["quotas"], body["cohort"], body["allowed_priorities"]) == (
        {"gpu": 2},
        "lab",
        ["p1"],
    )
    assert (body["max_queued"], body["max_running"], body["unlimited"]) == (5, None, False)
    # Its token sees the change at once (a p0 job is no longer allowed).
    token = await api.store.create_token(body["id"], "t")
    refused = await api.submit(token.token, job_spec(priority="p0"))
    assert (await problem(refused, 403))["type"].endswith("/priority-not-allowed")
    # By id as well as by name; null removes; what is not named stays.
    response = await api.client.patch(
        f"/v1/tenants/{body['id']}", json={"cohort": None, "max_queued": None}, headers=admin
    )
    again = await response.json()
    assert (again["cohort"], again["max_queued"], again["quotas"]) == (None, None, {"gpu": 2})
    free = await api.client.patch("/v1/tenants/acme", json={"quotas": {}}, headers=admin)
    assert (await free.json())["unlimited"] is True

    for body_, name in (
        ({"quotas": {"tpu": 1}}, "$.quotas"),
        ({"max_running": -1}, "$.max_running"),
        ({"allowed_priorities": []}, "$.allowed_priorities"),
        ({"admin": True}, "$.admin"),
    ):
        bad = await api.client.patch("/v1/tenants/acme", json=body_, headers=admin)
        assert (await problem(bad, 422))["invalid_params"][0]["name"].startswith(name), body_
    await problem(await api.client.patch("/v1/tenants/nobody", json={}, headers=admin), 404)
    tenant = await api.tenant("globex")
    await problem(
        await api.client.patch("/v1/tenants/globex", json={}, headers=bearer(tenant)), 403
    )


async def test_a_submission_beyond_max_queued_is_a_429_naming_the_limit(api: Api) -> None:
    acme = await api.tenant("acme", max_queued=2)
    first = await api.submitted(acme, job_spec(name="one"), key="k1")
    await api.submitted(acme, deployment_spec(await api.model(acme)), collection="deployments")
    refused = await api.submit(acme, job_spec(name="three"))
    found = await problem(refused, 429)
    assert found["type"].endswith("/queue-full")
    assert "tenant acme has 2 pending jobs and deployments, its max_queued of 2" in found["detail"]
    retry = await api.submit(acme, job_spec(name="one"), key="k1")  # a retry is answered
    assert (retry.status, (await retry.json())["id"]) == (200, first)
    assert (await api.client.delete(f"/v1/jobs/{first}", headers=bearer(acme))).status == 200
    assert (await api.submit(acme, job_spec(name="three"))).status == 201
    # Another tenant's queue is its own.
    other = await api.tenant("globex")
    assert (await api.submit(other, job_spec())).status == 201


async def test_the_admin_changes_another_tenants_deployment_and_the_audit_says_so(
    api: Api,
) -> None:
    acme = await api.tenant("acme")
    globex = await api.tenant("globex")
    model = await api.model(globex)
    theirs = await api.submitted(globex, deployment_spec(model), collection="deployments")
    admin = bearer(api.admin_token)
    path = f"/v1/deployments/{theirs}"

    response = await api.client.patch(path, json={"replicas": 3}, headers=admin)
    assert response.status == 200, await response.text()
    changed = await response.json()
    assert (changed["tenant"], changed["replicas"]) == ("globex", 3)
    seen = await (await api.get(globex, path)).json()
    assert seen["replicas"] == 3
    # A model_id names a model of the deployment's tenant, not the admin's.
    newer = await api.model(globex, name="mlp-2")
    switched = await api.client.patch(path, json={"model_id": newer}, headers=admin)
    assert switched.status == 200, await switched.text()
    own_model = await api.model(api.admin_token)
    refused = await api.client.patch(path, json={"model_id": own_model}, headers=admin)
    assert (await problem(refused, 422))["invalid_params"][0]["name"] == "$.model_id"

    # Another tenant does not find it; its owner's own change is no admin action.
    await problem(await api.client.patch(path, json={"replicas": 1}, headers=bearer(acme)), 404)
    mine = await api.client.patch(path, json={"replicas": 2}, headers=bearer(globex))
    assert mine.status == 200, await mine.text()
    entries = await audit(api, "?action=work.update")
    assert [(e["actor"], e["target"], e["detail"]) for e in entries] == [
        (
            "admin",
            theirs,
            {"tenant": "globex", "kind": "deployment", "changes": {"model_id": newer}},
        ),
        ("admin", theirs, {"tenant": "globex", "kind": "deployment", "changes": {"replicas": 3}}),
    ]
