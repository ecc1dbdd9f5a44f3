"""`/v1/mqtt/accounts`: admin only, names checked, and where this control plane does
not manage the broker's accounts a 409 that says so (the accounts themselves, on the
embedded broker and on Mosquitto, are tested in tests/integration/)."""

from __future__ import annotations

from typing import Literal

import pytest

from shared.settings import CloudSettings
from tests.api.support import Api, bearer, problem, running_api
from tests.store.databases import DatabaseUnderTest

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


@pytest.mark.parametrize("broker_accounts", ["none", "dynamic-security"])
async def test_revoking_a_name_no_account_can_have_is_a_404_not_a_retry(
    database: DatabaseUnderTest, broker_accounts: Literal["none", "dynamic-security"]
) -> None:
    """A 503 with Retry-After tells a client to try again, forever: a name that is no
    topic level is the caller's mistake, refused as such whoever manages the accounts."""
    cloud = CloudSettings(invalid_log_interval_s=0, broker_accounts=broker_accounts)
    async with running_api(database, cloud=cloud) as api:
        for name in ("a+b", "%23", "%C3%A9x", "a" * 200, "-leading-dash"):
            response = await api.client.delete(
                f"/v1/mqtt/accounts/{name}", headers=bearer(api.admin_token)
            )
            refused = await problem(response, 404)
            assert "Retry-After" not in response.headers
            assert refused["type"].endswith("/mqtt-account-not-found")
