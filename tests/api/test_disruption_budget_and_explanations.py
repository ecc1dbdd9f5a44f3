"""Over REST, both databases: a deployment's `min_available` and its `replicas` default
under autoscale, checked with the field at fault; and the explanations that misled
(the preemptor's victims, a victim's kept reason, work only cordoned nodes could run,
members kept apart on too few nodes). The scheduling pass is the loop's own steps."""

from __future__ import annotations

from typing import Any

from cloud.app_keys import REGISTRY
from tests.api.support import Api, bearer, deployment_spec, job_spec, one_pass, problem
from tests.loop.builders import node

AUTOSCALE = {"min_replicas": 2, "max_replicas": 8, "target_requests_per_s": 5.0}


def register(api: Api, node_id: str, gpus: int = 4) -> None:
    api.app[REGISTRY].apply_status(node(node_id, gpus=gpus).status)


async def refused(api: Api, token: str, spec: dict[str, Any], collection: str) -> tuple[str, str]:
    body = await problem(await api.submit(token, spec, collection=collection), 422)
    (param,) = body["invalid_params"]
    return param["name"], param["reason"]


async def test_replicas_default_to_min_replicas_under_autoscale(api: Api) -> None:
    token = await api.tenant("vision")
    model = await api.model(token)
    spec = deployment_spec(model, autoscale=AUTOSCALE)
    del spec["replicas"]
    created = await api.submit(token, spec, collection="deployments")
    assert created.status == 201, await created.text()
    body = await created.json()
    assert body["replicas"] == 2
    assert body["spec"]["replicas"] == 2
    plain = deployment_spec(model, name="plain")
    del plain["replicas"]
    assert (await (await api.submit(token, plain, collection="deployments")).json())[
        "replicas"
    ] == 1


async def test_min_available_is_checked_against_replicas_and_autoscale(api: Api) -> None:
    token = await api.tenant("vision")
    model = await api.model(token)
    assert await refused(api, token, deployment_spec(model, min_available=3), "deployments") == (
        "$.min_available",
        "must be within 0..replicas (2)",
    )
    assert await refused(
        api,
        token,
        deployment_spec(model, replicas=3, min_available=3, autoscale=AUTOSCALE),
        "deployments",
    ) == ("$.min_available", "must be within 0..autoscale's min_replicas (2)")
    name, _ = await refused(api, token, deployment_spec(model, min_available=-1), "deployments")
    assert name == "$.min_available"

    deployment_id = await api.submitted(
        token, deployment_spec(model, min_available=2), collection="deployments"
    )
    detail = await (await api.get(token, f"/v1/deployments/{deployment_id}")).json()
    assert detail["spec"]["min_available"] == 2
    # Autoscaling whose floor is below the budget is refused naming the budget...
    patched = await api.client.patch(
        f"/v1/deployments/{deployment_id}",
        json={"autoscale": {**AUTOSCALE, "min_replicas": 1}},
        headers=bearer(token),
    )
    body = await problem(patched, 422)
    assert body["invalid_params"][0]["name"] == "$.min_available"
    # ... while a person's scale-down is no disruption: the budget comes down with it.
    patched = await api.client.patch(
        f"/v1/deployments/{deployment_id}", json={"replicas": 1}, headers=bearer(token)
    )
    assert patched.status == 200, await patched.text()
    assert (await patched.json())["spec"]["min_available"] == 1


async def test_the_preemptor_lists_its_victims_and_the_victim_keeps_its_reason(api: Api) -> None:
    token = await api.tenant("vision")
    register(api, "gpu-a")
    batch = await api.submitted(
        token, job_spec(name="batch", priority="p2", accelerators_per_worker=4)
    )
    await one_pass(api)
    urgent = await api.submitted(
        token, job_spec(name="urgent", priority="p0", accelerators_per_worker=4)
    )
    await one_pass(api)

    explained = await (await api.get(token, f"/v1/jobs/{urgent}/explain")).json()
    [victim] = explained["explanation"]["preemptions"]
    assert (victim["work_id"], victim["node_id"], victim["reason"]) == (batch, "gpu-a", "priority")
    assert explained["message"].endswith(f"It preempted {batch} on gpu-a (priority).")
    # The next pass finds no room for the victim: its reason still says why it stopped.
    await one_pass(api)
    waiting = await (await api.get(token, f"/v1/jobs/{batch}")).json()
    assert waiting["state"] == "pending"
    assert waiting["reason"] == f"preempted by {urgent} (priority)"


async def test_work_only_a_cordoned_node_could_run_waits_for_it(api: Api) -> None:
    token = await api.tenant("vision")
    register(api, "gpu-big", gpus=8)
    register(api, "gpu-small", gpus=2)
    cordoned = await api.client.post("/v1/nodes/gpu-big/cordon", headers=bearer(api.admin_token))
    assert cordoned.status == 200, await cordoned.text()
    wide = await api.submitted(token, job_spec(name="wide", accelerators_per_worker=8))
    await one_pass(api)
    body = await (await api.get(token, f"/v1/jobs/{wide}")).json()
    assert body["reason"].startswith("Waiting for 1 cordoned or draining node: ")
    explained = await (await api.get(token, f"/v1/jobs/{wide}/explain")).json()
    assert explained["explanation"]["pending"]["code"] == "cordoned"


async def test_members_kept_apart_on_too_few_nodes_are_refused_naming_the_field(
    api: Api,
) -> None:
    token = await api.tenant("vision")
    register(api, "gpu-a")
    register(api, "gpu-b")
    apart = job_spec(workers=3, group="g", anti_affinity_groups=["g"])
    name, reason = await refused(api, token, apart, "jobs")
    assert name == "$.anti_affinity_groups"
    assert reason.startswith(
        "its 3 workers must each run on a node of their own (group g is among its "
        "anti_affinity_groups) and only 2 node(s) could hold one"
    )
    queued = await api.submitted(token, {**apart, "allow_unschedulable": True})
    await one_pass(api)
    explained = await (await api.get(token, f"/v1/jobs/{queued}/explain")).json()
    assert explained["explanation"]["pending"]["code"] == "unschedulable"
    assert explained["explanation"]["pending"]["field"] == "$.anti_affinity_groups"


async def test_the_openapi_document_gives_replicas_no_default_it_would_refuse(api: Api) -> None:
    document = await (await api.client.get("/openapi.json")).json()
    spec = document["components"]["schemas"]["DeploymentSpec"]["properties"]
    assert "default" not in spec["replicas"]
    assert spec["replicas"]["minimum"] == 1
    assert "min_available" in spec
