"""PATCH /v1/jobs/{id} changes what differs and says only that (review 5, bug 2): a body
that changes nothing leaves the job as it is (no new version, no `work.updated` event,
no audit entry); otherwise the event and the audit entry name the fields that changed,
not every field sent. Both databases."""

from __future__ import annotations

from typing import Any

import msgspec

from tests.api.support import Api, bearer, job_spec


async def patched(api: Api, token: str, job_id: str, body: dict[str, Any]) -> dict[str, Any]:
    response = await api.client.patch(f"/v1/jobs/{job_id}", json=body, headers=bearer(token))
    assert response.status == 200, await response.text()
    job: dict[str, Any] = await response.json()
    return job


async def updates(api: Api, job_id: str) -> list[Any]:
    events = await api.store.list_events(tenant_id=None, work_id=job_id)
    return [
        msgspec.json.decode(event.payload)["changed"]
        for event in events
        if event.kind == "work.updated"
    ]


async def audited_changes(api: Api) -> list[Any]:
    response = await api.get(api.admin_token, "/v1/audit?action=work.update")
    return [entry["detail"]["changes"] for entry in (await response.json())["items"]]


async def test_a_patch_that_changes_nothing_leaves_the_job_as_it_is(api: Api) -> None:
    token = await api.tenant("acme", allowed_priorities=["p1", "p2"])
    job_id = await api.submitted(token, job_spec(priority="p2", workers=2))
    before = await (await api.get(token, f"/v1/jobs/{job_id}")).json()

    same = await patched(api, token, job_id, {"priority": "p2", "workers": 2})
    assert (same["version"], same["priority"], same["workers"]) == (before["version"], "p2", 2)
    assert await updates(api, job_id) == []
    assert await audited_changes(api) == []


async def test_a_patch_names_only_the_fields_it_changed(api: Api) -> None:
    token = await api.tenant("acme", allowed_priorities=["p1", "p2"])
    job_id = await api.submitted(token, job_spec(priority="p2", workers=2))
    before = await (await api.get(token, f"/v1/jobs/{job_id}")).json()

    changed = await patched(api, token, job_id, {"priority": "p2", "workers": 3})
    assert (changed["version"], changed["workers"]) == (before["version"] + 1, 3)
    assert await updates(api, job_id) == [["workers"]]
    assert await audited_changes(api) == [{"workers": 3}]
