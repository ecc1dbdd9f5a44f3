"""Deployments that scale, live on the real Mosquitto: by PATCH, and on their load."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import msgspec
import pytest

from cloud.app_keys import REGISTRY, SETTINGS
from cloud.work.views import DeploymentView
from greenfed.work_commands import replicas_line
from tests.store.databases import DatabaseUnderTest
from tests.support.control_plane import fleet, reaches, work
from tests.support.processes import run_greenfed
from tests.support.waiting import eventually_async

pytestmark = pytest.mark.timeout(120)

X = [[1.0, -2.0, 0.5, 3.0]]


async def ready_endpoints(api: Any, token: str, deployment_id: str) -> list[str]:
    body = await work(api, token, deployment_id, "deployments")
    return [r["endpoint"] for r in body["replica_states"] if r["state"] == "ready"]


async def replicas_become(api: Any, token: str, deployment_id: str, count: int) -> None:
    seen: dict[str, Any] = {}

    async def there() -> bool:
        seen.update(await work(api, token, deployment_id, "deployments"))
        states = [r["state"] for r in seen["replica_states"]]
        return bool(seen["replicas"] == count and states == ["ready"] * count)

    await eventually_async(
        there,
        timeout_s=40,
        interval_s=0.1,
        message=lambda: (
            f"wanted {count} ready, have {seen.get('replicas')}: "
            f"{[r['state'] for r in seen.get('replica_states', [])]}"
        ),
    )


@contextlib.asynccontextmanager
async def load(
    api: Any, token: str, deployment_id: str, per_s: float, *, refresh_every: int = 20
) -> AsyncIterator[list[int]]:
    """Requests at `per_s` spread over the ready replicas, the list of them read from the
    API every `refresh_every` requests; yields the statuses seen (0: no answer)."""
    statuses: list[int] = []

    async def drive() -> None:
        async with aiohttp.ClientSession() as http:
            endpoints: list[str] = []
            sent = 0
            while True:
                if sent % refresh_every == 0:
                    endpoints = await ready_endpoints(api, token, deployment_id) or endpoints
                if endpoints:
                    url = endpoints[sent % len(endpoints)]
                    try:
                        async with http.post(url, json={"inputs": {"x": X}}) as answer:
                            statuses.append(answer.status)
                    except aiohttp.ClientError:
                        statuses.append(0)
                sent += 1
                await asyncio.sleep(1.0 / per_s)

    task = asyncio.create_task(drive())
    try:
        yield statuses
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def events_of(api: Any, deployment_id: str, kind: str) -> list[dict[str, Any]]:
    records = await api.store.list_events(tenant_id=None, limit=1000)
    return [
        msgspec.json.decode(e.payload)
        for e in records
        if e.kind == kind and e.work_id == deployment_id
    ]


async def test_a_patch_scales_a_deployment_up_and_down(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    async with fleet(database, mosquitto_root, edge_nodes=3) as running:
        api = running.api
        token = await api.tenant("acme")
        spec = {"name": "detector", "model_id": await api.model(token), "replicas": 1}
        deployment_id = await api.submitted(token, spec, collection="deployments")
        await reaches(api, token, deployment_id, "running", collection="deployments")
        path = f"/v1/deployments/{deployment_id}"
        headers = {"Authorization": f"Bearer {token}"}

        response = await api.client.patch(path, json={"replicas": 3}, headers=headers)
        assert response.status == 200, await response.text()
        await replicas_become(api, token, deployment_id, 3)
        base = api.app[SETTINGS].cloud.public_url
        assert base is not None
        code, printed, errors = await run_greenfed(
            ["scale", deployment_id, "1", "--api", base, "--token", token]
        )
        assert code == 0, errors
        assert printed.strip() == f"deployment {deployment_id} scaled to 1 replica(s)"
        await replicas_become(api, token, deployment_id, 1)

        bounds = {"min_replicas": 2, "max_replicas": 3, "target_requests_per_s": 50}
        refused = await api.client.patch(
            path, json={"replicas": 5, "autoscale": bounds}, headers=headers
        )
        assert refused.status == 422
        assert (await refused.json())["invalid_params"][0]["name"] == "$.replicas"
        unknown = await api.client.patch(path, json={"replica": 2}, headers=headers)
        assert unknown.status == 422


async def test_replicas_follow_the_load_up_and_back_down(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    async with fleet(database, mosquitto_root, edge_nodes=4) as running:
        api = running.api
        token = await api.tenant("acme")
        spec = {
            "name": "risk",
            "model_id": await api.model(token),
            "replicas": 1,
            "autoscale": {
                "min_replicas": 1,
                "max_replicas": 4,
                "target_requests_per_s": 4.0,
                "scale_down_stabilization_s": 2.0,
            },
        }
        deployment_id = await api.submitted(token, spec, collection="deployments")
        await replicas_become(api, token, deployment_id, 1)

        async with load(api, token, deployment_id, per_s=30.0) as statuses:
            await replicas_become(api, token, deployment_id, 4)
            text = await (await api.get(api.admin_token, "/metrics")).text()
            assert (
                f'greenfed_deployment_replicas{{deployment="{deployment_id}",'
                f'state="desired",tenant="acme"}} 4.0' in text
            )
            body = await work(api, token, deployment_id, "deployments")
            view = msgspec.convert(body, DeploymentView)
            assert view.last_scaling is not None
            assert view.last_scaling.to_replicas > view.last_scaling.from_replicas
            line = replicas_line(view)
            assert line.startswith("replicas: 4 desired, 4 ready  (autoscaled 1..4 on 4 ")
            assert "requests/s per replica against a target of 4" in line
        assert statuses
        assert set(statuses) == {200}  # scaling up failed no request

        # The load is gone: back to one replica after the down-window.
        await replicas_become(api, token, deployment_id, 1)
        scaled = await events_of(api, deployment_id, "work.scaled")
        ups = [e for e in scaled if e["to_replicas"] > e["from_replicas"]]
        downs = [e for e in scaled if e["to_replicas"] < e["from_replicas"]]
        assert ups
        assert downs
        assert ups[0]["metric"] == "requests_per_s"
        assert ups[0]["target"] == 4.0
        assert ups[0]["observed"] > 4.0 * 1.1
        assert downs[-1]["to_replicas"] == 1


async def test_a_tainted_node_receives_only_work_that_tolerates_its_taint(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    taints = {"orin-0": ("dedicated=risk:NoSchedule",)}
    async with fleet(database, mosquitto_root, edge_nodes=2, taints=taints) as running:
        api = running.api
        token = await api.tenant("acme")
        model = await api.model(token)
        record = running.api.app[REGISTRY].get("orin-0")
        assert record is not None
        assert [(t.key, t.value, t.effect) for t in record.status.taints] == [
            ("dedicated", "risk", "NoSchedule")
        ]
        both = {"replicas": 2, "max_replicas_per_node": 1, "model_id": model}
        general = await api.submitted(token, {"name": "general", **both}, collection="deployments")
        risk = await api.submitted(
            token,
            {"name": "risk", **both, "tolerations": [{"key": "dedicated", "value": "risk"}]},
            collection="deployments",
        )
        placed = await reaches(api, token, risk, "running", collection="deployments")
        assert sorted(placed["nodes"]) == ["orin-0", "orin-1"]

        async def refused_for_the_taint() -> bool:
            explained = await (await api.get(token, f"/v1/deployments/{general}/explain")).json()
            return "untolerated taint" in explained["message"]

        await eventually_async(refused_for_the_taint, timeout_s=20, message="no taint reason")
        assert (await work(api, token, general, "deployments"))["state"] == "pending"


async def test_draining_a_node_moves_its_replica_first_and_answers_every_request(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    async with fleet(database, mosquitto_root, edge_nodes=2, cloud_nodes=1) as running:
        api = running.api
        token = await api.tenant("acme")
        spec = {"name": "risk", "model_id": await api.model(token), "replicas": 1}
        deployment_id = await api.submitted(token, spec, collection="deployments")
        await replicas_become(api, token, deployment_id, 1)
        (old,) = (await work(api, token, deployment_id, "deployments"))["nodes"]
        trainer = await api.submitted(
            token,
            {"name": "ft", "command": ["python", "train.py"], "accelerators_per_worker": 4,
             "estimated_duration_s": 3600, "checkpoint_interval_s": 60},
        )  # fmt: skip
        await reaches(api, token, trainer, "running")

        headers = {"Authorization": f"Bearer {api.admin_token}"}
        async with load(api, token, deployment_id, per_s=20.0, refresh_every=1) as statuses:
            await eventually_async(lambda: asyncio.sleep(0, bool(statuses)), timeout_s=10)
            for node_id in (old, "a100-0"):
                drained = await api.client.post(f"/v1/nodes/{node_id}/drain", headers=headers)
                assert drained.status == 200, await drained.text()
                assert (await drained.json())["draining"] is True

            async def moved() -> bool:
                body = await work(api, token, deployment_id, "deployments")
                ready = [r for r in body["replica_states"] if r["state"] == "ready"]
                return body["nodes"] != [old] and old not in body["nodes"] and len(ready) == 1

            await eventually_async(moved, timeout_s=40, message="the replica did not move")
            answered = len(statuses)
            await eventually_async(
                lambda: asyncio.sleep(0, len(statuses) > answered + 10), timeout_s=10
            )
        assert set(statuses) == {200}, sorted(set(statuses))
        # The training job was requeued off its drained node, and has nowhere else to go.
        job = await work(api, token, trainer)
        assert job["state"] == "pending"
        assert job["attempts"] == 1


async def test_inference_takes_training_gpus_at_its_peak_and_gives_them_back(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    """Tidal sharing: a scaling deployment preempts p2 training that checkpoints, which
    resumes once the load has gone."""
    async with fleet(database, mosquitto_root, cloud_nodes=1) as running:
        api = running.api
        token = await api.tenant("acme")
        trainer = await api.submitted(
            token,
            {"name": "nightly", "command": ["python", "train.py"], "priority": "p2",
             "accelerators_per_worker": 3, "estimated_duration_s": 3600,
             "checkpoint_interval_s": 60},
        )  # fmt: skip
        await reaches(api, token, trainer, "running")
        spec = {
            "name": "risk",
            "model_id": await api.model(token),
            "sites": ["cloud"],
            "accepted_kinds": ["gpu"],
            "max_replicas_per_node": 2,
            "replicas": 1,
            "autoscale": {
                "min_replicas": 1,
                "max_replicas": 2,
                "target_requests_per_s": 4.0,
                "scale_down_stabilization_s": 2.0,
            },
        }
        deployment_id = await api.submitted(token, spec, collection="deployments")
        await replicas_become(api, token, deployment_id, 1)

        async with load(api, token, deployment_id, per_s=30.0):
            await replicas_become(api, token, deployment_id, 2)
            job = await work(api, token, trainer)
            assert job["state"] == "pending"  # preempted for the peak, requeued
        resumed = await reaches(api, token, trainer, "running", timeout_s=40)
        assert resumed["attempts"] == 2
        assert (await work(api, token, deployment_id, "deployments"))["replicas"] == 1


async def test_greenfed_load_drives_the_endpoints_and_the_deployment_scales(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    async with fleet(database, mosquitto_root, edge_nodes=3) as running:
        api = running.api
        token = await api.tenant("acme")
        spec = {
            "name": "risk",
            "model_id": await api.model(token),
            "autoscale": {"min_replicas": 1, "max_replicas": 3, "target_requests_per_s": 5.0},
        }
        deployment_id = await api.submitted(token, spec, collection="deployments")
        await replicas_become(api, token, deployment_id, 1)
        base = api.app[SETTINGS].cloud.public_url
        assert base is not None
        code, printed, errors = await run_greenfed(
            ["load", "--deployment", deployment_id, "--qps", "ramp:10-40", "--duration", "8",
             "--api", base, "--token", token],
            timeout_s=60,
        )  # fmt: skip
        assert code == 0, errors
        lines = printed.splitlines()
        assert len(lines) == 9  # a line a second, then the totals
        sent, ok = (int(n) for n in re.findall(r"sent (\d+), ok (\d+)", lines[-1])[0])
        assert sent == ok > 100
        assert "failed 0" in lines[-1]
        assert "replicas 3" in printed  # it grew while the load rose
