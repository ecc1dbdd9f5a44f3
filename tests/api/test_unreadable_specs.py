"""Work whose stored spec this greenfed cannot read as it reads a submission: one a newer
greenfed wrote (a field this version does not know, during a rolling upgrade), or one
that breaks a limit (a job array's tasks once got their GREENFED_ARRAY_* variables past
env's). Every route answers for it as the views do: the fields it knows where it only
shows or decides, a 409 `spec-unreadable` where it would store the spec again (those
fields would be lost), never a 500; and a listing never fails for it. Both databases.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
from sqlalchemy import update

from cloud.store import PassWrite
from cloud.store.schema import work as work_table
from tests.api.support import Api, bearer, deployment_spec, job_spec, problem
from tests.store.builders import placement

NEWER_FIELD = "a_field_of_a_newer_version"


async def rewrite_spec(api: Api, work_id: str, change: Callable[[dict[str, Any]], Any]) -> None:
    """Store the work's spec as `change` leaves it, as another greenfed would have."""
    record = await api.store.find_work(work_id)
    assert record is not None
    spec = msgspec.json.decode(record.spec)
    change(spec)
    async with api.store._write() as connection:
        await connection.execute(
            update(work_table)
            .where(work_table.c.id == work_id)
            .values(spec=msgspec.json.encode(spec), version=work_table.c.version + 1)
        )


def newer(spec: dict[str, Any]) -> None:
    spec[NEWER_FIELD] = 1


async def place(api: Api, job_id: str) -> None:
    lease = await api.store.try_acquire_leadership()
    assert lease is not None
    async with lease:
        await api.store.commit_pass(
            PassWrite(placements=(placement(job_id, "gpu-a"),)), lease=lease
        )


async def post(api: Api, token: str, path: str) -> Any:
    return await api.client.post(path, headers=bearer(token))


async def test_job_control_answers_for_a_job_a_newer_greenfed_wrote(api: Api) -> None:
    token = await api.tenant("acme")
    queued = await api.submitted(token, job_spec(name="queued"))
    await rewrite_spec(api, queued, newer)

    held = await post(api, token, f"/v1/jobs/{queued}/hold")
    assert held.status == 200, await held.text()
    assert ((await held.json())["hold"], (await held.json())["name"]) == ("held", "queued")
    released = await post(api, token, f"/v1/jobs/{queued}/release")
    assert released.status == 200, await released.text()

    # PATCH stores the spec again: it would lose the field it does not know.
    patched = await api.client.patch(
        f"/v1/jobs/{queued}", json={"priority": "p2"}, headers=bearer(token)
    )
    assert (await problem(patched, 409))["type"].endswith("/spec-unreadable")
    stored = await api.store.find_work(queued)
    assert stored is not None
    assert NEWER_FIELD in msgspec.json.decode(stored.spec)

    placed = await api.submitted(token, job_spec(name="placed"))
    await place(api, placed)
    await rewrite_spec(api, placed, newer)
    refused = await problem(await post(api, token, f"/v1/jobs/{placed}/suspend"), 409)
    assert refused["type"].endswith("/not-checkpointing")
    requeued = await post(api, token, f"/v1/jobs/{placed}/requeue")
    assert requeued.status == 200, await requeued.text()
    assert "starts over" in (await requeued.json())["reason"]


async def test_apply_answers_for_a_job_a_newer_greenfed_wrote(api: Api) -> None:
    token = await api.tenant("acme")
    spec = job_spec(name="nightly")
    live = await api.submitted(token, spec)
    await rewrite_spec(api, live, newer)

    same = await api.client.put("/v1/jobs/nightly", json=spec, headers=bearer(token))
    assert same.status == 200, await same.text()
    assert (await same.json())["action"] == "unchanged"
    for query in ("?dry_run=true", ""):
        changed = await api.client.put(
            f"/v1/jobs/nightly{query}", json={**spec, "workers": 2}, headers=bearer(token)
        )
        assert (await problem(changed, 409))["type"].endswith("/spec-unreadable"), query

    # Ended, the same spec applied again changes nothing: no second job.
    assert (await api.client.delete(f"/v1/jobs/{live}", headers=bearer(token))).status == 200
    again = await api.client.put("/v1/jobs/nightly", json=spec, headers=bearer(token))
    assert again.status == 200, await again.text()
    assert ((await again.json())["action"], (await again.json())["id"]) == ("unchanged", live)


