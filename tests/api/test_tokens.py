"""`/v1/tokens`: a tenant's several bearer tokens, rotated with an overlap and revoked;
a revoked or rotated-out token is a 401 that says so. Both backends."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import datetime
from typing import Any

import pytest

from cloud.store.tenant_tokens import FREE_SCRYPTS_PER_WINDOW
from shared.secret_hashes import verify_secret
from tests.api.support import Api, bearer, problem
from tests.support.waiting import eventually_async


async def tokens(api: Api, token: str, query: str = "") -> list[dict[str, Any]]:
    response = await api.get(token, f"/v1/tokens{query}")
    assert response.status == 200, await response.text()
    body = await response.json()
    assert body["count"] == len(body["items"])
    items: list[dict[str, Any]] = body["items"]
    return items


async def refused_as_revoked(api: Api, token: str) -> dict[str, Any]:
    response = await api.get(token, "/v1/jobs")
    found = await problem(response, 401)
    assert found["type"].endswith("/token-revoked"), found
    assert found["title"] == "Token revoked"
    assert 'error="invalid_token"' in response.headers["WWW-Authenticate"]
    return found


async def test_a_tenant_creates_lists_and_revokes_its_own_tokens(api: Api) -> None:
    acme = await api.tenant("acme")
    created = await api.client.post("/v1/tokens", json={"name": "ci"}, headers=bearer(acme))
    assert created.status == 201, await created.text()
    ci = await created.json()
    assert ci["token"].startswith(f"gf_{ci['id']}_")
    assert (ci["tenant"], ci["name"], ci["state"], ci["created_by"]) == (
        "acme",
        "ci",
        "active",
        "acme",
    )
    assert (await api.get(ci["token"], "/v1/jobs")).status == 200  # it works

    listed = await tokens(api, acme)
    assert [(t["name"], t["state"]) for t in listed] == [("initial", "active"), ("ci", "active")]
    assert all("token" not in t for t in listed)
    assert ci["token"].split("_", 2)[2] not in str(listed)  # never a secret
    assert listed[1]["last_used_at"] is not None  # the request above used it

    revoked = await api.client.delete(f"/v1/tokens/{ci['id']}", headers=bearer(acme))
    assert revoked.status == 200, await revoked.text()
    body = await revoked.json()
    assert (body["state"], body["revoked_at"] is not None) == ("revoked", True)
    found = await refused_as_revoked(api, ci["token"])
    assert f"the bearer token {ci['id']} ('ci') was revoked at " in found["detail"]
    assert (await api.get(acme, "/v1/jobs")).status == 200  # its other token still works
    # Unknown tokens stay the generic 401.
    unknown = await problem(await api.get("gf_" + "0" * 16 + "_" + "A" * 43, "/v1/jobs"), 401)
    assert unknown["type"].endswith("/invalid-token")

    # Another tenant sees and touches none of it.
    globex = await api.tenant("globex")
    await problem(await api.get(globex, "/v1/tokens?tenant=acme"), 403)
    initial = listed[0]["id"]
    await problem(await api.client.delete(f"/v1/tokens/{initial}", headers=bearer(globex)), 404)
    rotate = f"/v1/tokens/{initial}/rotate"
    await problem(await api.client.post(rotate, headers=bearer(globex)), 404)
    assert [t["tenant"] for t in await tokens(api, globex)] == ["globex"]
    bad = await api.client.post("/v1/tokens", json={"name": "no spaces"}, headers=bearer(acme))
    assert (await problem(bad, 422))["invalid_params"][0]["name"] == "$.name"


async def test_a_rotated_token_works_during_its_overlap_and_is_refused_after(api: Api) -> None:
    acme = await api.tenant("acme")
    (initial,) = await tokens(api, acme)
    response = await api.client.post(
        f"/v1/tokens/{initial['id']}/rotate", json={"overlap_s": 3.0}, headers=bearer(acme)
    )
    assert response.status == 201, await response.text()
    rotated = await response.json()
    new = rotated["token"]
    assert (new["name"], new["state"]) == ("initial", "active")
    assert rotated["replaced"]["state"] == "rotated"
    assert rotated["replaced"]["replaced_by"] == new["id"]
    # During the overlap both work.
    assert (await api.get(acme, "/v1/jobs")).status == 200
    assert (await api.get(new["token"], "/v1/jobs")).status == 200

    async def old_refused() -> bool:
        return (await api.get(acme, "/v1/jobs")).status == 401

    await eventually_async(old_refused, timeout_s=15, interval_s=0.2)
    found = await refused_as_revoked(api, acme)
    assert f"the bearer token {initial['id']} ('initial') was rotated" in found["detail"]
    # Whoever still holds the old token learns nothing of the new one, not even its id.
    assert new["id"] not in found["detail"]
    assert (await api.get(new["token"], "/v1/jobs")).status == 200
    listed = {t["id"]: t["state"] for t in await tokens(api, new["token"])}
    assert listed == {initial["id"]: "expired", new["id"]: "active"}
    again = await api.client.post(
        f"/v1/tokens/{initial['id']}/rotate", headers=bearer(new["token"])
    )
    assert (await problem(again, 409))["type"].endswith("/token-not-active")

    # Without an overlap the old one is refused at once; without a body, an hour.
    at_once = await api.client.post(
        f"/v1/tokens/{new['id']}/rotate", json={"overlap_s": 0}, headers=bearer(new["token"])
    )
    newest = (await at_once.json())["token"]
    await refused_as_revoked(api, new["token"])
    default = await api.client.post(
        f"/v1/tokens/{newest['id']}/rotate", headers=bearer(newest["token"])
    )
    assert default.status == 201, await default.text()
    replaced = (await default.json())["replaced"]
    expires = replaced["expires_at"].replace("Z", "+00:00")
    assert 3500 < datetime.fromisoformat(expires).timestamp() - time.time() <= 3600
    assert (await api.get(newest["token"], "/v1/jobs")).status == 200


async def test_the_admin_manages_any_tenants_tokens_and_keeps_one_of_its_own(api: Api) -> None:
    await api.tenant("acme")
    created = await api.client.post(
        "/v1/tokens?tenant=acme", json={"name": "deploy"}, headers=bearer(api.admin_token)
    )
    assert created.status == 201, await created.text()
    deploy = await created.json()
    assert (deploy["tenant"], deploy["created_by"]) == ("acme", "admin")
    acme_id = await api.tenant_id(deploy["token"])
    assert acme_id == (await api.store.get_tenant_by_name("acme")).tenant_id  # type: ignore[union-attr]
    every = await tokens(api, api.admin_token, "?tenant=*")
    assert sorted({t["tenant"] for t in every}) == ["acme", "admin"]
    assert [t["tenant"] for t in await tokens(api, api.admin_token)] == ["admin"]  # its own
    await problem(await api.get(api.admin_token, "/v1/tokens?tenant=nobody"), 404)
    response = await api.client.post(
        f"/v1/tokens/{deploy['id']}/rotate", json={"overlap_s": 0}, headers=bearer(api.admin_token)
    )
    assert response.status == 201, await response.text()
    assert (await response.json())["token"]["tenant"] == "acme"
    await refused_as_revoked(api, deploy["token"])

    (own,) = await tokens(api, api.admin_token)
    last = await api.client.delete(f"/v1/tokens/{own['id']}", headers=bearer(api.admin_token))
    assert (await problem(last, 409))["type"].endswith("/last-admin-token")
    assert (await api.get(api.admin_token, "/v1/tenants")).status == 200

    # Every change is in the audit log, with who made it.
    audit = await (
        await api.get(api.admin_token, "/v1/audit?action=token.create,token.rotate")
    ).json()
    assert [(e["action"], e["actor"], e["target"]) for e in audit["items"]] == [
        ("token.rotate", "admin", deploy["id"]),
        ("token.create", "admin", deploy["id"]),
    ]
    assert audit["items"][1]["detail"] == {"tenant": "acme", "name": "deploy"}


async def test_the_admin_cannot_revoke_its_new_token_while_the_old_one_only_overlaps(
    api: Api,
) -> None:
    (old,) = await tokens(api, api.admin_token)
    rotated = await api.client.post(
        f"/v1/tokens/{old['id']}/rotate", json={"overlap_s": 600}, headers=bearer(api.admin_token)
    )
    assert rotated.status == 201, await rotated.text()
    new = (await rotated.json())["token"]
    # The old one stops working when its overlap ends: it is no spare for the new one.
    # (The new one asks: the old one may revoke no token but itself.)
    refused = await api.client.delete(f"/v1/tokens/{new['id']}", headers=bearer(new["token"]))
    assert (await problem(refused, 409))["type"].endswith("/last-admin-token")
    revoked = await api.client.delete(f"/v1/tokens/{old['id']}", headers=bearer(new["token"]))
    assert revoked.status == 200, await revoked.text()
    assert (await api.get(new["token"], "/v1/tenants")).status == 200


async def new_token(api: Api, owner: str, name: str) -> dict[str, Any]:
    created = await api.client.post("/v1/tokens", json={"name": name}, headers=bearer(owner))
    assert created.status == 201, await created.text()
    token: dict[str, Any] = await created.json()
    return token


async def test_guesses_at_a_token_id_leave_its_secret_accepted_where_it_is_new(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A replica that has not verified the token yet (restarted, or another one), with a
    # flood of guesses at its id: the owner is told to retry, never refused, and is
    # accepted at the id's next free turn.
    acme = await api.tenant("acme")
    ci = await new_token(api, acme, "ci")  # made here, never verified here
    secret = ci["token"].split("_", 2)[2]
    guesses = [f"gf_{ci['id']}_{attempt:0{len(secret)}d}" for attempt in range(40)]
    answers = await asyncio.gather(*(api.get(guess, "/v1/jobs") for guess in guesses))
    assert 429 in {answer.status for answer in answers}

    async def accepted() -> bool:
        response = await api.get(ci["token"], "/v1/jobs")
        assert response.status in (200, 429), await response.text()
        return response.status == 200

    await eventually_async(accepted, timeout_s=15, interval_s=0.5)


async def test_a_token_revoked_while_it_is_first_verified_is_refused_at_once(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first use of a token reads its row, then spends a scrypt off the event loop;
    # a revocation that commits in between must not leave the verdict cached (it was,
    # for store.token_cache_s).
    acme = await api.tenant("acme")
    assert (await api.get(acme, "/v1/jobs")).status == 200  # acme's own: cached
    ci = await new_token(api, acme, "ci")
    entered, release = threading.Event(), threading.Event()
    real = verify_secret

    def held(secret: str, secret_hash: str) -> bool:
        entered.set()
        release.wait(30)
        return real(secret, secret_hash)

    monkeypatch.setattr("cloud.store.store.verify_secret", held)
    first_use = asyncio.ensure_future(api.store.check_token(ci["token"]))
    try:
        assert await asyncio.to_thread(entered.wait, 30)
        revoked = await api.client.delete(f"/v1/tokens/{ci['id']}", headers=bearer(acme))
        assert revoked.status == 200, await revoked.text()
        # A request after the revocation, while the first is still being verified.
        second_use = asyncio.ensure_future(api.get(ci["token"], "/v1/jobs"))
    finally:
        release.set()
    await first_use  # it began before the revocation: either verdict is honest
    await problem(await second_use, 401)
    await refused_as_revoked(api, ci["token"])


async def test_a_flood_of_wrong_secrets_for_a_token_id_costs_few_scrypts(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Token ids are not secret (lists, audit): wrong secrets for one must not each cost a
    # scrypt, and the token's own secret keeps working meanwhile.
    acme = await api.tenant("acme")
    ci = await new_token(api, acme, "ci")
    assert (await api.get(ci["token"], "/v1/jobs")).status == 200
    scrypts = 0
    real = verify_secret

    def counted(secret: str, secret_hash: str) -> bool:
        nonlocal scrypts
        scrypts += 1
        return real(secret, secret_hash)

    monkeypatch.setattr("cloud.store.store.verify_secret", counted)
    secret = ci["token"].split("_", 2)[2]
    for attempt in range(FREE_SCRYPTS_PER_WINDOW):
        wrong = f"gf_{ci['id']}_{attempt:0{len(secret)}d}"
        await problem(await api.get(wrong, "/v1/jobs"), 401)
    # Past the free ones, a burst of guesses at once: a turn now, one waiting for the
    # next, the rest told to retry unchecked (never refused as wrong unchecked).
    burst = [f"gf_{ci['id']}_{attempt:0{len(secret)}d}" for attempt in range(10, 40)]
    answers = await asyncio.gather(*(api.get(wrong, "/v1/jobs") for wrong in burst))
    statuses = [answer.status for answer in answers]
    assert set(statuses) == {401, 429}, statuses
    assert scrypts <= FREE_SCRYPTS_PER_WINDOW + 2
    throttled = answers[statuses.index(429)]
    found = await problem(throttled, 429)
    assert found["type"].endswith("/too-many-attempts")
    assert int(throttled.headers["Retry-After"]) >= 1
    api.store._tokens.forget(ci["id"])  # as when its cache entry expires
    assert (await api.get(ci["token"], "/v1/jobs")).status == 200
