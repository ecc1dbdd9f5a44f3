"""Live, real agents over Mosquitto, both databases: a drain waits on a deployment's
`min_available` and says so until a replacement serves elsewhere; a preemptor's
explanation lists its victims and the victim keeps "preempted by …" until it is
placed again."""

from __future__ import annotations

from typing import Any

import pytest

from cloud.app_keys import SCHEDULER
from tests.loop.test_scaling import replicas_become
from tests.store.databases import DatabaseUnderTest
from tests.support.control_plane import cancel, fleet, reaches, work
from tests.support.waiting import eventually_async

pytestmark = pytest.mark.timeout(120)


async def admin(api: Any, method: str, path: str) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {api.admin_token}"}
    response = await api.client.request(method, path, headers=headers)
    assert response.status == 200, await response.text()
    body = await response.json()
    assert isinstance(body, dict)
    return body


async def test_a_drain_waits_on_min_available_until_a_replacement_serves_elsewhere(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    async with fleet(database, mosquitto_root, edge_nodes=3) as running:
        api = running.api
        token = await api.tenant("acme")
        # The third node is cordoned: at first a replacement has nowhere to go.
        await admin(api, "POST", "/v1/nodes/orin-2/cordon")
        spec = {
            "name": "detector",
            "model_id": await api.model(token),
            "replicas": 2,
            "min_available": 2,
        }
        deployment_id = await api.submitted(token, spec, collection="deployments")
        await replicas_become(api, token, deployment_id, 2)
        placed = sorted((await work(api, token, deployment_id, "deployments"))["nodes"])
        assert placed == ["orin-0", "orin-1"]

        await admin(api, "POST", "/v1/nodes/orin-0/drain")
        waiting = "waiting: detector would fall below min_available 2 (1 serving elsewhere)"

        async def drain_waits() -> bool:
            node = await admin(api, "GET", "/v1/nodes/orin-0")
            return bool(node["draining"] and node["drain_waiting"] == [waiting])

        await eventually_async(drain_waits, timeout_s=20, message="the drain does not wait")
        # It waits: both replicas still serve, the one on the draining node included.
        body = await work(api, token, deployment_id, "deployments")
        assert sorted(body["nodes"]) == ["orin-0", "orin-1"]
        assert [r["state"] for r in body["replica_states"]] == ["ready", "ready"]

        # Room elsewhere: the replacement starts on orin-2, then orin-0's replica goes.
        await admin(api, "POST", "/v1/nodes/orin-2/uncordon")

        async def moved() -> bool:
            body.update(await work(api, token, deployment_id, "deployments"))
            ready = [r for r in body["replica_states"] if r["state"] == "ready"]
            return sorted(body["nodes"]) == ["orin-1", "orin-2"] and len(ready) == 2

        await eventually_async(moved, timeout_s=40, message=lambda: f"not moved: {body}")
        node = await admin(api, "GET", "/v1/nodes/orin-0")
        assert node["draining"] is True
        assert node["drain_waiting"] == []
        # And its explanation no longer says where the replicas were placed first.
        explained = await (await api.get(token, f"/v1/deployments/{deployment_id}/explain")).json()
        assert "orin-0" not in explained["message"]


async def test_the_preemptor_lists_its_victims_and_the_victim_keeps_its_reason_live(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    async with fleet(database, mosquitto_root, cloud_nodes=1) as running:
        api = running.api
        token = await api.tenant("acme")
        job = {
            "command": ["python", "train.py"],
            "accelerators_per_worker": 4,
            "estimated_duration_s": 3600,
            "checkpoint_interval_s": 60,
        }
        batch = await api.submitted(token, {**job, "name": "batch", "priority": "p2"})
        await reaches(api, token, batch, "running")
        urgent = await api.submitted(token, {**job, "name": "urgent", "priority": "p0"})
        await reaches(api, token, urgent, "running", timeout_s=40)

        explained = await (await api.get(token, f"/v1/jobs/{urgent}/explain")).json()
        [victim] = explained["explanation"]["preemptions"]
        assert (victim["work_id"], victim["node_id"], victim["reason"]) == (
            batch,
            "a100-0",
            "priority",
        )
        assert f"It preempted {batch} on a100-0 (priority)." in explained["message"]

        # Passes go on deciding about the victim (its explanation says it waits), and
        # its reason still says why it stopped.
        loop = api.app[SCHEDULER]
        passes = loop.stats.passes

        async def decided_again() -> bool:
            body = await (await api.get(token, f"/v1/jobs/{batch}/explain")).json()
            outcome = (body["explanation"] or {}).get("outcome")
            return outcome == "pending" and loop.stats.passes >= passes + 2

        await eventually_async(decided_again, timeout_s=20, message="no pass looked again")
        victim_now = await work(api, token, batch)
        assert victim_now["state"] == "pending"
        assert victim_now["reason"] == f"preempted by {urgent} (priority)"

        # Once the room is free again it is placed, and the reason says so.
        await cancel(api, token, urgent)
        resumed = await reaches(api, token, batch, "running", timeout_s=40)
        assert not (resumed["reason"] or "").startswith("preempted by")
