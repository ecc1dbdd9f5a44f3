"""Tenancy at the API's edges: a revoked token's stream sends no more of its backlog, a
rollout ended by the admin's update names the admin, and work keeps a priority class
its tenant may no longer use (docs/rest.md, PATCH /v1/tenants)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import pytest

from cloud.store import EventRecord
from cloud.store.records import NewEvent
from tests.api.support import (
    FAST,
    Api,
    bearer,
    deployment_spec,
    job_spec,
    problem,
    running_api,
)
from tests.store.databases import DatabaseUnderTest

PAGE_SIZE = 3
BACKLOG = 10  # events: more than three pages


def _data(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


async def test_a_token_revoked_during_its_streams_catch_up_gets_no_more_of_the_backlog(
    database: DatabaseUnderTest, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A leaked token's stream of a long backlog: revoking it must stop the backlog too,
    # not only what comes after it.
    async with running_api(database, dataclasses.replace(FAST, event_page_size=PAGE_SIZE)) as api:
        acme = await api.tenant("acme")
        tenant_id = await api.tenant_id(acme)
        created = await api.client.post("/v1/tokens", json={"name": "leaked"}, headers=bearer(acme))
        leaked = await created.json()
        for index in range(BACKLOG):
            payload = json.dumps({"index": index}).encode()
            await api.store.record_event(
                NewEvent(kind="test.backlog", payload=payload, tenant_id=tenant_id)
            )
        pages_read: list[int] = []
        list_events = api.store.list_events

        async def revoked_after_the_first_page(**query: Any) -> tuple[EventRecord, ...]:
            page = await list_events(**query)
            if query.get("tenant_id") == tenant_id:
                pages_read.append(len(page))
                if len(pages_read) == 1:  # the token is revoked while the stream catches up
                    await api.store.revoke_token(leaked["id"])
            return page

        monkeypatch.setattr(api.store, "list_events", revoked_after_the_first_page)
        response = await api.client.get("/v1/events?after=0", headers=bearer(leaked["token"]))
        assert response.status == 200
        async with asyncio.timeout(10):
            text = await response.text()  # the stream ends
        backlog = [event for event in _data(text) if event["kind"] == "test.backlog"]
        assert [event["payload"]["index"] for event in backlog] == list(range(PAGE_SIZE))
        assert pages_read == [PAGE_SIZE]  # nothing more read once it was revoked


@pytest.mark.parametrize("database", ["sqlite"], indirect=True)
async def test_a_rollout_the_admins_model_update_ends_names_the_admin(api: Api) -> None:
    bravo = await api.tenant("bravo")
    first, second, third = [await api.model(bravo, name=name) for name in ("m1", "m2", "m3")]
    deployment = await api.submitted(
        bravo, deployment_spec(first, replicas=4), collection="deployments"
    )
    canary = {"model_id": second, "rollout": {"canary_replicas": 1}}
    response = await api.client.patch(
        f"/v1/deployments/{deployment}", json=canary, headers=bearer(bravo)
    )
    assert response.status == 200, await response.text()
    response = await api.client.patch(
        f"/v1/deployments/{deployment}",
        json={"model_id": third},
        headers=bearer(api.admin_token),
    )
    assert response.status == 200, await response.text()
    events = await api.get(bravo, f"/v1/events?follow=false&after=0&work_id={deployment}")
    rollouts = [
        event["payload"] for event in _data(await events.text()) if event["kind"] == "work.rollout"
    ]
    assert [(r["outcome"], r["reason"]) for r in rollouts] == [
        ("superseded", "replaced by a model update by admin")
    ]


async def _narrowed(api: Api, allowed: list[str]) -> None:
    response = await api.client.patch(
        "/v1/tenants/alpha", json={"allowed_priorities": allowed}, headers=bearer(api.admin_token)
    )
    assert response.status == 200, await response.text()


@pytest.mark.parametrize("database", ["sqlite"], indirect=True)
async def test_a_queued_job_keeps_a_priority_class_its_tenant_may_no_longer_use(api: Api) -> None:
    alpha = await api.tenant("alpha")
    spec = job_spec(name="urgent", priority="p0")
    response = await api.client.put("/v1/jobs/urgent", json=spec, headers=bearer(alpha))
    assert response.status == 201, await response.text()
    job = (await response.json())["id"]
    await _narrowed(api, ["p1", "p2"])
    # The same file again is no change.
    response = await api.client.put("/v1/jobs/urgent", json=spec, headers=bearer(alpha))
    assert response.status == 200, await response.text()
    assert (await response.json())["action"] == "unchanged"
    # Other fields change, by PATCH and by apply, and the class stays.
    response = await api.client.patch(f"/v1/jobs/{job}", json={"workers": 2}, headers=bearer(alpha))
    assert response.status == 200, await response.text()
    response = await api.client.put(
        "/v1/jobs/urgent", json=spec | {"workers": 3}, headers=bearer(alpha)
    )
    assert response.status == 200, await response.text()
    assert (await response.json())["action"] == "updated"
    shown = await (await api.get(alpha, f"/v1/jobs/{job}")).json()
    assert (shown["priority"], shown["workers"], shown["state"]) == ("p0", 3, "pending")
    # A class new to the work is refused as ever: a change to it, or new work in it.
    other = await api.submitted(alpha, job_spec(name="other", priority="p1"))
    refused = await api.client.patch(
        f"/v1/jobs/{other}", json={"priority": "p0"}, headers=bearer(alpha)
    )
    assert (await problem(refused, 403))["type"].endswith("/priority-not-allowed")
    again = job_spec(name="other", priority="p0")
    refused = await api.client.put("/v1/jobs/other", json=again, headers=bearer(alpha))
    assert (await problem(refused, 403))["type"].endswith("/priority-not-allowed")
    fresh = job_spec(name="fresh", priority="p0")
    refused = await api.client.put("/v1/jobs/fresh", json=fresh, headers=bearer(alpha))
    assert (await problem(refused, 403))["type"].endswith("/priority-not-allowed")
    refused = await api.client.post("/v1/jobs/dry-run", json=fresh, headers=bearer(alpha))
    assert (await problem(refused, 403))["type"].endswith("/priority-not-allowed")


@pytest.mark.parametrize("database", ["sqlite"], indirect=True)
async def test_a_deployment_keeps_a_priority_class_its_tenant_may_no_longer_use(api: Api) -> None:
    alpha = await api.tenant("alpha")
    spec = deployment_spec(await api.model(alpha), name="det", priority="p0")
    response = await api.client.put("/v1/deployments/det", json=spec, headers=bearer(alpha))
    assert response.status == 201, await response.text()
    await _narrowed(api, ["p1"])
    response = await api.client.put("/v1/deployments/det", json=spec, headers=bearer(alpha))
    assert response.status == 200, await response.text()
    assert (await response.json())["action"] == "unchanged"
    # A change through apply is taken as the same change through PATCH is.
    scaled = spec | {"replicas": 3}
    response = await api.client.put("/v1/deployments/det", json=scaled, headers=bearer(alpha))
    assert response.status == 200, await response.text()
    assert (await response.json())["action"] == "updated"
    fresh = spec | {"name": "fresh"}
    refused = await api.client.put("/v1/deployments/fresh", json=fresh, headers=bearer(alpha))
    assert (await problem(refused, 403))["type"].endswith("/priority-not-allowed")
