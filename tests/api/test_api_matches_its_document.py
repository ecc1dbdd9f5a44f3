"""The disagreements between the OpenAPI document and the API that Schemathesis found
(issue 25), each pinned: a model download's `sig`, `Allow` on 405, a body that may be
left out, integers written as 445.0, `limit=1e3`, repeated query parameters and
`PATCH {}`. tests/api/test_openapi_schemathesis.py looks for any other."""

from __future__ import annotations

from typing import Any

from cloud.app_keys import REGISTRY
from tests.api.support import Api, bearer, deployment_spec, problem
from tests.loop.builders import node


async def document(api: Api) -> dict[str, Any]:
    body: dict[str, Any] = await (await api.client.get("/openapi.json")).json()
    return body


async def test_a_405_allows_exactly_the_methods_of_the_path_the_document_gives(
    api: Api,
) -> None:
    paths = (await document(api))["paths"]
    admin = bearer(api.admin_token)
    for method, path, documented in (
        ("PUT", "/v1/nodes/enrol", "/v1/nodes/enrol"),  # not /v1/nodes/{node_id} for "enrol"
        ("PUT", "/v1/nodes/enrolled", "/v1/nodes/enrolled"),
        ("PUT", "/v1/nodes/join-tokens", "/v1/nodes/join-tokens"),
        # Methods on three resources (cloud/api/apply.py's PUT, then work.py's).
        ("POST", "/v1/deployments/x", "/v1/deployments/{id}"),
        ("PUT", "/v1/jobs", "/v1/jobs"),
        ("PUT", "/v1/jobs/dry-run", "/v1/jobs/dry-run"),  # not /v1/jobs/{id} for "dry-run"
    ):
        response = await api.client.request(method, path, headers=admin)
        await problem(response, 405)
        allowed = set(response.headers["Allow"].split(","))
        expected = {method.upper() for method in paths[documented]}
        assert allowed - {"HEAD"} == expected, path
    # GET /v1/nodes/enrol is the enrolment's public key, no node called "enrol".
    answer = await api.client.get("/v1/nodes/enrol", headers=admin)
    assert answer.status == 200, await answer.text()
    assert set(await answer.json()) == {"exchange_key"}


async def test_integers_may_be_written_with_a_zero_fraction_as_json_schema_says(
    api: Api,
) -> None:
    admin = bearer(api.admin_token)
    response = await api.client.post(
        "/v1/tenants", json={"name": "acme", "quotas": {"gpu": 445.0}, "max_running": 2e1},
        headers=admin,
    )  # fmt: skip
    assert response.status == 201, await response.text()
    created = await response.json()
    assert (created["quotas"], created["max_running"]) == ({"gpu": 445}, 20)
    fraction = await api.client.post(
        "/v1/tenants", json={"name": "globex", "quotas": {"gpu": 1.5}}, headers=admin
    )
    assert (await problem(fraction, 422))["invalid_params"][0]["name"] == "$.quotas[...]"
    text = await api.client.post(
        "/v1/tenants", json={"name": "initech", "quotas": {"gpu": "4"}}, headers=admin
    )
    await problem(text, 422)


async def test_query_values_are_held_to_how_the_document_writes_them(api: Api) -> None:
    admin = bearer(api.admin_token)
    for query, name in (
        ("limit=1e3", "limit"),
        ("limit=10.0", "limit"),
        ("limit=5&limit=6", "limit"),
        ("state=null", "state"),
        ("kind=gpu&kind=gpu", "kind"),
    ):
        body = await problem(await api.client.get(f"/v1/nodes?{query}", headers=admin), 400)
        assert body["invalid_params"][0]["name"] == name, query
    for query, name in (
        ("state=pending,,running", "state"),
        ("state=pending, running", "state"),
        ("priority=", "priority"),
    ):
        body = await problem(await api.client.get(f"/v1/jobs?{query}", headers=admin), 400)
        assert body["invalid_params"][0]["name"] == name, query
    for query, name in (
        ("since=2026-12-01 00:00:00Z", "since"),
        ("since=2026-12-01T00:00:00", "since"),
        ("since=2026-12-01T00:00:00%2B0100", "since"),
    ):
        body = await problem(await api.client.get(f"/v1/audit?{query}", headers=admin), 400)
        assert body["invalid_params"][0]["name"] == name, query
    for query in ("limit=1000", "state=online", "kind=gpu&site=cloud"):
        assert (await api.client.get(f"/v1/nodes?{query}", headers=admin)).status == 200
    ok = await api.client.get("/v1/audit?since=2026-12-01T00:00:00%2B01:00", headers=admin)
    assert ok.status == 200, await ok.text()


async def test_a_patch_that_changes_nothing_is_refused(api: Api) -> None:
    api.app[REGISTRY].apply_status(node("gpu-1").status)
    token = await api.tenant("acme")
    admin = bearer(api.admin_token)
    deployment = await api.submitted(
        token, deployment_spec(await api.model(token)), collection="deployments"
    )
    for path, body in (
        ("/v1/tenants/acme", {}),
        (f"/v1/deployments/{deployment}", {}),
        (f"/v1/deployments/{deployment}", {"model_id": None}),
        ("/v1/nodes/gpu-1", {}),
        ("/v1/nodes/gpu-1", {"labels": None, "taints": None}),
    ):
        refused = await problem(await api.client.patch(path, json=body, headers=admin), 422)
        assert "nothing to change" in refused["detail"], (path, body)
    version = (await (await api.get(token, f"/v1/deployments/{deployment}")).json())["version"]
    assert version == 1  # nothing was written
    # null is a change where the document says so: it removes a tenant's cap.
    uncapped = await api.client.patch("/v1/tenants/acme", json={"max_running": None}, headers=admin)
    assert uncapped.status == 200, await uncapped.text()


async def test_the_optional_rotate_body_and_the_download_signature_are_documented(
    api: Api,
) -> None:
    token = await api.tenant("acme")
    listed = await (await api.get(token, "/v1/tokens")).json()
    (own,) = listed["items"]
    rotated = await api.client.post(f"/v1/tokens/{own['id']}/rotate", headers=bearer(token))
    assert rotated.status == 201, await rotated.text()  # no body: the default overlap
    paths = (await document(api))["paths"]
    blob = paths["/v1/models/{id}/blob"]["get"]
    assert {"bearer": []} in blob["security"]
    assert {"signature": []} in blob["security"]


async def test_autoscale_bounds_that_leave_out_the_current_count_bring_it_inside(
    api: Api,
) -> None:
    """Found by Schemathesis: the old count was checked against the new bounds (a 500)."""
    token = await api.tenant("acme")
    deployment = await api.submitted(
        token, deployment_spec(await api.model(token), replicas=2), collection="deployments"
    )
    autoscale = {"min_replicas": 5.0, "max_replicas": 8, "target_requests_per_s": 10.0}
    response = await api.client.patch(
        f"/v1/deployments/{deployment}", json={"autoscale": autoscale}, headers=bearer(token)
    )
    assert response.status == 200, await response.text()
    assert (await response.json())["replicas"] == 5
