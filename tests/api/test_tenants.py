"""`/v1/tenants` and the admin bootstrap."""

from __future__ import annotations

import stat

from cloud.app_keys import REGISTRY
from shared.token_files import admin_token_path
from tests.api.support import Api, bearer, job_spec, problem, running_api
from tests.loop.builders import node
from tests.store.databases import DatabaseUnderTest


async def test_an_admin_creates_tenants_whose_token_is_shown_once(api: Api) -> None:
    response = await api.client.post(
        "/v1/tenants",
        json={
            "name": "research",
            "quotas": {"gpu": 8, "npu": 2},
            "borrowing_limit": {"gpu": 4},
            "cohort": "lab",
            "allowed_priorities": ["p1", "p2"],
        },
        headers=bearer(api.admin_token),
    )
    assert response.status == 201, await response.text()
    created = await response.json()
    assert created["token"].startswith("gf_")
    assert (created["name"], created["quotas"], created["borrowing_limit"]) == (
        "research",
        {"gpu": 8, "npu": 2},
        {"gpu": 4},
    )
    assert (created["cohort"], created["allowed_priorities"], created["admin"]) == (
        "lab",
        ["p1", "p2"],
        False,
    )
    stored = await api.store.authenticate(created["token"])
    assert stored is not None
    assert stored.tenant_id == created["id"]
    # The token works; it is never shown again.
    assert (await api.submit(created["token"], job_spec(priority="p1"))).status == 201
    listed = await (await api.get(api.admin_token, "/v1/tenants")).json()
    assert [t["name"] for t in listed["items"]] == ["admin", "research"]
    assert all("token" not in t for t in listed["items"])
    assert listed["items"][0]["admin"] is True

    again = await api.client.post(
        "/v1/tenants", json={"name": "research"}, headers=bearer(api.admin_token)
    )
    assert (await problem(again, 409))["type"].endswith("/tenant-exists")
    for body, name in (
        ({"name": "Bad Name"}, "$.name"),
        ({"name": "x", "quotas": {"tpu": 1}}, "$.quotas"),
        ({"name": "x", "quotas": {"gpu": -1}}, "$.quotas"),
        ({"name": "x", "allowed_priorities": []}, "$.allowed_priorities"),
        ({"name": "x", "color": "red"}, "$.color"),
    ):
        response = await api.client.post("/v1/tenants", json=body, headers=bearer(api.admin_token))
        found = await problem(response, 422)
        assert found["invalid_params"][0]["name"].startswith(name), (body, found)


async def test_the_first_start_writes_the_admin_token_for_its_owner_only(
    database: DatabaseUnderTest,
) -> None:
    path = admin_token_path(database.settings)
    async with running_api(database) as first:
        token = first.admin_token
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert path.read_text().strip() == token
        me = await first.store.authenticate(token)
        assert me is not None
        assert me.admin
    # A restart finds the admin: no second admin, the file unchanged, the token valid.
    async with running_api(database) as second:
        assert second.admin_token == token
        tenants = await second.store.list_tenants()
        assert [t.name for t in tenants if t.admin] == ["admin"]
        assert (await second.get(token, "/v1/tenants")).status == 200


async def test_a_tenant_named_like_a_cohort_does_not_lift_another_tenants_limit(
    api: Api,
) -> None:
    # alice lends all of her 2 GPU: her cohort lab holds at most 2, so a 4-GPU job can
    # never run. A tenant named "lab" (in another cohort) is not the cohort lab.
    alice = await api.tenant("alice", cohort="lab", quotas={"gpu": 2}, lending_limit={"gpu": 2})
    await api.tenant("lab", cohort="x", quotas={"gpu": 0}, lending_limit={"gpu": 0})
    api.app[REGISTRY].apply_status(node("gpu-a", gpus=4).status)
    response = await api.submit(alice, job_spec(accelerators_per_worker=4))
    found = await problem(response, 422)
    assert "at most 2 GPU" in found["detail"], found
