"""Apply by name (`PUT /v1/jobs/{name}`, `PUT /v1/deployments/{name}`) and dry runs
(`POST .../dry-run`, `?dry_run=true`): against the real app, on both databases."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from aiohttp import ClientResponse

from cloud.app_keys import REGISTRY, STORE
from tests.api.support import Api, bearer, deployment_spec, job_spec, one_pass, problem
from tests.loop.builders import node


async def _put(
    api: Api, token: str, collection: str, spec: dict[str, Any], query: str = ""
) -> ClientResponse:
    return await api.client.put(
        f"/v1/{collection}/{spec['name']}{query}", json=spec, headers=bearer(token)
    )


async def test_applying_a_deployment_twice_keeps_one_and_changes_it_in_place(api: Api) -> None:
    token = await api.tenant("acme")
    model = await api.model(token)
    spec = deployment_spec(model, name="detector", replicas=2)

    created = await _put(api, token, "deployments", spec)
    assert created.status == 201, await created.text()
    body = await created.json()
    assert (body["action"], body["dry_run"], body["state"]) == ("created", False, "pending")
    deployment_id = body["id"]
    assert created.headers["Location"] == f"/v1/deployments/{deployment_id}"

    again = await (await _put(api, token, "deployments", spec)).json()
    assert (again["action"], again["id"], again["changes"]) == ("unchanged", deployment_id, [])

    # What would change, without changing it (greenfed diff).
    bigger = {**spec, "replicas": 3}
    diff = await (await _put(api, token, "deployments", bigger, "?dry_run=true")).json()
    assert (diff["action"], diff["dry_run"]) == ("updated", True)
    assert diff["changes"] == [{"field": "replicas", "before": 2, "after": 3}]
    shown = await (await api.get(token, f"/v1/deployments/{deployment_id}")).json()
    assert shown["replicas"] == 2

    updated = await _put(api, token, "deployments", bigger)
    assert updated.status == 200, await updated.text()
    assert (await updated.json())["action"] == "updated"
    listed = await (await api.get(token, "/v1/deployments")).json()
    assert [(item["id"], item["replicas"]) for item in listed["items"]] == [(deployment_id, 3)]
    # Audited, and in the work's events.
    audit = await api.get(api.admin_token, "/v1/audit?action=work.update")
    (entry,) = (await audit.json())["items"]
    assert (entry["target"], entry["detail"]["changes"]) == (deployment_id, {"replicas": 3})

    # A field a running deployment cannot take: refused, saying what to do instead.
    moved = {**bigger, "accelerators_per_replica": 2}
    body = await problem(await _put(api, token, "deployments", moved), 409)
    assert [p["name"] for p in body["invalid_params"]] == ["$.accelerators_per_replica"]
    assert "greenfed cancel" in body["detail"]
    # The name in the path is the spec's.
    elsewhere = await api.client.put(
        "/v1/deployments/detector", json={**spec, "name": "other"}, headers=bearer(token)
    )
    wrong = await problem(elsewhere, 422)
    assert [p["name"] for p in wrong["invalid_params"]] == ["$.name"]


async def test_applying_a_job_updates_it_while_queued_and_refuses_once_started(api: Api) -> None:
    token = await api.tenant("acme")
    spec = job_spec(name="train", workers=1)
    job_id = (await (await _put(api, token, "jobs", spec)).json())["id"]

    changed = await _put(api, token, "jobs", {**spec, "workers": 2, "priority": "p2"})
    assert changed.status == 200, await changed.text()
    body = await changed.json()
    assert [c["field"] for c in body["changes"]] == ["priority", "workers"]
    stored = await api.store.get_work(await api.tenant_id(token), job_id)
    assert stored is not None
    assert stored.priority == "p2"
    # How it runs is fixed once submitted, even queued.
    command = await problem(await _put(api, token, "jobs", {**spec, "command": ["x"]}), 409)
    assert [p["name"] for p in command["invalid_params"]] == ["$.command"]

    # Started: immutable, and the message says what to do instead.
    api.app[REGISTRY].apply_status(node("gpu-1").status)
    await one_pass(api)
    running = await (await api.get(token, "/v1/jobs/train")).json()
    assert running["state"] == "scheduled"
    refused = await problem(await _put(api, token, "jobs", {**spec, "workers": 1}), 409)
    assert refused["type"].endswith("job-started")
    assert "cancel it (greenfed cancel" in refused["detail"]

    # Ended: the same spec changes nothing; another spec under the name is a new job.
    await api.client.delete("/v1/jobs/train", headers=bearer(token))
    current = {**spec, "workers": 2, "priority": "p2"}
    same = await (await _put(api, token, "jobs", current)).json()
    assert (same["action"], same["id"], same["state"]) == ("unchanged", job_id, "cancelled")
    fresh = await _put(api, token, "jobs", {**current, "workers": 1})
    assert fresh.status == 201
    assert (await fresh.json())["id"] != job_id


async def test_a_dry_run_explains_where_work_would_go_and_stores_nothing(api: Api) -> None:
    token = await api.tenant("acme")
    api.app[REGISTRY].apply_status(node("gpu-1", gpus=4).status)
    fits = await api.client.post(
        "/v1/jobs/dry-run",
        json=job_spec(workers=1, accelerators_per_worker=2),
        headers=bearer(token),
    )
    assert fits.status == 200, await fits.text()
    body = await fits.json()
    assert body["explanation"]["outcome"] == "placed"
    assert [p["node_id"] for p in body["explanation"]["placements"]] == ["gpu-1"]
    # With the node taken by a job that runs: it would wait, and says why.
    await api.submitted(token, job_spec(name="big", accelerators_per_worker=4))
    await one_pass(api)
    behind = await api.client.post(
        "/v1/jobs/dry-run", json=job_spec(accelerators_per_worker=2), headers=bearer(token)
    )
    waits = await behind.json()
    assert waits["explanation"]["outcome"] == "pending"
    assert waits["message"] == waits["explanation"]["message"]
    # Nothing was stored.
    listed = await (await api.get(token, "/v1/jobs")).json()
    assert [item["name"] for item in listed["items"]] == ["big"]
    # Bad input is the same 4xx as a submission's, naming the field.
    bad = await api.client.post("/v1/jobs/dry-run", json=job_spec(workers=0), headers=bearer(token))
    assert [p["name"] for p in (await problem(bad, 422))["invalid_params"]] == ["$.workers"]
    # A dry run of apply for a new name says where it would go.
    new = await (await _put(api, token, "jobs", job_spec(name="fresh"), "?dry_run=true")).json()
    assert (new["action"], new["id"]) == ("created", None)
    assert new["placement"]["explanation"]["outcome"] == "pending"
    assert len((await (await api.get(token, "/v1/jobs")).json())["items"]) == 1


async def test_a_job_array_is_submitted_not_applied_nor_dry_run(api: Api) -> None:
    token = await api.tenant("acme")
    sweep = job_spec(name="sweep", array="0-3")
    applied = await problem(await _put(api, token, "jobs", sweep), 422)
    assert [p["name"] for p in applied["invalid_params"]] == ["$.array"]
    assert "greenfed submit" in applied["detail"]
    dry = await api.client.post("/v1/jobs/dry-run", json=sweep, headers=bearer(token))
    assert [p["name"] for p in (await problem(dry, 422))["invalid_params"]] == ["$.array"]
    assert (await (await api.get(token, "/v1/jobs")).json())["items"] == []


async def test_a_deployment_dry_run_places_its_replicas_and_stores_nothing(api: Api) -> None:
    token = await api.tenant("acme")
    model = await api.model(token)
    for node_id in ("orin-1", "orin-2"):
        api.app[REGISTRY].apply_status(node(node_id, site="edge", gpus=1).status)
    spec = deployment_spec(model, name="detector", replicas=2)
    answer = await api.client.post("/v1/deployments/dry-run", json=spec, headers=bearer(token))
    assert answer.status == 200, await answer.text()
    body = await answer.json()
    assert (body["kind"], body["name"]) == ("deployment", "detector")
    assert body["explanation"]["outcome"] == "placed"
    placed = sorted(p["node_id"] for p in body["explanation"]["placements"])
    assert placed == ["orin-1", "orin-2"]
    assert (await (await api.get(token, "/v1/deployments")).json())["items"] == []
    # A model the tenant does not have: the submission's own 422.
    missing = deployment_spec("no-such-model", name="detector")
    refused = await api.client.post("/v1/deployments/dry-run", json=missing, headers=bearer(token))
    assert [p["name"] for p in (await problem(refused, 422))["invalid_params"]] == ["$.model_id"]


def test_apply_changes_a_queued_job_in_the_fields_patch_takes() -> None:
    """apply and PATCH /v1/jobs/{id} agree on what a queued job may change."""
    from cloud.api.job_control import JobUpdate
    from cloud.work.spec_changes import QUEUED_JOB_FIELDS

    assert set(JobUpdate.__struct_fields__) == QUEUED_JOB_FIELDS


async def test_applies_of_one_name_at_once_create_it_once(api: Api) -> None:
    """A retried `greenfed apply` (or two at once) must leave one job of the name, and
    the name usable: every answer is that job, created once, then unchanged or updated."""
    token = await api.tenant("acme")
    specs = [job_spec(name="nightly", priority=p) for p in ("p1", "p1", "p2", "p1", "p0", "p1")]
    answers = await asyncio.gather(*(_put(api, token, "jobs", spec) for spec in specs))
    statuses = sorted(answer.status for answer in answers)
    assert statuses.count(201) == 1, statuses
    assert set(statuses) <= {200, 201, 409}, [await a.text() for a in answers]
    ids = {(await answer.json())["id"] for answer in answers if answer.status in (200, 201)}
    assert len(ids) == 1
    listed = await (await api.get(token, "/v1/jobs?state=pending")).json()
    assert [item["name"] for item in listed["items"]] == ["nightly"]
    again = await _put(api, token, "jobs", job_spec(name="nightly", priority="p1"))
    assert again.status == 200, await again.text()
    detail = await (await api.get(token, f"/v1/jobs/{ids.pop()}")).json()
    assert detail["idempotency_key"] is None  # the control plane's own key is not shown


async def test_an_apply_created_between_its_two_lookups_is_not_created_again(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Apply reads the name's live work, then its newest work. A job another apply
    creates between the two reads is live, not ended: taken as ended, it gave a second
    creation key, and the name two jobs (seen in CI: two 201s, then every apply a 409
    naming both). The late apply finds the job and updates it."""
    token = await api.tenant("acme")
    store = api.app[STORE]
    read_live = store.live_work_named
    other: list[ClientResponse] = []
    raced = asyncio.Event()

    async def racing_read(*args: Any, **kwargs: Any) -> Any:
        found = await read_live(*args, **kwargs)
        if not raced.is_set():  # the other apply commits its job right after this read
            raced.set()
            first = job_spec(name="nightly", priority="p2")
            other.append(await _put(api, token, "jobs", first))
        return found

    monkeypatch.setattr(store, "live_work_named", racing_read)
    late = await _put(api, token, "jobs", job_spec(name="nightly", priority="p1"))
    assert other[0].status == 201, await other[0].text()
    assert late.status == 200, await late.text()
    assert (await late.json())["action"] == "updated"
    assert (await late.json())["id"] == (await other[0].json())["id"]
    listed = await (await api.get(token, "/v1/jobs?state=pending")).json()
    assert [item["name"] for item in listed["items"]] == ["nightly"]


