"""Cordons and admin taints and labels on nodes, live on the real Mosquitto."""

from __future__ import annotations

from typing import Any

import pytest

from cloud.app_keys import SETTINGS
from tests.store.databases import DatabaseUnderTest
from tests.support.control_plane import fleet, reaches, work
from tests.support.processes import run_greenfed
from tests.support.waiting import eventually_async

pytestmark = pytest.mark.timeout(90)


async def node(api: Any, node_id: str) -> dict[str, Any]:
    response = await api.get(api.admin_token, f"/v1/nodes/{node_id}")
    assert response.status == 200
    body = await response.json()
    assert isinstance(body, dict)
    return body


async def test_a_cordoned_node_keeps_its_work_and_takes_no_new_work_until_uncordoned(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    async with fleet(database, mosquitto_root, edge_nodes=1) as running:
        api = running.api
        token = await api.tenant("acme")
        model = await api.model(token)
        first = await api.submitted(
            token, {"name": "first", "model_id": model}, collection="deployments"
        )
        await reaches(api, token, first, "running", collection="deployments")

        base = api.app[SETTINGS].cloud.public_url
        assert base is not None
        code, printed, errors = await run_greenfed(
            ["nodes", "cordon", "orin-0", "--api", base, "--token", api.admin_token]
        )
        assert code == 0, errors
        assert "cordoned: no new work lands there" in printed
        assert (await node(api, "orin-0"))["cordoned"] is True
        refused = await api.client.post(
            "/v1/nodes/orin-0/uncordon", headers={"Authorization": f"Bearer {token}"}
        )
        assert refused.status == 403  # a tenant cannot

        second = await api.submitted(
            token, {"name": "second", "model_id": model}, collection="deployments"
        )

        async def refused_for_the_cordon() -> bool:
            explained = await (await api.get(token, f"/v1/deployments/{second}/explain")).json()
            return "untolerated taint" in explained["message"]

        await eventually_async(refused_for_the_cordon, timeout_s=20, message="not refused")
        assert (await work(api, token, first, "deployments"))["state"] == "running"
        # No work may tolerate the cordon.
        sneaky = {
            "name": "s",
            "model_id": model,
            "tolerations": [{"key": "greenfed.io/unschedulable"}],
        }
        response = await api.submit(token, sneaky, collection="deployments")
        assert response.status == 422

        uncordoned = await api.client.post(
            "/v1/nodes/orin-0/uncordon", headers={"Authorization": f"Bearer {api.admin_token}"}
        )
        assert uncordoned.status == 200
        await reaches(api, token, second, "running", collection="deployments")


async def test_admin_taints_and_labels_fence_a_node_beside_its_agents(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    async with fleet(database, mosquitto_root, edge_nodes=2) as running:
        api = running.api
        headers = {"Authorization": f"Bearer {api.admin_token}"}
        bad = await api.client.patch(
            "/v1/nodes/orin-1", json={"taints": ["ok=1", "no way"]}, headers=headers
        )
        assert bad.status == 422
        assert (await bad.json())["invalid_params"][0]["name"] == "$.taints[1]"
        # Labels follow the grammar the agent's and enrolment's do: what an admin sets is
        # shown to every tenant and exported, so no formula, control sequence or odd key.
        for labels, field in (
            ({"pool": "=HYPERLINK(1)"}, "$.labels.pool"),
            ({"pool": "\x1b[2Jred"}, "$.labels.pool"),
            ({"pool": " lead"}, "$.labels.pool"),
            ({"=evil key": "x"}, "$.labels"),
            ({"a\nb": "x"}, "$.labels"),
        ):
            refused = await api.client.patch(
                "/v1/nodes/orin-1", json={"labels": labels}, headers=headers
            )
            assert refused.status == 422, labels
            assert (await refused.json())["invalid_params"][0]["name"] == field, labels
        fenced = await api.client.patch(
            "/v1/nodes/orin-1",
            json={"taints": ["dedicated=risk:NoSchedule"], "labels": {"pool": "risk"}},
            headers=headers,
        )
        assert fenced.status == 200, await fenced.text()
        body = await node(api, "orin-1")
        assert body["taints"] == ["dedicated=risk:NoSchedule"]
        assert body["labels"]["pool"] == "risk"
        assert body["labels"]["test"] == "yes"  # the agent's stay
        unknown = await api.client.post("/v1/nodes/nobody/cordon", headers=headers)
        assert unknown.status == 404

        token = await api.tenant("acme")
        model = await api.model(token)
        risk = await api.submitted(
            token,
            {
                "name": "risk",
                "model_id": model,
                "node_selector": {"pool": "risk"},
                "tolerations": [{"key": "dedicated", "value": "risk"}],
            },
            collection="deployments",
        )
        placed = await reaches(api, token, risk, "running", collection="deployments")
        assert placed["nodes"] == ["orin-1"]
        general = await api.submitted(
            token,
            {"name": "general", "model_id": model, "replicas": 2, "max_replicas_per_node": 1},
            collection="deployments",
        )

        async def refused_for_the_taint() -> bool:
            explained = await (await api.get(token, f"/v1/deployments/{general}/explain")).json()
            return "untolerated taint" in explained["message"]

        await eventually_async(refused_for_the_taint, timeout_s=20, message="not fenced")
