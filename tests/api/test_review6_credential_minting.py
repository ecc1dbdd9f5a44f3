"""A rotated-out admin token, in its overlap, mints no credential: no tenant (each comes
with a token, an admin's perhaps), no MQTT account, no join token (which enrols nodes).
Whoever leaked it would otherwise keep a way in long after the overlap ends, and
rotating it would protect nothing. Real broker accounts (the embedded broker's
dynamic-security commands), both store backends."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientResponse

from cloud.store import open_store
from greenfed.broker import EmbeddedBroker
from shared.settings import CloudSettings, MqttSettings
from tests.api.support import Api, bearer, problem, running_api
from tests.store.databases import DatabaseUnderTest

pytestmark = pytest.mark.timeout(60)

ADMIN_PASSWORD = "admin-password"


@pytest.fixture
async def api(database: DatabaseUnderTest, tmp_path: Path) -> AsyncIterator[Api]:
    """The control plane on an embedded broker with accounts, provisioning them itself."""
    async with EmbeddedBroker(
        port=0, accounts_file=tmp_path / "broker-accounts.json", admin_password=ADMIN_PASSWORD
    ) as broker:
        mqtt = MqttSettings(
            url=broker.url,
            username="greenfed-cloud",
            password=ADMIN_PASSWORD,
            topic_root=f"gftest-{uuid.uuid4().hex[:12]}",
        )
        cloud = CloudSettings(invalid_log_interval_s=0, broker_accounts="dynamic-security")
        async with running_api(database, mqtt=mqtt, cloud=cloud) as running:
            yield running


async def mint_everything(api: Api, token: str, name: str) -> dict[str, ClientResponse]:
    """Ask for every credential a token can mint, by route."""
    headers = bearer(token)
    return {
        "tenant": await api.client.post(
            "/v1/tenants", json={"name": name, "admin": True}, headers=headers
        ),
        "mqtt account": await api.client.post(
            "/v1/mqtt/accounts", json={"name": name}, headers=headers
        ),
        "join token": await api.client.post(
            "/v1/nodes/join-tokens", json={"uses": 5}, headers=headers
        ),
    }


async def refused_as_not_active(response: ClientResponse, token_id: str, minting: str) -> None:
    found = await problem(response, 403)
    assert found["type"].endswith("/caller-token-not-active"), found
    assert token_id in found["detail"]
    assert minting in found["detail"]


async def admin_token_id(api: Api, token: str) -> str:
    response = await api.get(token, "/v1/tokens")
    assert response.status == 200, await response.text()
    (only,) = [t for t in (await response.json())["items"] if t["state"] == "active"]
    token_id = only["id"]
    assert isinstance(token_id, str)
    return token_id


async def audited_actions(api: Api, token: str) -> list[str]:
    response = await api.get(token, "/v1/audit?limit=500")
    assert response.status == 200, await response.text()
    return [entry["action"] for entry in (await response.json())["items"]]


async def test_a_rotated_out_admin_token_mints_no_credential(api: Api) -> None:
    old = api.admin_token
    old_id = await admin_token_id(api, old)
    rotated = await api.client.post(
        f"/v1/tokens/{old_id}/rotate", json={"overlap_s": 600}, headers=bearer(old)
    )
    assert rotated.status == 201, await rotated.text()
    new = (await rotated.json())["token"]["token"]

    refused = await mint_everything(api, old, "backdoor")
    await refused_as_not_active(refused["tenant"], old_id, "create tenants")
    await refused_as_not_active(refused["mqtt account"], old_id, "create MQTT accounts")
    await refused_as_not_active(refused["join token"], old_id, "create join tokens")
    # Nor code every node runs as its agent: no package published, no rollout started.
    wheel = await api.client.post(
        "/v1/agent-packages",
        data=b"PK\x03\x04 not looked at",
        headers={**bearer(old), "Content-Type": "application/octet-stream"},
    )
    await refused_as_not_active(wheel, old_id, "publish or roll out agent versions")
    rollout = await api.client.post(
        "/v1/agent-rollouts", json={"version": "9.9.9"}, headers=bearer(old)
    )
    await refused_as_not_active(rollout, old_id, "publish or roll out agent versions")

    # Nothing was made: no tenant, no join token, no broker account.
    tenants = await api.get(new, "/v1/tenants")
    assert [t["name"] for t in (await tenants.json())["items"]] == ["admin"]
    join_tokens = await api.get(new, "/v1/nodes/join-tokens")
    assert (await join_tokens.json())["count"] == 0
    actions = await audited_actions(api, new)
    assert not {"tenant.create", "mqtt_account.create", "join-token.create"} & set(actions)
    # Everything else still works for the old token until its overlap ends.
    assert (await api.get(old, "/v1/tenants")).status == 200
    assert (await api.get(old, "/v1/nodes/join-tokens")).status == 200

    # The replacement mints them all, as the admin did before the rotation.
    minted = await mint_everything(api, new, "dashboard")
    for route, response in minted.items():
        assert response.status == 201, (route, await response.text())
    made: dict[str, Any] = await minted["mqtt account"].json()
    assert made["username"] == "dashboard"
    assert made["password"]


async def test_a_token_rotated_by_another_replica_mints_no_credential_here(api: Api) -> None:
    # This replica verified the token before the rotation and still holds that verdict
    # (for store.token_cache_s): minting must not trust it.
    old_id = await admin_token_id(api, api.admin_token)
    assert (await api.get(api.admin_token, "/v1/tenants")).status == 200
    other_replica = await open_store(api.database.settings)
    try:
        await other_replica.rotate_token(old_id, 600.0)
    finally:
        await other_replica.close()

    refused = await mint_everything(api, api.admin_token, "backdoor")
    for minting, response in zip(
        ("create tenants", "create MQTT accounts", "create join tokens"),
        refused.values(),
        strict=True,
    ):
        await refused_as_not_active(response, old_id, minting)
