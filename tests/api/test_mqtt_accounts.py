"""`/v1/mqtt/accounts`: admin only, names checked, and where this control plane does
not manage the broker's accounts a 409 that says so (the accounts themselves, on the
embedded broker and on Mosquitto, are tested in tests/integration/)."""

from __future__ import annotations

import pytest

from tests.api.support import Api, bearer, problem

pytestmark = pytest.mark.parametrize("database", ["sqlite"], indirect=True)


async def test_accounts_are_admin_only_and_checked(api: Api) -> None:
    tenant = await api.tenant("acme")
    body = {"name": "dashboard"}
    await problem(
        await api.client.post("/v1/mqtt/accounts", json=body, headers=bearer(tenant)), 403
    )
    await problem(
        await api.client.delete("/v1/mqtt/accounts/dashboard", headers=bearer(tenant)), 403
    )
    for bad, field in (({"name": "a/b"}, "$.name"), ({"name": "x", "role": "admin"}, "$.role")):
        response = await api.client.post(
            "/v1/mqtt/accounts", json=bad, headers=bearer(api.admin_token)
        )
        refused = await problem(response, 422)
        assert refused["invalid_params"][0]["name"] == field
    # This control plane's broker accounts are made by hand (`broker_accounts = "none"`).
    response = await api.client.post(
        "/v1/mqtt/accounts", json=body, headers=bearer(api.admin_token)
    )
    refused = await problem(response, 409)
    assert refused["type"].endswith("/mqtt-accounts-not-managed")
    assert "by hand" in refused["detail"]
