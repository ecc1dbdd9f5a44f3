"""Job control over HTTP (cloud/api/job_control.py): hold, release, suspend, resume,
requeue and PATCH of a queued job; wrong states are 409 problems that say why, another
tenant's job is not found, the admin reaches every tenant's, and every action is in the
audit log. Against the real app on both store backends."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from cloud.store import PassWrite
from tests.api.support import Api, bearer, job_spec, problem
from tests.store.builders import placement


async def act(api: Api, token: str, job_id: str, action: str) -> Any:
    return await api.client.post(f"/v1/jobs/{job_id}/{action}", headers=bearer(token))


async def done(api: Api, token: str, job_id: str, action: str) -> dict[str, Any]:
    response = await act(api, token, job_id, action)
    assert response.status == 200, await response.text()
    body: dict[str, Any] = await response.json()
    return body


async def patch(api: Api, token: str, job_id: str, body: dict[str, Any]) -> Any:
    return await api.client.patch(f"/v1/jobs/{job_id}", json=body, headers=bearer(token))


async def place(api: Api, job_id: str, *, running: bool = True) -> None:
    lease = await api.store.try_acquire_leadership()
    assert lease is not None
    async with lease:
        await api.store.commit_pass(
            PassWrite(placements=(placement(job_id, "gpu-a"),)), lease=lease
        )
    if running:
        await api.store.transition(job_id, "running")


async def test_a_held_job_stays_pending_with_its_reason_until_released(api: Api) -> None:
    token = await api.tenant("acme")
    job_id = await api.submitted(token, job_spec())
    held = await done(api, token, job_id, "hold")
    assert (held["state"], held["hold"], held["reason"]) == ("pending", "held", "held by acme")
    assert (await done(api, token, job_id, "hold"))["version"] == held["version"]  # no-op
    explained = await (await api.get(token, f"/v1/jobs/{job_id}/explain")).json()
    assert (explained["message"], explained["explanation"]) == ("held by acme", None)
    listed = await (await api.get(token, "/v1/jobs")).json()
    assert listed["items"][0]["hold"] == "held"

    for action, kind in (("resume", "not-suspended"), ("requeue", "not-placed")):
        refused = await problem(await act(api, token, job_id, action), 409)
        assert refused["type"].endswith(kind)
        assert "is held" in refused["detail"]
    released = await done(api, token, job_id, "release")
    assert (released["hold"], released["reason"]) == (None, "released by acme")
    refused = await problem(await act(api, token, job_id, "release"), 409)
    assert refused["detail"] == f"job {job_id} is pending, not held: nothing to release"


async def test_only_pending_jobs_are_held_and_running_ones_suspended_if_they_checkpoint(
    api: Api,
) -> None:
    token = await api.tenant("acme")
    plain = await api.submitted(token, job_spec(name="plain"))
    saving = await api.submitted(token, job_spec(name="saving", checkpoint_interval_s=60))
    for job_id in (plain, saving):
        await place(api, job_id)
    refused = await problem(await act(api, token, plain, "hold"), 409)
    assert refused["type"].endswith("/not-pending")
    assert "suspend it" in refused["detail"]
    refused = await problem(await act(api, token, plain, "suspend"), 409)
    assert refused["type"].endswith("/not-checkpointing")
    assert "no checkpoint_interval_s" in refused["detail"]

    suspended = await done(api, token, saving, "suspend")
    assert (suspended["state"], suspended["hold"], suspended["allocations"]) == (
        "pending", "suspended", [],
    )  # fmt: skip
    assert suspended["reason"] == "suspended by acme; resumes from its newest checkpoint"
    assert (await api.store.node_generations())["gpu-a"] >= 3  # its node was told to stop it
    refused = await problem(await act(api, token, saving, "release"), 409)
    assert "resume it instead" in refused["detail"]
    resumed = await done(api, token, saving, "resume")
    assert (resumed["state"], resumed["hold"], resumed["reason"]) == (
        "pending", None, "resumed by acme",
    )  # fmt: skip

    requeued = await done(api, token, plain, "requeue")
    assert (requeued["state"], requeued["reason"]) == ("pending", "requeued by acme; starts over")
    stored = await api.store.get_work(await api.tenant_id(token), plain)
    assert stored is not None
    assert (stored.attempts, stored.requeues) == (1, 1)

    await api.client.delete(f"/v1/jobs/{plain}", headers=bearer(token))
    for action in ("hold", "release", "suspend", "resume", "requeue"):
        refused = await problem(await act(api, token, plain, action), 409)
        assert refused["type"].endswith("/already-finished")


async def test_another_tenants_job_is_not_found_and_the_admin_reaches_all(api: Api) -> None:
    acme = await api.tenant("acme")
    globex = await api.tenant("globex")
    job_id = await api.submitted(acme, job_spec())
    for action in ("hold", "release", "suspend", "resume", "requeue"):
        await problem(await act(api, globex, job_id, action), 404)
    await problem(await patch(api, globex, job_id, {"priority": "p0"}), 404)
    await problem(await api.client.post(f"/v1/jobs/{job_id}/hold"), 401)

    held = await done(api, api.admin_token, job_id, "hold")
    assert held["reason"] == "held by admin admin"
    await done(api, acme, job_id, "release")
    audit = await api.get(api.admin_token, "/v1/audit?action=work.hold,work.release")
    entries = (await audit.json())["items"]
    assert [(e["actor"], e["action"], e["target"]) for e in entries] == [
        ("acme", "work.release", job_id),
        ("admin", "work.hold", job_id),
    ]
    assert entries[1]["detail"]["tenant"] == "acme"


async def test_a_queued_job_changes_as_a_submission_is_checked(api: Api) -> None:
    token = await api.tenant("acme", allowed_priorities=["p1", "p2"])
    job_id = await api.submitted(token, job_spec(priority="p2"))
    soon = (datetime.now(UTC) + timedelta(days=2)).replace(microsecond=0)
    response = await patch(
        api,
        token,
        job_id,
        {
            "priority": "p1",
            "workers": 2,
            "accelerators_per_worker": 2,
            "deadline": soon.isoformat().replace("+00:00", "Z"),
            "start_window": "20:00-06:00",
        },
    )
    assert response.status == 200, await response.text()
    job = await response.json()
    assert (job["priority"], job["workers"], job["accelerators_per_worker"]) == ("p1", 2, 2)
    assert job["spec"]["deadline"].startswith(soon.strftime("%Y-%m-%dT%H:%M:%S"))
    assert job["spec"]["start_window"] == "20:00-06:00"
    stored = await api.store.get_work(await api.tenant_id(token), job_id)
    assert stored is not None
    assert stored.priority == "p1"
    cleared = await (await patch(api, token, job_id, {"deadline": None})).json()
    assert cleared["spec"]["deadline"] is None

    body = await problem(await patch(api, token, job_id, {"priority": "p0"}), 403)
    assert body["invalid_params"][0]["name"] == "$.priority"
    body = await problem(await patch(api, token, job_id, {"workers": 0}), 422)
    assert body["invalid_params"][0]["name"] == "$.workers"
    body = await problem(await patch(api, token, job_id, {"deadline": "2020-01-01T00:00:00Z"}), 422)
    assert body["invalid_params"][0]["name"] == "$.deadline"
    body = await problem(await patch(api, token, job_id, {"command": ["x"]}), 422)
    await problem(await patch(api, token, job_id, {}), 422)

    await place(api, job_id, running=False)
    refused = await problem(await patch(api, token, job_id, {"workers": 1}), 409)
    assert refused["type"].endswith("/job-started")
    assert "cancel it and submit a new one" in refused["detail"]
    audit = await (await api.get(api.admin_token, "/v1/audit?action=work.update")).json()
    assert [e["detail"]["changes"].get("workers") for e in audit["items"]] == [None, 2]
