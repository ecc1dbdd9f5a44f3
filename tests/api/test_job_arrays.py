"""Job arrays over REST (issue 29): `array = "0-3%2"` makes one ordinary training job per
index in one commit; the array's id shows the summary and the tasks, and cancels them
all; `ARRAYID_N` names one task wherever a job id is taken. Both databases; the throttle
against real agents is tests/e2e/test_job_arrays_live.py."""

from __future__ import annotations

import time
from typing import Any

import pytest

from cloud.api import job_arrays
from cloud.app_keys import REGISTRY
from cloud.loop.inputs import build_inputs
from tests.api.support import Api, bearer, deployment_spec, job_spec, problem


async def refused(api: Api, token: str, spec: dict[str, Any]) -> tuple[str, str]:
    body = await problem(await api.submit(token, spec), 422)
    (param,) = body["invalid_params"]
    return param["name"], param["reason"]


async def test_an_array_is_one_job_per_task_committed_together(api: Api) -> None:
    token = await api.tenant("vision")
    response = await api.submit(token, job_spec(name="sweep", array="0-15:5%2"))
    assert response.status == 201, await response.text()
    body = await response.json()
    array_id = body["id"]
    assert response.headers["Location"] == f"/v1/jobs/{array_id}"
    array = body["array"]
    assert (array["array"], array["count"], array["throttle"]) == ("0-15:5%2", 4, 2)
    assert [task["index"] for task in array["tasks"]] == [0, 5, 10, 15]
    assert (body["state"], array["state"], array["states"]) == (
        "pending",
        "pending",
        {"pending": 4},
    )
    assert body["spec"]["array"] == "0-15:5%2"
    assert body["spec"]["array_task"] is None
    assert "GREENFED_ARRAY_TASK_ID" not in body["spec"]["env"]

    # Each task is an ordinary job: its own id, its index in its env and in its view.
    task_ids = {task["index"]: task["id"] for task in array["tasks"]}
    task = await (await api.get(token, f"/v1/jobs/{task_ids[10]}")).json()
    assert (task["array_id"], task["array_index"], task["name"]) == (array_id, 10, "sweep")
    assert task["spec"]["array"] is None
    assert task["spec"]["array_task"] == {
        "array_id": array_id,
        "array": "0-15:5%2",
        "index": 10,
        "count": 4,
        "throttle": 2,
    }
    assert task["spec"]["env"] == {
        "GREENFED_ARRAY_JOB_ID": array_id,
        "GREENFED_ARRAY_TASK_COUNT": "4",
        "GREENFED_ARRAY_TASK_MIN": "0",
        "GREENFED_ARRAY_TASK_MAX": "15",
        "GREENFED_ARRAY_TASK_ID": "10",
    }
    # ARRAYID_INDEX names the task wherever a job's id is taken.
    named = await api.get(token, f"/v1/jobs/{array_id}_10")
    assert (await named.json())["id"] == task_ids[10]
    assert (await api.get(token, f"/v1/jobs/{array_id}_10/explain")).status == 200
    assert (await api.get(token, f"/v1/jobs/{array_id}_3")).status == 404

    listed = await (await api.get(token, "/v1/jobs")).json()
    assert sorted((item["array_index"], item["id"]) for item in listed["items"]) == sorted(
        (index, work_id) for index, work_id in task_ids.items()
    )

    # The scheduling loop offers every ready task with the array's cap: the core places
    # at most 2 of those it can place (cloud/scheduler/array_cap.py).
    inputs = build_inputs(time.time(), api.app[REGISTRY].nodes(), await api.store.load_snapshot())
    assert sorted(w.work_id for w in inputs.snapshot.queue) == sorted(task_ids.values())
    cap = inputs.snapshot.array_caps[array_id]
    assert (cap.throttle, cap.placed) == (2, ())
    assert cap.tasks == {work_id: index for index, work_id in task_ids.items()}


async def test_a_bad_array_is_refused_naming_it(api: Api) -> None:
    token = await api.tenant("vision")
    for text, reason in (
        ("0-9%0", "'0-9%0': the throttle %0 must be at least 1"),
        ("9-3", "'9-3': the range 9-3 is empty (it ends before it starts)"),
        ("1,,3", "'1,,3': '' is not an index, a range A-B or a stepped range A-B:S"),
        ("0-10000", "'0-10000' asks for more than 10000 tasks, an array's most"),
        ("1,3,1", "'1,3,1' names task 1 twice"),
        ("0-3%x", "'0-3%x': the throttle after % is a whole number, e.g. %10"),
        # Digits of other scripts, which Python's \d and int() read as 0-9.
        ("\uff10-\uff13", "'\uff10-\uff13': '\uff10-\uff13' is not an index"),
        ("0-3%\u0662", "'0-3%\u0662': the throttle after % is a whole number"),
    ):
        name, said = await refused(api, token, job_spec(array=text))
        assert name == "$.array"
        assert said.startswith(reason), said
    assert (await refused(api, token, job_spec(array="")))[0] == "$.array"
    task = {"array_id": "01JZZZZZZZZZZZZZZZZZZZZZZZ", "array": "0", "index": 0, "count": 1}
    name, said = await refused(api, token, job_spec(array_task=task))
    assert (name, said) == (
        "$.array_task",
        "is set by greenfed on the tasks of an array; submit `array` instead",
    )
    name, said = await refused(api, token, job_spec(env={"GREENFED_ARRAY_TASK_ID": "3"}))
    assert name == "$.env"
    assert "GREENFED_ARRAY_TASK_ID is set by greenfed" in said
    assert (await (await api.get(token, "/v1/jobs")).json())["count"] == 0


