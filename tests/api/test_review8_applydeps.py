"""Applying a job file again whose `depends_on` names a job by name: the name means the
job it meant when the work was created, not a newer run of that name since.

Before: once `prep` ran again (an edited prep.yaml applied), re-applying an unchanged
train.yaml was a 409 "cannot change depends_on", as the name resolved to the new run.
"""

from __future__ import annotations

from typing import Any

from aiohttp import ClientResponse

from tests.api.support import Api, bearer, job_spec, problem
from tests.api.test_job_control import place

PREP = job_spec(name="prep")
TRAIN = job_spec(name="train", depends_on=[{"job": "prep"}])


async def _put(
    api: Api, token: str, spec: dict[str, Any], *, dry_run: bool = False
) -> ClientResponse:
    query = "?dry_run=true" if dry_run else ""
    return await api.client.put(f"/v1/jobs/{spec['name']}{query}", json=spec, headers=bearer(token))


async def _applied(api: Api, token: str, spec: dict[str, Any], status: int) -> dict[str, Any]:
    response = await _put(api, token, spec)
    assert response.status == status, await response.text()
    body: dict[str, Any] = await response.json()
    return body


async def _prep_ran_again(api: Api, token: str) -> tuple[str, str, str]:
    """(first prep's id, train's id, the second prep's id): train waits for the first
    prep, which succeeded; an edited prep.yaml applied then created a second one."""
    first_prep = (await _applied(api, token, PREP, 201))["id"]
    train = (await _applied(api, token, TRAIN, 201))["id"]
    await place(api, first_prep)
    await api.store.transition(first_prep, "succeeded")
    second_prep = (await _applied(api, token, {**PREP, "priority": "p2"}, 201))["id"]
    assert second_prep != first_prep
    return first_prep, train, second_prep


async def _depends_on(api: Api, token: str, work_id: str) -> list[dict[str, str]]:
    shown = await (await api.get(token, f"/v1/jobs/{work_id}")).json()
    depends_on: list[dict[str, str]] = shown["spec"]["depends_on"]
    return depends_on


async def test_an_unchanged_file_is_unchanged_after_its_dependency_ran_again(api: Api) -> None:
    token = await api.tenant("acme")
    first_prep, train, _ = await _prep_ran_again(api, token)

    for dry_run in (True, False):
        response = await _put(api, token, TRAIN, dry_run=dry_run)
        assert response.status == 200, await response.text()
        body = await response.json()
        assert (body["action"], body["id"], body["changes"]) == ("unchanged", train, [])
    # Still waiting for the prep it was created after.
    assert await _depends_on(api, token, train) == [{"job": first_prep, "condition": "succeeded"}]

    # What the queued job may change, it changes; its dependency stays the first prep.
    updated = await _applied(api, token, {**TRAIN, "priority": "p2"}, 200)
    assert (updated["action"], [c["field"] for c in updated["changes"]]) == (
        "updated",
        ["priority"],
    )
    assert await _depends_on(api, token, train) == [{"job": first_prep, "condition": "succeeded"}]


async def test_a_changed_depends_on_is_still_a_change(api: Api) -> None:
    token = await api.tenant("acme")
    await _prep_ran_again(api, token)
    await _applied(api, token, job_spec(name="eval"), 201)

    for depends_on in (
        [{"job": "prep", "condition": "ended"}],  # another condition
        [{"job": "eval"}],  # another job
        [{"job": "prep"}, {"job": "eval"}],  # one added
        [{"job": "eval"}, {"job": "prep"}],  # one added before it
        [],  # removed
    ):
        refused = await problem(await _put(api, token, {**TRAIN, "depends_on": depends_on}), 409)
        assert [p["name"] for p in refused["invalid_params"]] == ["$.depends_on"], depends_on
        assert "cannot change depends_on" in refused["detail"]


async def test_ended_work_applied_again_is_unchanged_and_new_work_waits_for_the_newest_run(
    api: Api,
) -> None:
    token = await api.tenant("acme")
    _, train, second_prep = await _prep_ran_again(api, token)
    cancelled = await api.client.delete(f"/v1/jobs/{train}", headers=bearer(token))
    assert cancelled.status == 200, await cancelled.text()

    same = await _applied(api, token, TRAIN, 200)
    assert (same["action"], same["id"], same["state"]) == ("unchanged", train, "cancelled")

    # Another spec under the ended name is new work: "prep" is the newest prep today.
    fresh = await _applied(api, token, {**TRAIN, "priority": "p2"}, 201)
    assert fresh["id"] != train
    assert await _depends_on(api, token, fresh["id"]) == [
        {"job": second_prep, "condition": "succeeded"}
    ]
