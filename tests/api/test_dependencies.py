"""`depends_on` at the boundary (issue 17): what a job may wait for, refused with a 422
on `$.depends_on[i].job` otherwise, and the chain both ways in `GET /v1/jobs/{id}`.
Both databases; the chain running in order is tests/loop/test_dependencies.py."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import insert

from cloud.app_keys import REGISTRY
from cloud.loop.inputs import build_inputs
from cloud.store import create_store_engine
from cloud.store.schema import work_dependencies
from tests.api.support import Api, deployment_spec, job_spec, problem

UNKNOWN = "01JZZZZZZZZZZZZZZZZZZZZZZZ"


def after(job_id: str, condition: str = "succeeded") -> dict[str, Any]:
    return {"job": job_id, "condition": condition}


async def refused(api: Api, token: str, spec: dict[str, Any], **kwargs: Any) -> tuple[str, str]:
    body = await problem(await api.submit(token, spec, **kwargs), 422)
    (param,) = body["invalid_params"]
    return param["name"], param["reason"]


async def test_a_dependency_names_one_of_the_tenants_own_training_jobs(api: Api) -> None:
    token = await api.tenant("vision")
    other = await api.tenant("other")
    theirs = await api.submitted(other, job_spec(name="theirs"))
    mine = await api.submitted(token, job_spec(name="mine"))
    serving = await api.submitted(
        token, deployment_spec(await api.model(token)), collection="deployments"
    )

    name, reason = await refused(api, token, job_spec(depends_on=[after(mine), after(UNKNOWN)]))
    assert (name, reason) == (
        "$.depends_on[1].job",
        f"no job {UNKNOWN!r}: name one of your training jobs",
    )
    # Another tenant's job is unknown too: its existence is not disclosed.
    name, reason = await refused(api, token, job_spec(depends_on=[after(theirs)]))
    assert (name, reason) == (
        "$.depends_on[0].job",
        f"no job {theirs!r}: name one of your training jobs",
    )
    name, reason = await refused(api, token, job_spec(depends_on=[after(serving)]))
    assert name == "$.depends_on[0].job"
    assert "is a deployment" in reason
    name, _ = await refused(api, token, job_spec(depends_on=[after("not-an-id")]))
    assert name == "$.depends_on[0].job"
    name, reason = await refused(
        api, token, job_spec(depends_on=[after(mine), after(mine, "ended")])
    )
    assert (name, reason) == ("$.depends_on[1].job", f"names job {mine} twice")
    name, _ = await refused(api, token, job_spec(depends_on=[after(mine, "sometimes")]))
    assert name == "$.depends_on[0].condition"

    # A deployment may wait for a job too.
    waits = deployment_spec(await api.model(token, name="m2"), depends_on=[after(mine)])
    assert (await api.submit(token, waits, collection="deployments")).status == 201


async def test_a_condition_that_can_no_longer_hold_is_refused(api: Api) -> None:
    token = await api.tenant("vision")
    gone = await api.submitted(token, job_spec(name="gone"))
    cancelled = await api.client.delete(
        f"/v1/jobs/{gone}", headers={"Authorization": f"Bearer {token}"}
    )
    assert cancelled.status == 200
    name, reason = await refused(api, token, job_spec(depends_on=[after(gone)]))
    assert (name, reason) == (
        "$.depends_on[0].job",
        f"job {gone} already cancelled: it can never have succeeded",
    )
    assert (await api.submit(token, job_spec(depends_on=[after(gone, "ended")]))).status == 201


async def test_work_leading_into_a_dependency_loop_is_refused(api: Api) -> None:
    """The API cannot make a loop (a job may only name jobs that exist already, and
    depends_on never changes); one written into the store by other means is refused."""
    token = await api.tenant("vision")
    first = await api.submitted(token, job_spec(name="first"))
    second = await api.submitted(token, job_spec(name="second", depends_on=[after(first)]))
    engine = create_store_engine(api.database.settings)
    try:
        async with engine.begin() as connection:
            await connection.execute(
                insert(work_dependencies).values(
                    work_id=first, position=0, job_id=second, condition="succeeded"
                )
            )
    finally:
        await engine.dispose()
    name, reason = await refused(api, token, job_spec(name="third", depends_on=[after(second)]))
    assert name == "$.depends_on[0].job"
    assert reason == (f"job {second} leads into a dependency loop: {second} -> {first} -> {second}")


async def test_a_job_shows_what_it_waits_for_and_what_waits_for_it(api: Api) -> None:
    token = await api.tenant("vision")
    prepare = await api.submitted(token, job_spec(name="prepare"))
    train = await api.submitted(token, job_spec(name="train", depends_on=[after(prepare)]))
    report = await api.submitted(
        token, job_spec(name="report", depends_on=[after(prepare, "ended"), after(train, "failed")])
    )
    body = await (await api.get(token, f"/v1/jobs/{prepare}")).json()
    assert body["waits_for"] == []
    assert [(d["id"], d["name"], d["condition"], d["state"]) for d in body["needed_by"]] == [
        (train, "train", "succeeded", "pending"),
        (report, "report", "ended", "pending"),
    ]
    body = await (await api.get(token, f"/v1/jobs/{report}")).json()
    assert [(d["id"], d["condition"], d["verdict"]) for d in body["waits_for"]] == [
        (prepare, "ended", "waits"),
        (train, "failed", "waits"),
    ]
    assert body["spec"]["depends_on"] == [after(prepare, "ended"), after(train, "failed")]

    serving = await api.submitted(
        token,
        deployment_spec(await api.model(token), depends_on=[after(train)]),
        collection="deployments",
    )
    shown = await (await api.get(token, f"/v1/deployments/{serving}")).json()
    assert [(d["id"], d["verdict"]) for d in shown["waits_for"]] == [(train, "waits")]

    # The loop holds them back until their jobs end; the first job is queued.
    inputs = build_inputs(time.time(), api.app[REGISTRY].nodes(), await api.store.load_snapshot())
    assert [w.work_id for w in inputs.snapshot.queue] == [prepare]
    assert inputs.dependencies.holds_back(serving)
    assert inputs.dependencies.waiting[train].message == (
        f"Waiting for job {prepare} to succeed (now pending)."
    )
    assert inputs.dependencies.waiting[report].message == (
        f"Waiting for job {prepare} to end (now pending), job {train} to fail (now pending)."
    )


async def test_the_201_of_a_submission_shows_its_dependencies_as_get_does(api: Api) -> None:
    """docs/rest.md: the 201 carries the work as GET shows it, the jobs it waits for
    included; and the job it waits for shows it as needed_by from then on."""
    token = await api.tenant("vision")
    prepare = await api.submitted(token, job_spec(name="prepare"))
    created = await api.submit(token, job_spec(name="train", depends_on=[after(prepare)]))
    assert created.status == 201, await created.text()
    body = await created.json()
    shown = await (await api.get(token, f"/v1/jobs/{body['id']}")).json()
    assert body["waits_for"] == shown["waits_for"]
    assert [(d["id"], d["condition"], d["verdict"]) for d in body["waits_for"]] == [
        (prepare, "succeeded", "waits")
    ]
    assert body["needed_by"] == shown["needed_by"] == []

    model = await api.model(token)
    serving = await api.submit(
        token, deployment_spec(model, depends_on=[after(prepare)]), collection="deployments"
    )
    assert serving.status == 201, await serving.text()
    body = await serving.json()
    shown = await (await api.get(token, f"/v1/deployments/{body['id']}")).json()
    assert body["waits_for"] == shown["waits_for"]
    assert [d["id"] for d in body["waits_for"]] == [prepare]


async def test_a_retried_submission_shows_what_waits_for_it_now(api: Api) -> None:
    """An Idempotency-Key retry answers with the job as it is now: a job submitted since
    that waits for it is in its needed_by, as GET shows."""
    token = await api.tenant("vision")
    spec = job_spec(name="prepare")
    prepare = await api.submitted(token, spec, key="prepare-1")
    train = await api.submitted(token, job_spec(name="train", depends_on=[after(prepare)]))
    retried = await api.submit(token, spec, key="prepare-1")
    assert retried.status == 200, await retried.text()
    body = await retried.json()
    shown = await (await api.get(token, f"/v1/jobs/{prepare}")).json()
    assert body["needed_by"] == shown["needed_by"]
    assert [(d["id"], d["condition"]) for d in body["needed_by"]] == [(train, "succeeded")]