async def test_cancel_one_task_or_all_and_the_summary_follows(api: Api) -> None:
    token = await api.tenant("vision")
    other = await api.tenant("other")
    array_id = await api.submitted(token, job_spec(array="0-2"))

    one = await api.client.delete(f"/v1/jobs/{array_id}_1", headers=bearer(token))
    assert one.status == 200, await one.text()
    assert (await one.json())["state"] == "cancelled"
    summary = await (await api.get(token, f"/v1/jobs/{array_id}")).json()
    assert summary["array"]["states"] == {"pending": 2, "cancelled": 1}
    assert summary["state"] == "pending"

    # Another tenant neither sees nor cancels it.
    assert (await api.get(other, f"/v1/jobs/{array_id}")).status == 404
    assert (await api.client.delete(f"/v1/jobs/{array_id}", headers=bearer(other))).status == 404
    assert (await api.get(other, f"/v1/jobs/{array_id}_0")).status == 404

    every = await api.client.delete(f"/v1/jobs/{array_id}", headers=bearer(token))
    assert every.status == 200, await every.text()
    body = await every.json()
    assert (body["state"], body["array"]["states"]) == ("cancelled", {"cancelled": 3})
    assert [task["reason"] for task in body["array"]["tasks"]] == ["cancelled by the tenant"] * 3
    again = await api.client.delete(f"/v1/jobs/{array_id}", headers=bearer(token))
    assert (await problem(again, 409))["type"].endswith("already-finished")

    # The admin sees every tenant's array.
    seen = await api.get(api.admin_token, f"/v1/jobs/{array_id}")
    assert (await seen.json())["tenant"] == "vision"


async def test_the_whole_array_fits_in_max_queued_or_none_is_created(api: Api) -> None:
    token = await api.tenant("vision", max_queued=3)
    body = await problem(await api.submit(token, job_spec(array="0-3")), 429)
    assert "the array's 4 tasks do not fit" in body["detail"]
    assert (await (await api.get(token, "/v1/jobs")).json())["count"] == 0
    assert (await api.submit(token, job_spec(array="0-2"))).status == 201


async def test_a_retry_with_the_idempotency_key_gets_the_same_array(api: Api) -> None:
    token = await api.tenant("vision")
    spec = job_spec(array="0-4%1", env={"SEED": "7"})
    first = await api.submit(token, spec, key="sweep-1")
    assert first.status == 201
    array_id = (await first.json())["id"]
    retry = await api.submit(token, spec, key="sweep-1")
    assert retry.status == 200
    assert (await retry.json())["id"] == array_id
    other = await api.submit(token, job_spec(array="0-5"), key="sweep-1")
    await problem(other, 409)
    assert (await (await api.get(token, "/v1/jobs")).json())["count"] == 5


async def test_apply_by_name_refuses_an_array_and_points_to_submit(api: Api) -> None:
    token = await api.tenant("vision")
    response = await api.client.put(
        "/v1/jobs/sweep", json=job_spec(name="sweep", array="0-3"), headers=bearer(token)
    )
    body = await problem(response, 422)
    assert body["invalid_params"][0]["name"] == "$.array"
    assert "submit the array with POST /v1/jobs" in body["invalid_params"][0]["reason"]
    assert (await (await api.get(token, "/v1/jobs")).json())["count"] == 0


async def test_a_task_takes_every_per_job_action_by_its_task_name(api: Api) -> None:
    token = await api.tenant("vision")
    array_id = await api.submitted(token, job_spec(array="0-2%1"))
    held = await api.client.post(f"/v1/jobs/{array_id}_2/hold", headers=bearer(token))
    assert held.status == 200, await held.text()
    assert ((await held.json())["array_index"], (await held.json())["hold"]) == (2, "held")
    patched = await api.client.patch(
        f"/v1/jobs/{array_id}_2", json={"priority": "p2"}, headers=bearer(token)
    )
    assert patched.status == 200, await patched.text()
    task = await (await api.get(token, f"/v1/jobs/{array_id}_2")).json()
    assert (task["priority"], task["spec"]["env"]["GREENFED_ARRAY_TASK_ID"]) == ("p2", "2")
    # Per-job actions take a task, not the array.
    refused = await api.client.post(f"/v1/jobs/{array_id}/hold", headers=bearer(token))
    assert refused.status == 409
    assert (await refused.json())["type"].endswith("/job-array")