async def test_applying_a_queued_job_refuses_what_patch_refuses(api: Api) -> None:
    """Apply updates a queued job as PATCH /v1/jobs/{id} does, with PATCH's checks: a
    deadline that has passed is a 422 on it, dry run or not, and the job keeps its
    spec (before: stored, 200 updated)."""
    token = await api.tenant("acme")
    soon = datetime.now(UTC) + timedelta(hours=1)
    spec = job_spec(name="nightly", deadline=soon.strftime("%Y-%m-%dT%H:%M:%SZ"))
    job_id = (await (await _put(api, token, "jobs", spec)).json())["id"]
    passed = {**spec, "deadline": "2020-01-01T00:00:00Z"}

    patched = await api.client.patch(
        f"/v1/jobs/{job_id}", json={"deadline": passed["deadline"]}, headers=bearer(token)
    )
    by_patch = await problem(patched, 422)
    for query in ("?dry_run=true", ""):
        applied = await problem(await _put(api, token, "jobs", passed, query), 422)
        assert applied["invalid_params"] == by_patch["invalid_params"], query
    shown = await (await api.get(token, f"/v1/jobs/{job_id}")).json()
    assert shown["spec"]["deadline"] == spec["deadline"]
    assert shown["version"] == 1

    # What PATCH takes, apply takes too.
    later = {**spec, "deadline": (soon + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")}
    updated = await _put(api, token, "jobs", later)
    assert updated.status == 200, await updated.text()
    assert (await updated.json())["action"] == "updated"
