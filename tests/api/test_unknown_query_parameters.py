"""A query parameter a route does not take is a 400 `invalid-query` naming it, on every
route, including those that take none: `DELETE /v1/jobs/ID?dry_run=true` must not
cancel, nor `GET /v1/jobs/ID?tenant=bob` answer with the caller's own job as if the
parameter counted. Both backends."""

from __future__ import annotations

from typing import Any

from cloud.api.query import UNDECODABLE_REASON
from cloud.api.routes import REGISTERED_ROUTES
from tests.api.support import Api, bearer, job_spec, problem


async def refused_naming(response: Any, *names: str) -> dict[str, Any]:
    found = await problem(response, 400)
    assert found["type"].endswith("/invalid-query"), found
    assert found["invalid_params"] == [
        {"name": name, "reason": "unknown parameter"} for name in names
    ]
    return found


async def test_every_route_that_takes_no_query_refuses_a_parameter(api: Api) -> None:
    acme = await api.tenant("acme")
    job_id = await api.submitted(acme, job_spec())
    model_id = await api.model(acme)
    path_values = {
        "{id}": job_id,
        "{node_id}": "n1",
        "{zone}": "DE",
        "{tenant}": "acme",
        "{name}": "c1",
        "{version}": "1.0.0",
        "{rollout_id}": "r1",
        "{token_id}": "0123456789abcdef",
    }
    checked = []
    for route in api.app[REGISTERED_ROUTES]:
        if route.query is not None or route.ignores_query:
            continue
        path = route.path
        for placeholder, value in path_values.items():
            path = path.replace(placeholder, model_id if "/models/" in path else value)
        if route.access == "signed":
            # A signed download's `sig` is its credential, the one parameter it takes.
            response = await api.client.request(route.method, f"{path}?sig=00&bogus=1")
        else:
            token = api.admin_token if route.access == "admin" else acme
            headers = {} if route.access in ("public", "scrape") else bearer(token)
            response = await api.client.request(route.method, f"{path}?bogus=1", headers=headers)
        await refused_naming(response, "bogus")
        checked.append(f"{route.method} {route.path}")
    assert "DELETE /v1/jobs/{id}" in checked
    assert "GET /v1/tenants" in checked
    # Nothing was done: the job is still pending (not cancelled, held or changed).
    job = await (await api.get(acme, f"/v1/jobs/{job_id}")).json()
    assert (job["state"], job["priority"], job["reason"]) == ("pending", "p1", None)


async def test_a_parameter_that_does_not_count_is_refused_not_ignored(api: Api) -> None:
    acme = await api.tenant("acme")
    await api.tenant("bob")
    job_id = await api.submitted(acme, job_spec())
    job = f"/v1/jobs/{job_id}"

    await refused_naming(await api.get(acme, f"{job}?tenant=bob"), "tenant")
    await refused_naming(await api.get(api.admin_token, "/v1/tenants?tenant=acme"), "tenant")
    patched = await api.client.patch(
        f"{job}?dry_run=true", json={"priority": "p2"}, headers=bearer(acme)
    )
    await refused_naming(patched, "dry_run")
    cancelled = await api.client.delete(f"{job}?dry_run=true", headers=bearer(acme))
    await refused_naming(cancelled, "dry_run")
    view = await (await api.get(acme, job)).json()
    assert (view["state"], view["priority"]) == ("pending", "p1")

    # Every unknown one is named, each once; an empty query is no parameter.
    both = await api.get(acme, f"{job}?b=1&a=2&b=3")
    found = await refused_naming(both, "b", "a")
    assert found["detail"] == "b: unknown parameter; a: unknown parameter"
    assert (await api.get(acme, f"{job}?")).status == 200
    # A name that is not text is named escaped, as on routes that take parameters.
    undecodable = await problem(await api.get(acme, f"{job}?%FF=1"), 400)
    assert undecodable["invalid_params"] == [{"name": "\\ufffd", "reason": UNDECODABLE_REASON}]


async def test_a_signed_download_still_takes_its_signature(api: Api) -> None:
    acme = await api.tenant("acme")
    model_id = await api.model(acme)
    # The tenant's own download, with its token and no parameter at all.
    response = await api.get(acme, f"/v1/models/{model_id}/blob")
    assert response.status == 200, await response.text()
    # A signature that is not ours is the same 403 as before, not a 400.
    forged = await api.client.get(f"/v1/models/{model_id}/blob?sig=%FF")
    assert (await problem(forged, 403))["type"].endswith("/bad-signature")


async def test_the_dashboard_opens_from_a_link_with_parameters(api: Api) -> None:
    # A browser page: a campaign tag or a cache buster on its link changes nothing.
    page = await api.client.get("/ui?utm_source=mail")
    assert page.status == 200, await page.text()
    script = await api.client.get("/ui/static/app.js?v=2")
    assert script.status == 200, await script.text()
