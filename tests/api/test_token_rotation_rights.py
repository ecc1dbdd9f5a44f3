"""A rotated-out token, in its overlap, keeps working for everything but managing tokens:
it may not create, rotate or revoke one (a 403), only revoke itself. Otherwise whoever
leaked it could mint a token with no end, or revoke its replacement, and rotating it
would protect nothing. Both backends."""

from __future__ import annotations

from typing import Any

from cloud.store import open_store
from tests.api.support import Api, bearer, problem


async def own_tokens(api: Api, token: str, query: str = "") -> list[dict[str, Any]]:
    response = await api.get(token, f"/v1/tokens{query}")
    assert response.status == 200, await response.text()
    items: list[dict[str, Any]] = (await response.json())["items"]
    return items


async def rotated(api: Api, token: str, token_id: str) -> dict[str, Any]:
    """The replacement (with its secret) of `token_id`, rotated with a long overlap."""
    response = await api.client.post(
        f"/v1/tokens/{token_id}/rotate", json={"overlap_s": 600}, headers=bearer(token)
    )
    assert response.status == 201, await response.text()
    replacement: dict[str, Any] = (await response.json())["token"]
    return replacement


async def refused_as_rotated_out(response: Any, token_id: str) -> None:
    found = await problem(response, 403)
    assert found["type"].endswith("/caller-token-not-active"), found
    assert token_id in found["detail"]
    assert "rotated" in found["detail"]


async def test_a_rotated_out_token_may_not_create_rotate_or_revoke_tokens(api: Api) -> None:
    old = await api.tenant("acme")
    (initial,) = await own_tokens(api, old)
    new = await rotated(api, old, initial["id"])

    minted = await api.client.post("/v1/tokens", json={"name": "backdoor"}, headers=bearer(old))
    await refused_as_rotated_out(minted, initial["id"])
    revoked = await api.client.delete(f"/v1/tokens/{new['id']}", headers=bearer(old))
    await refused_as_rotated_out(revoked, initial["id"])
    again = await api.client.post(f"/v1/tokens/{new['id']}/rotate", headers=bearer(old))
    await refused_as_rotated_out(again, initial["id"])

    # Nothing was made or changed: the replacement works, and is still the only active one.
    listed = {t["id"]: t["state"] for t in await own_tokens(api, new["token"])}
    assert listed == {initial["id"]: "rotated", new["id"]: "active"}
    assert (await api.get(new["token"], "/v1/jobs")).status == 200
    # Everything else still works for the old token until its overlap ends.
    assert (await api.get(old, "/v1/jobs")).status == 200
    assert (await api.get(old, "/v1/tokens")).status == 200

    # It may still end itself early, once its holder has moved to the replacement.
    itself = await api.client.delete(f"/v1/tokens/{initial['id']}", headers=bearer(old))
    assert itself.status == 200, await itself.text()
    assert (await itself.json())["state"] == "revoked"
    await problem(await api.get(old, "/v1/jobs"), 401)
    assert (await api.get(new["token"], "/v1/jobs")).status == 200


async def test_the_admins_rotated_out_token_may_not_manage_any_tenants_tokens(api: Api) -> None:
    acme = await api.tenant("acme")
    (acme_initial,) = await own_tokens(api, acme)
    (admin_initial,) = await own_tokens(api, api.admin_token)
    new_admin = await rotated(api, api.admin_token, admin_initial["id"])
    old_admin = api.admin_token

    minted = await api.client.post(
        "/v1/tokens?tenant=acme", json={"name": "backdoor"}, headers=bearer(old_admin)
    )
    await refused_as_rotated_out(minted, admin_initial["id"])
    revoked = await api.client.delete(f"/v1/tokens/{acme_initial['id']}", headers=bearer(old_admin))
    await refused_as_rotated_out(revoked, admin_initial["id"])
    assert (await api.get(acme, "/v1/jobs")).status == 200

    # The replacement manages them as before.
    made = await api.client.post(
        "/v1/tokens?tenant=acme", json={"name": "ci"}, headers=bearer(new_admin["token"])
    )
    assert made.status == 201, await made.text()


async def test_a_token_rotated_by_another_replica_may_not_manage_tokens_here(api: Api) -> None:
    # This replica verified the token before the rotation and still holds that verdict
    # (for store.token_cache_s): managing tokens must not trust it.
    acme = await api.tenant("acme")
    (initial,) = await own_tokens(api, acme)
    assert (await api.get(acme, "/v1/jobs")).status == 200
    other_replica = await open_store(api.database.settings)
    try:
        await other_replica.rotate_token(initial["id"], 600.0)
    finally:
        await other_replica.close()

    minted = await api.client.post("/v1/tokens", json={"name": "backdoor"}, headers=bearer(acme))
    await refused_as_rotated_out(minted, initial["id"])
    assert [t["name"] for t in await own_tokens(api, acme)] == ["initial", "initial"]
