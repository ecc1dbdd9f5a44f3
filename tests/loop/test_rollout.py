"""Canary model rollouts, live on the real Mosquitto: a model that fails is rolled back
with every request to the other replicas answered; a healthy one is promoted."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import msgspec
import pytest

from cloud.app_keys import REGISTRY, SCHEDULER, SETTINGS
from tests.store.databases import DatabaseUnderTest
from tests.support.control_plane import FAST_LOOP, fleet, work
from tests.support.onnx_models import failing_at_run, mlp
from tests.support.processes import run_greenfed
from tests.support.waiting import eventually, eventually_async

pytestmark = pytest.mark.timeout(120)

X = [[1.0, -2.0, 0.5, 3.0]]


async def rollout_events(api: Any, deployment_id: str) -> list[dict[str, Any]]:
    records = await api.store.list_events(tenant_id=None, limit=1000)
    return [
        msgspec.json.decode(e.payload)
        for e in records
        if e.kind == "work.rollout" and e.work_id == deployment_id
    ]


async def serving(api: Any, token: str, deployment_id: str, count: int) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    async def ready() -> bool:
        seen.update(await work(api, token, deployment_id, "deployments"))
        return [r["state"] for r in seen["replica_states"]] == ["ready"] * count

    await eventually_async(ready, timeout_s=40, message=lambda: str(seen.get("replica_states")))
    return seen


@contextlib.asynccontextmanager
async def traffic(endpoints: dict[int, str], per_s: float) -> AsyncIterator[dict[int, list[int]]]:
    """`per_s` requests a second in all, shared by the replicas, each replica driven on
    its own (a request a canary holds up delays no other replica's); statuses by
    replica (0: no answer)."""
    statuses: dict[int, list[int]] = {replica: [] for replica in endpoints}

    async def drive(http: aiohttp.ClientSession, replica: int) -> None:
        while True:
            try:
                async with http.post(endpoints[replica], json={"inputs": {"x": X}}) as answer:
                    statuses[replica].append(answer.status)
            except aiohttp.ClientError:
                statuses[replica].append(0)
            await asyncio.sleep(len(endpoints) / per_s)

    async with aiohttp.ClientSession() as http:
        tasks = [asyncio.create_task(drive(http, replica)) for replica in endpoints]
        try:
            yield statuses
            await eventually(lambda: all(statuses.values()), message=lambda: f"answers: {statuses}")
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task


async def test_a_canary_that_fails_is_rolled_back_and_the_other_replicas_answer_everything(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    async with fleet(database, mosquitto_root, edge_nodes=3) as running:
        api = running.api
        token = await api.tenant("acme")
        good = await api.model(token)
        bad = await api.model(token, failing_at_run(), name="failing")
        spec = {"name": "risk", "model_id": good, "replicas": 3}
        deployment_id = await api.submitted(token, spec, collection="deployments")
        body = await serving(api, token, deployment_id, 3)
        endpoints = {r["replica"]: r["endpoint"] for r in body["replica_states"]}
        headers = {"Authorization": f"Bearer {token}"}

        one = await api.client.patch(
            f"/v1/deployments/{deployment_id}",
            json={"model_id": bad, "rollout": {"canary_replicas": 3}},
            headers=headers,
        )
        assert one.status == 422  # at least one replica keeps the model
        async with traffic(endpoints, per_s=30.0) as statuses:
            started = await api.client.patch(
                f"/v1/deployments/{deployment_id}",
                json={
                    "model_id": bad,
                    "rollout": {"canary_replicas": 1, "hold_s": 60, "min_requests": 5},
                },
                headers=headers,
            )
            assert started.status == 200, await started.text()
            assert (await started.json())["spec"]["canary"]["model_id"] == bad

            async def rolled_back() -> bool:
                return any(
                    e["outcome"] == "rolled-back" for e in await rollout_events(api, deployment_id)
                )

            await eventually_async(rolled_back, timeout_s=40, message="no rollback")
            after = await serving(api, token, deployment_id, 3)
            # The others were asked throughout (each on its own: the canary holds none up).
            await eventually(
                lambda: bool(statuses[1] and statuses[2]), message=lambda: f"answers: {statuses}"
            )
        assert after["spec"]["model_id"] == good
        assert after["spec"]["canary"] is None
        (event,) = [
            e for e in await rollout_events(api, deployment_id) if e["outcome"] == "rolled-back"
        ]
        assert event["model_id"] == bad
        assert "canary" in event["reason"]
        base = api.app[SETTINGS].cloud.public_url
        assert base is not None
        code, _, errors = await run_greenfed(
            ["rollout", "abort", deployment_id, "--api", base, "--token", token]
        )
        assert code == 1
        assert "has no rollout" in errors
        # Replica 0 was the canary; the others answered every request.
        for replica in (1, 2):
            assert statuses[replica]
            assert set(statuses[replica]) == {200}, (replica, sorted(set(statuses[replica])))


async def test_a_healthy_canary_is_promoted_to_every_replica_after_its_hold(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    async with fleet(database, mosquitto_root, edge_nodes=2) as running:
        api = running.api
        token = await api.tenant("acme")
        first = await api.model(token)
        second = await api.model(token, mlp(seed=11), name="mlp-v2")
        spec = {"name": "risk", "model_id": first, "replicas": 2}
        deployment_id = await api.submitted(token, spec, collection="deployments")
        body = await serving(api, token, deployment_id, 2)
        endpoints = {r["replica"]: r["endpoint"] for r in body["replica_states"]}
        headers = {"Authorization": f"Bearer {token}"}
        async with traffic(endpoints, per_s=20.0) as statuses:
            started = await api.client.patch(
                f"/v1/deployments/{deployment_id}",
                json={"model_id": second, "rollout": {"canary_share": 0.5, "hold_s": 1.0}},
                headers=headers,
            )
            assert started.status == 200, await started.text()

            seen: list[dict[str, Any]] = []

            async def promoted() -> bool:
                seen[:] = await rollout_events(api, deployment_id)
                return any(e["outcome"] == "promoted" for e in seen)

            # A rollback ends the rollout too: say so, not only that time ran out.
            await eventually_async(
                promoted, timeout_s=40, message=lambda: f"not promoted; events: {seen}"
            )
            model = await (await api.get(token, f"/v1/models/{second}")).json()

            async def all_on_the_new_model() -> bool:
                after = await serving(api, token, deployment_id, 2)
                shas = {r["model_sha256"] for r in after["replica_states"]}
                return bool(shas == {model["sha256"]})

            # The other replica swaps too, without a failed request.
            await eventually_async(all_on_the_new_model, timeout_s=30, message="not swapped")
        after = await work(api, token, deployment_id, "deployments")
        assert after["spec"]["model_id"] == second
        assert after["spec"]["canary"] is None
        assert all(set(s) == {200} for s in statuses.values())
        # Nothing left to decide by hand.
        late = await api.client.post(
            f"/v1/deployments/{deployment_id}/rollout/promote", headers=headers
        )
        assert late.status == 409


async def test_a_canary_whose_node_went_offline_is_not_promoted(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    # The canary's agent stops right after the swap (say, the new model crashed it). The
    # registry keeps the node's last report and sample; within the node-lost grace its
    # replica stays placed, and the rollout must not be promoted on those figures.
    hold_s = 8.0
    scheduling = msgspec.structs.replace(FAST_LOOP, node_lost_grace_s=120.0)
    async with fleet(database, mosquitto_root, edge_nodes=2, scheduling=scheduling) as running:
        api = running.api
        token = await api.tenant("acme")
        first = await api.model(token)
        second = await api.model(token, mlp(seed=11), name="mlp-v2")
        new_sha = (await (await api.get(token, f"/v1/models/{second}")).json())["sha256"]
        spec = {"name": "risk", "model_id": first, "replicas": 2}
        deployment_id = await api.submitted(token, spec, collection="deployments")
        await serving(api, token, deployment_id, 2)
        started = await api.client.patch(
            f"/v1/deployments/{deployment_id}",
            json={"model_id": second, "rollout": {"canary_replicas": 1, "hold_s": hold_s}},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert started.status == 200, await started.text()
        body: dict[str, Any] = {}

        async def swapped() -> bool:
            body.update(await work(api, token, deployment_id, "deployments"))
            return any(r.get("model_sha256") == new_sha for r in body["replica_states"])

        await eventually_async(swapped, timeout_s=40, message=lambda: str(body))
        canary = next(r for r in body["replica_states"] if r.get("model_sha256") == new_sha)
        record = api.app[REGISTRY].get(canary["node_id"])
        assert record is not None

        def sampled_on_the_new_model() -> bool:
            # A sample taken wholly after the swap: the rollout's hold has started.
            telemetry, reported = record.telemetry, record.reported
            return (
                telemetry is not None
                and reported is not None
                and telemetry.sampled_at - telemetry.interval_s >= reported.reported_at
                and record.serving_sample(deployment_id) is not None
            )

        await eventually(sampled_on_the_new_model, timeout_s=20, message="no sample since")
        await running.stop_agent(canary["node_id"])
        stopped_at = time.monotonic()

        async def offline() -> bool:
            node = await (await api.get(api.admin_token, f"/v1/nodes/{canary['node_id']}")).json()
            return bool(node["state"] == "offline")

        await eventually_async(offline, timeout_s=20, message="the canary's node stays online")
        # Pass after pass, for longer than the hold: no verdict, the rollout waits.
        loop = api.app[SCHEDULER]
        while time.monotonic() - stopped_at < hold_s + 4.0:
            loop.wake()
            async with asyncio.timeout(10):
                await loop.wait_for_pass()
            outcomes = {event["outcome"] for event in await rollout_events(api, deployment_id)}
            assert outcomes <= {"started"}, outcomes
        after = await work(api, token, deployment_id, "deployments")
        assert after["spec"]["canary"] is not None
        assert after["spec"]["model_id"] == first
