"""A model update (`PATCH /v1/deployments/{id}`) meeting a canary rollout, on either
store: a canary is checked against the replica count the same PATCH leaves, a rollout in
progress keeps to its share when the count falls and ends, said in a `work.rollout`
event, when fewer than 2 replicas remain, and a rollout that a new model update replaces
is recorded as superseded."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from tests.api.support import Api, bearer, problem, running_api
from tests.store.databases import DatabaseUnderTest
from tests.support.onnx_models import mlp

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def api(database: DatabaseUnderTest) -> AsyncIterator[Api]:
    async with running_api(database) as running:
        yield running


async def deployment(api: Api, token: str, replicas: int) -> tuple[str, str]:
    """(deployment id, its model's id): a deployment of `replicas` replicas."""
    model_id = await api.model(token)
    spec = {"name": "risk", "model_id": model_id, "replicas": replicas}
    return await api.submitted(token, spec, collection="deployments"), model_id


async def patched(api: Api, token: str, deployment_id: str, body: dict[str, Any]) -> Any:
    response = await api.client.patch(
        f"/v1/deployments/{deployment_id}", json=body, headers=bearer(token)
    )
    assert response.status == 200, await response.text()
    return await response.json()


async def rollout_events(api: Api, deployment_id: str) -> list[dict[str, Any]]:
    records = await api.store.list_events(tenant_id=None, limit=1000, work_id=deployment_id)
    return [msgspec.json.decode(e.payload) for e in records if e.kind == "work.rollout"]


async def stored_spec(api: Api, token: str, deployment_id: str) -> dict[str, Any]:
    response = await api.get(token, f"/v1/deployments/{deployment_id}")
    assert response.status == 200, await response.text()
    spec: dict[str, Any] = (await response.json())["spec"]
    return spec


async def test_a_canary_is_checked_against_the_replicas_the_same_patch_leaves(api: Api) -> None:
    token = await api.tenant("acme")
    deployment_id, first = await deployment(api, token, replicas=3)
    second = await api.model(token, mlp(seed=11), name="mlp-v2")
    path = f"/v1/deployments/{deployment_id}"

    # One replica left: no room for a canary (it would never run, and nothing says why).
    one = await api.client.patch(
        path,
        json={"model_id": second, "replicas": 1, "rollout": {"canary_replicas": 2}},
        headers=bearer(token),
    )
    refused = await problem(one, 422)
    assert [p["name"] for p in refused["invalid_params"]] == ["$.rollout"]
    assert "the deployment would have 1" in refused["invalid_params"][0]["reason"]
    # Two replicas left: a canary of 2 would leave none on the model.
    two = await api.client.patch(
        path,
        json={"model_id": second, "replicas": 2, "rollout": {"canary_replicas": 2}},
        headers=bearer(token),
    )
    refused = await problem(two, 422)
    assert [p["name"] for p in refused["invalid_params"]] == ["$.rollout.canary_replicas"]
    assert "below the deployment's 2 replicas" in refused["invalid_params"][0]["reason"]
    # Nothing of either was stored.
    spec = await stored_spec(api, token, deployment_id)
    assert (spec["replicas"], spec["model_id"], spec["canary"]) == (3, first, None)
    # A share is taken of the new count: a third of 6 is 2.
    body = await patched(
        api,
        token,
        deployment_id,
        {"model_id": second, "replicas": 6, "rollout": {"canary_share": 0.34}},
    )
    assert (body["spec"]["replicas"], body["spec"]["canary"]["replicas"]) == (6, 2)


async def test_scaling_a_rollout_down_keeps_its_canary_within_the_share_asked(api: Api) -> None:
    token = await api.tenant("acme")
    deployment_id, _ = await deployment(api, token, replicas=6)
    second = await api.model(token, mlp(seed=11), name="mlp-v2")
    started = await patched(
        api, token, deployment_id, {"model_id": second, "rollout": {"canary_share": 0.34}}
    )
    assert started["spec"]["canary"]["replicas"] == 2  # of 6
    halved = await patched(api, token, deployment_id, {"replicas": 3})
    # 1 of 3, not 2 of 3: a third, as asked.
    assert (halved["spec"]["replicas"], halved["spec"]["canary"]["replicas"]) == (3, 1)
    grown = await patched(api, token, deployment_id, {"replicas": 5})
    assert (grown["spec"]["replicas"], grown["spec"]["canary"]["replicas"]) == (5, 1)
    assert await rollout_events(api, deployment_id) == []  # still in progress


async def test_scaling_a_rollout_to_one_replica_rolls_it_back_saying_so(api: Api) -> None:
    token = await api.tenant("acme")
    deployment_id, first = await deployment(api, token, replicas=3)
    second = await api.model(token, mlp(seed=11), name="mlp-v2")
    await patched(
        api, token, deployment_id, {"model_id": second, "rollout": {"canary_replicas": 1}}
    )
    body = await patched(api, token, deployment_id, {"replicas": 1})
    # Not a canary of 1 on 1 replica, waiting for ever: the rollout is over.
    assert (body["spec"]["replicas"], body["spec"]["model_id"], body["spec"]["canary"]) == (
        1,
        first,
        None,
    )
    (event,) = await rollout_events(api, deployment_id)
    assert event == {
        "work_id": deployment_id,
        "outcome": "rolled-back",
        "model_id": second,
        "previous_model_id": first,
        "reason": "scaled to 1 replica",
    }


async def test_a_model_update_that_replaces_a_rollout_records_it_superseded(api: Api) -> None:
    token = await api.tenant("acme")
    deployment_id, first = await deployment(api, token, replicas=3)
    second = await api.model(token, mlp(seed=11), name="mlp-v2")
    third = await api.model(token, mlp(seed=12), name="mlp-v3")
    await patched(
        api, token, deployment_id, {"model_id": second, "rollout": {"canary_replicas": 1}}
    )
    # A new rollout replaces the one in progress.
    replaced = await patched(
        api, token, deployment_id, {"model_id": third, "rollout": {"canary_replicas": 1}}
    )
    assert replaced["spec"]["canary"]["model_id"] == third
    # A plain model update ends the new one.
    plain = await patched(api, token, deployment_id, {"model_id": second})
    assert (plain["spec"]["model_id"], plain["spec"]["canary"]) == (second, None)
    # No rollout in progress: nothing to record.
    await patched(api, token, deployment_id, {"model_id": third})
    events = await rollout_events(api, deployment_id)
    assert [(e["outcome"], e["model_id"], e["previous_model_id"]) for e in events] == [
        ("superseded", second, first),
        ("superseded", third, first),
    ]
    assert {e["reason"] for e in events} == {"replaced by a model update by acme"}