async def test_an_array_a_newer_greenfed_wrote_is_shown_cancelled_and_not_mistaken(
    api: Api,
) -> None:
    token = await api.tenant("acme")
    spec = job_spec(name="sweep", array="0-1")
    array_id = await api.submitted(token, spec, key="sweep-1")
    for task in await api.store.array_tasks(None, array_id):
        await rewrite_spec(api, task.work.work_id, newer)

    shown = await api.get(token, f"/v1/jobs/{array_id}")
    assert shown.status == 200, await shown.text()
    assert (await shown.json())["array"]["count"] == 2
    # A retry is compared with the spec as stored, which this version cannot read whole:
    # as for a single job, the key's work is not taken for this body's.
    retry = await api.submit(token, spec, key="sweep-1")
    assert (await problem(retry, 409))["type"].endswith("/idempotency-key-reused")
    cancelled = await api.client.delete(f"/v1/jobs/{array_id}", headers=bearer(token))
    assert cancelled.status == 200, await cancelled.text()
    assert (await cancelled.json())["array"]["states"] == {"cancelled": 2}


async def test_a_listing_shows_every_item_it_can_read_and_fails_for_none(api: Api) -> None:
    token = await api.tenant("acme")
    other = await api.tenant("other")
    fine = await api.submitted(other, job_spec(name="fine"))
    too_full = await api.submitted(token, job_spec(name="too-full"))
    await rewrite_spec(
        api, too_full, lambda spec: spec.update(env={f"V{i}": "x" for i in range(1030)})
    )
    garbled = await api.submitted(token, job_spec(name="garbled"))
    await rewrite_spec(api, garbled, lambda spec: spec.update(name=7))

    for caller, expected in ((token, {too_full}), (api.admin_token, {fine, too_full})):
        listed = await api.get(caller, "/v1/jobs")
        assert listed.status == 200, await listed.text()
        items = (await listed.json())["items"]
        assert {item["id"] for item in items} == expected
    # The one broken past its limit is shown with what a summary holds.
    (shown,) = [item for item in items if item["id"] == too_full]
    assert (shown["name"], shown["workers"], shown["state"]) == ("too-full", 1, "pending")
    # Each on its own says why it cannot be shown whole.
    for unreadable in (too_full, garbled):
        body = await problem(await api.get(token, f"/v1/jobs/{unreadable}"), 409)
        assert body["type"].endswith("/spec-unreadable")

    model = await api.model(token)
    deployment = await api.submitted(token, deployment_spec(model), collection="deployments")
    await rewrite_spec(api, deployment, lambda spec: spec.update(replicas=99_999))
    listed = await api.get(token, "/v1/deployments")
    assert listed.status == 200, await listed.text()
    (item,) = (await listed.json())["items"]
    assert (item["id"], item["name"], item["replicas"]) == (deployment, "detector", 99_999)


async def test_a_deployment_a_newer_greenfed_wrote_is_not_stored_again_without_its_fields(
    api: Api,
) -> None:
    """Changing a deployment stores its spec again: a field this version does not know
    would be lost, so the change is a 409 and the stored spec keeps it."""
    token = await api.tenant("acme")
    model = await api.model(token)
    deployment = await api.submitted(token, deployment_spec(model), collection="deployments")
    await rewrite_spec(api, deployment, newer)
    changed = await api.client.patch(
        f"/v1/deployments/{deployment}", json={"replicas": 2}, headers=bearer(token)
    )
    assert (await problem(changed, 409))["type"].endswith("/spec-unreadable")
    record = await api.store.find_work(deployment)
    assert record is not None
    assert msgspec.json.decode(record.spec)[NEWER_FIELD] == 1
    # It is still shown, with the fields this version knows.
    shown = await api.get(token, f"/v1/deployments/{deployment}")
    assert shown.status == 200, await shown.text()