async def test_the_arrays_name_names_the_array_not_one_of_its_tasks(api: Api) -> None:
    token = await api.tenant("vision")
    array_id = await api.submitted(token, job_spec(name="sweep", array="0-2"))
    shown = await api.get(token, "/v1/jobs/sweep")
    assert shown.status == 200, await shown.text()
    body = await shown.json()
    assert (body["id"], body["array"]["count"]) == (array_id, 3)

    # A job of the same name beside the array's tasks makes the name ambiguous again.
    single = await api.submitted(token, job_spec(name="sweep"))
    both = await problem(await api.get(token, "/v1/jobs/sweep"), 409)
    assert single in both["detail"]
    assert (await api.client.delete(f"/v1/jobs/{single}", headers=bearer(token))).status == 200

    # Cancelling by name cancels every task; once all have ended the name still names it.
    every = await api.client.delete("/v1/jobs/sweep", headers=bearer(token))
    assert every.status == 200, await every.text()
    assert (await every.json())["array"]["states"] == {"cancelled": 3}
    assert (await (await api.get(token, "/v1/jobs/sweep")).json())["id"] in (array_id, single)


async def test_a_dependency_on_an_arrays_name_is_refused_pointing_to_its_tasks(
    api: Api,
) -> None:
    """An array's name names the array, which is no job to wait for: the 422 says so in
    the user's terms, not as "no job" with an id they never sent."""
    token = await api.tenant("vision")
    array_id = await api.submitted(token, job_spec(name="sweep", array="2-5"))
    name, reason = await refused(api, token, job_spec(name="after", depends_on=[{"job": "sweep"}]))
    assert name == "$.depends_on[0].job"
    assert reason == (
        f"'sweep' names job array {array_id}, which is no job; name one of its tasks ({array_id}_2)"
    )
    # One of its tasks is a job like any other.
    waits = job_spec(name="after", depends_on=[{"job": f"{array_id}_3"}])
    assert (await api.submit(token, waits)).status == 201


async def test_an_array_with_the_key_of_a_deployment_is_a_409_not_a_crash(api: Api) -> None:
    token = await api.tenant("vision")
    model = await api.model(token)
    first = await api.submit(token, deployment_spec(model), collection="deployments", key="K")
    assert first.status == 201, await first.text()
    body = await problem(await api.submit(token, job_spec(array="0-2"), key="K"), 409)
    assert body["type"].endswith("/idempotency-key-reused")


async def test_a_retry_of_an_accepted_array_gets_it_after_its_dependency_can_no_longer_hold(
    api: Api,
) -> None:
    """Refused now as new work (it waits for a job that was cancelled), the retry with
    the key of the accepted array still gets that array, as a single job's does."""
    token = await api.tenant("vision")
    waited_for = await api.submitted(token, job_spec(name="first"))
    spec = job_spec(
        name="sweep", array="0-2", depends_on=[{"job": waited_for, "condition": "succeeded"}]
    )
    accepted = await api.submit(token, spec, key="A")
    assert accepted.status == 201, await accepted.text()
    cancelled = await api.client.delete(f"/v1/jobs/{waited_for}", headers=bearer(token))
    assert cancelled.status in (200, 202), await cancelled.text()
    retry = await api.submit(token, spec, key="A")
    assert retry.status == 200, await retry.text()
    assert (await retry.json())["id"] == (await accepted.json())["id"]


async def test_an_array_whose_env_leaves_no_room_for_its_variables_is_refused_storing_nothing(
    api: Api,
) -> None:
    """Each task's env holds the 5 GREENFED_ARRAY_* variables besides the submitted ones,
    within env's limit of 1024: a fuller env is a 422 on it, and no task is stored that
    no view could read (before: a 500, both tasks stored, and every listing a 409)."""
    token = await api.tenant("vision")
    other = await api.tenant("other")
    bystander = await api.submitted(other, job_spec(name="bystander"))
    full = {f"V{index}": "x" for index in range(1020)}
    name, said = await refused(api, token, job_spec(name="sweep", array="0-1", env=full))
    assert name == "$.env"
    assert said.startswith("has 1020 variables; an array's has at most 1019"), said
    stored = (await api.store.list_work(None, limit=10)).items
    assert [record.work_id for record in stored] == [bystander]

    fits = dict(list(full.items())[:1019])
    array_id = await api.submitted(token, job_spec(name="sweep", array="0-1", env=fits))
    listed = await api.get(api.admin_token, "/v1/jobs")
    assert listed.status == 200, await listed.text()
    assert len((await listed.json())["items"]) == 3
    cancelled = await api.client.delete("/v1/jobs/sweep", headers=bearer(token))
    assert cancelled.status == 200, await cancelled.text()
    assert (await cancelled.json())["id"] == array_id


async def test_no_task_is_stored_that_breaks_a_limit_of_the_spec(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tasks are made without the spec's checks: one is read back before any is stored,
    so a limit the array's own checks miss is a 422 on its field too, never a task that
    no view nor scheduling pass could read."""
    monkeypatch.setattr(job_arrays, "MAX_ENV_VARIABLES", 4096)  # the array's check misses
    token = await api.tenant("vision")
    full = {f"V{index}": "x" for index in range(1020)}
    name, _ = await refused(api, token, job_spec(array="0-1", env=full))
    assert name == "$.env"
    assert (await api.store.list_work(None, limit=10)).items == ()
