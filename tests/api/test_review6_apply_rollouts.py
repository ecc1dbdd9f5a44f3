"""Apply by name (`PUT /v1/deployments/{name}`) meeting a canary rollout, on either
store, as a PATCH of the same change does: a new model supersedes the rollout in
progress, said in a `work.rollout` event; a lower count brings the canary down in
proportion; 1 replica rolls it back, said; and apply never starts a rollout of its own."""

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


def risk_spec(model_id: str, replicas: int) -> dict[str, Any]:
    return {"name": "risk", "model_id": model_id, "replicas": replicas}


async def applied(api: Api, token: str, spec: dict[str, Any]) -> Any:
    response = await api.client.put(
        f"/v1/deployments/{spec['name']}", json=spec, headers=bearer(token)
    )
    assert response.status in (200, 201), await response.text()
    return await response.json()


async def rolling_out(api: Api, token: str, replicas: int, rollout: dict[str, Any]) -> list[str]:
    """[deployment id, its model, the canary's model]: an applied deployment of
    `replicas` replicas whose new model is rolling out (PATCH with a `rollout`)."""
    first = await api.model(token)
    second = await api.model(token, mlp(seed=11), name="mlp-v2")
    deployment_id = (await applied(api, token, risk_spec(first, replicas)))["id"]
    response = await api.client.patch(
        f"/v1/deployments/{deployment_id}",
        json={"model_id": second, "rollout": rollout},
        headers=bearer(token),
    )
    assert response.status == 200, await response.text()
    return [deployment_id, first, second]


async def stored_spec(api: Api, token: str, deployment_id: str) -> dict[str, Any]:
    response = await api.get(token, f"/v1/deployments/{deployment_id}")
    assert response.status == 200, await response.text()
    spec: dict[str, Any] = (await response.json())["spec"]
    return spec


async def rollout_events(api: Api, deployment_id: str) -> list[dict[str, Any]]:
    records = await api.store.list_events(tenant_id=None, limit=1000, work_id=deployment_id)
    return [msgspec.json.decode(e.payload) for e in records if e.kind == "work.rollout"]


async def test_applying_a_new_model_records_the_rollout_it_replaces_superseded(api: Api) -> None:
    token = await api.tenant("acme")
    deployment_id, first, second = await rolling_out(api, token, 3, {"canary_replicas": 1})
    third = await api.model(token, mlp(seed=12), name="mlp-v3")

    body = await applied(api, token, risk_spec(third, 3))
    assert [c["field"] for c in body["changes"]] == ["model_id"]
    spec = await stored_spec(api, token, deployment_id)
    assert (spec["model_id"], spec["canary"]) == (third, None)
    assert await rollout_events(api, deployment_id) == [
        {
            "work_id": deployment_id,
            "outcome": "superseded",
            "model_id": second,
            "previous_model_id": first,
            "reason": "replaced by a model update by acme",
        }
    ]


async def test_applying_fewer_replicas_keeps_the_canary_within_its_share(api: Api) -> None:
    token = await api.tenant("acme")
    deployment_id, first, second = await rolling_out(api, token, 6, {"canary_share": 0.34})
    assert (await stored_spec(api, token, deployment_id))["canary"]["replicas"] == 2  # of 6

    await applied(api, token, risk_spec(first, 3))
    spec = await stored_spec(api, token, deployment_id)
    # 1 of 3, not 2 of 3: a third, as asked (as PATCH {"replicas": 3} leaves it).
    assert (spec["replicas"], spec["model_id"], spec["canary"]["model_id"]) == (3, first, second)
    assert spec["canary"]["replicas"] == 1
    await applied(api, token, risk_spec(first, 5))
    spec = await stored_spec(api, token, deployment_id)
    assert (spec["replicas"], spec["canary"]["replicas"]) == (5, 1)
    assert await rollout_events(api, deployment_id) == []  # still in progress


async def test_applying_one_replica_rolls_the_rollout_back_saying_so(api: Api) -> None:
    token = await api.tenant("acme")
    deployment_id, first, second = await rolling_out(api, token, 3, {"canary_replicas": 1})

    await applied(api, token, risk_spec(first, 1))
    spec = await stored_spec(api, token, deployment_id)
    # Not a canary of 1 on 1 replica, waiting for ever: the rollout is over.
    assert (spec["replicas"], spec["model_id"], spec["canary"]) == (1, first, None)
    assert await rollout_events(api, deployment_id) == [
        {
            "work_id": deployment_id,
            "outcome": "rolled-back",
            "model_id": second,
            "previous_model_id": first,
            "reason": "scaled to 1 replica",
        }
    ]


async def test_apply_never_starts_a_rollout_of_its_own(api: Api) -> None:
    token = await api.tenant("acme")
    first = await api.model(token)
    second = await api.model(token, mlp(seed=11), name="mlp-v2")
    deployment_id = (await applied(api, token, risk_spec(first, 3)))["id"]
    canary = {"model_id": second, "replicas": 2}

    # With a new model: refused, naming the field (a rollout is PATCH's `rollout`).
    response = await api.client.put(
        "/v1/deployments/risk",
        json={**risk_spec(second, 3), "canary": canary},
        headers=bearer(token),
    )
    refused = await problem(response, 422)
    assert [p["name"] for p in refused["invalid_params"]] == ["$.canary"]
    # With the model kept: the canary sent is not taken, on any count (2 of 2 would
    # leave no replica on the deployment's model).
    await applied(api, token, {**risk_spec(first, 2), "canary": canary})
    spec = await stored_spec(api, token, deployment_id)
    assert (spec["replicas"], spec["model_id"], spec["canary"]) == (2, first, None)
    assert await rollout_events(api, deployment_id) == []
