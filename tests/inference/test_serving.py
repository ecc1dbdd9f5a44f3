"""Edge inference end to end on the real Mosquitto: upload a model, deploy it, the
agents download it, load it in ONNX Runtime and serve it over HTTP; outputs are
checked against numpy. Updates under load, corrupt files, bad inputs, full queues.
"""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from cloud.app_keys import REGISTRY
from edge.inference.options import InferenceOptions
from tests.api.support import Api, bearer
from tests.store.databases import DatabaseUnderTest
from tests.support.control_plane import fleet, reaches, work
from tests.support.onnx_models import mlp, mlp_reference
from tests.support.waiting import eventually, eventually_async

pytestmark = pytest.mark.timeout(120)

X = np.array([[1.0, -2.0, 0.5, 3.0], [0.0, 1.0, 1.0, -1.0], [2.0, 2.0, -3.0, 0.25]], np.float32)


async def deploy(api: Api, token: str, model_id: str, **fields: Any) -> str:
    spec = {"name": "mlp", "model_id": model_id, "replicas": 1, **fields}
    return await api.submitted(token, spec, collection="deployments")


async def ready_endpoints(api: Api, token: str, deployment_id: str) -> list[str]:
    await reaches(api, token, deployment_id, "running", collection="deployments")
    states = (await work(api, token, deployment_id, "deployments"))["replica_states"]
    assert all(state["state"] == "ready" for state in states), states
    return [state["endpoint"] for state in states]


async def test_a_deployment_on_two_edge_nodes_serves_the_models_output(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    async with fleet(database, mosquitto_root, edge_nodes=2) as running:
        api = running.api
        token = await api.tenant("vision")
        model_id = await api.model(token)
        batching = {"max_batch_size": 8, "max_wait_ms": 2}
        deployment_id = await deploy(api, token, model_id, replicas=2, batching=batching)
        endpoints = await ready_endpoints(api, token, deployment_id)
        assert len(endpoints) == 2
        replicas = (await work(api, token, deployment_id, "deployments"))["replica_states"]
        assert {r["node_id"] for r in replicas} == {"orin-0", "orin-1"}
        # The simulated Jetson offers TensorRT and CUDA; this ONNX Runtime build has only
        # the CPU: the agent says so instead of pretending.
        assert {r["provider"] for r in replicas} == {"CPUExecutionProvider"}
        assert all("TensorrtExecutionProvider is not available" in r["reason"] for r in replicas), (
            replicas
        )

        async with aiohttp.ClientSession() as http:
            for endpoint in endpoints:
                async with http.post(endpoint, json={"inputs": {"x": X.tolist()}}) as answer:
                    assert answer.status == 200, await answer.text()
                    body = await answer.json()
                np.testing.assert_allclose(body["outputs"]["y"], mlp_reference(X), rtol=1e-5)

            buffer = io.BytesIO()
            np.save(buffer, X)
            npy = {"Content-Type": "application/x-npy", "Accept": "application/x-npy"}
            async with http.post(endpoints[0], data=buffer.getvalue(), headers=npy) as answer:
                assert answer.status == 200, await answer.text()
                y = np.load(io.BytesIO(await answer.read()))
            np.testing.assert_allclose(y, mlp_reference(X), rtol=1e-5)

            for bad, words in (
                (
                    {"inputs": {"x": [[1.0, 2.0, 3.0]]}},
                    "shape [1, 3], the model takes x: float32[?, 4]",
                ),
                ({"inputs": {"image": X.tolist()}}, "missing ['x'] and unknown ['image']"),
                ({"x": X.tolist()}, 'the body must be {"inputs"'),
            ):
                async with http.post(endpoints[0], json=bad) as answer:
                    assert answer.status == 400
                    assert words in (await answer.json())["detail"]
            base = endpoints[0].rsplit("/v1/infer/", 1)[0]
            async with http.post(f"{base}/v1/infer/nope", json={"inputs": {}}) as answer:
                assert answer.status == 404
            async with http.get(f"{base}/metrics") as answer:
                metrics = await answer.text()
        assert f'greenfed_inference_requests_total{{deployment="{deployment_id}"}}' in metrics

        def sampled() -> bool:
            record = api.app[REGISTRY].get("orin-0")
            telemetry = record.telemetry if record else None
            return bool(telemetry and any(s.requests for s in telemetry.deployments))

        # Serving figures reach the cloud in telemetry, and the tenant sees them.
        await eventually(sampled, timeout_s=10, message="no serving figures in telemetry")
        shown: list[dict[str, Any]] = []

        async def every_replica_has_figures() -> bool:
            shown[:] = (await work(api, token, deployment_id, "deployments"))["replica_states"]
            return all(r["serving"] is not None for r in shown)

        await eventually_async(every_replica_has_figures, timeout_s=10, message=lambda: str(shown))
        assert {"requests_per_s", "latency_p99_ms", "mean_batch_size"} <= set(shown[0]["serving"])


async def test_updating_the_model_under_load_fails_no_request(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    async with fleet(database, mosquitto_root, edge_nodes=1) as running:
        api = running.api
        token = await api.tenant("vision")
        first = await api.model(token, mlp(seed=7), name="v1")
        second = await api.model(token, mlp(seed=8), name="v2")
        batching = {"max_batch_size": 4, "max_wait_ms": 1}
        deployment_id = await deploy(api, token, first, batching=batching)
        (endpoint,) = await ready_endpoints(api, token, deployment_id)
        v2_sha = (await (await api.get(token, f"/v1/models/{second}")).json())["sha256"]
        answers: list[tuple[int, str | None]] = []
        stop = asyncio.Event()

        async def client(http: aiohttp.ClientSession) -> None:
            while not stop.is_set():
                async with http.post(endpoint, json={"inputs": {"x": X.tolist()}}) as answer:
                    body = await answer.json()
                    sha = body.get("model_sha256") if answer.status == 200 else None
                    answers.append((answer.status, sha))
                    if sha is not None:
                        seed = 8 if sha == v2_sha else 7
                        expected = mlp_reference(X, seed=seed)
                        np.testing.assert_allclose(body["outputs"]["y"], expected, rtol=1e-5)

        # The clients belong to a task group: whatever fails, they are stopped and awaited.
        async with aiohttp.ClientSession() as http, asyncio.TaskGroup() as clients:
            for _ in range(4):
                clients.create_task(client(http))
            await eventually(lambda: len(answers) >= 20, timeout_s=30)
            patched = await api.client.patch(
                f"/v1/deployments/{deployment_id}",
                json={"model_id": second},
                headers=bearer(token),
            )
            assert patched.status == 200, await patched.text()
            await eventually(
                lambda: sum(1 for _, sha in answers if sha == v2_sha) >= 20,
                timeout_s=60,
                message="the new model never answered",
            )
            stop.set()
        assert [status for status, _ in answers if status != 200] == []
        assert {sha for _, sha in answers} >= {v2_sha}
        assert running.agents["orin-0"].inference is not None
        assert running.agents["orin-0"].inference.swaps == 1


async def test_a_corrupt_model_file_fails_its_deployment_and_no_other(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    async with fleet(database, mosquitto_root, edge_nodes=1) as running:
        api = running.api
        token = await api.tenant("vision")
        good = await deploy(api, token, await api.model(token, mlp(seed=7), name="good"))
        (endpoint,) = await ready_endpoints(api, token, good)
        corrupt = await api.model(token, mlp(seed=9), name="corrupt")
        described = await (await api.get(token, f"/v1/models/{corrupt}")).json()
        sha = described["sha256"]
        stored = corrupt_file(api, sha)
        assert stored.is_file()

        bad = await deploy(api, token, corrupt)
        failed = await reaches(api, token, bad, "failed", collection="deployments")
        assert "checksum mismatch" in failed["reason"]
        async with (
            aiohttp.ClientSession() as http,
            http.post(endpoint, json={"inputs": {"x": X.tolist()}}) as answer,
        ):
            assert answer.status == 200  # the other deployment never noticed
        assert (await work(api, token, good, "deployments"))["state"] == "running"


def corrupt_file(api: Api, sha256: str) -> Path:
    """Flip bytes of the control plane's stored copy: what the agent downloads no longer
    has the sha256 the registry recorded."""
    path = api.database.settings.resolved_data_dir() / "models" / "sha256" / sha256[:2]
    stored = path / f"{sha256}.onnx"
    data = bytearray(stored.read_bytes())
    data[-8:] = bytes(b ^ 0xFF for b in data[-8:])
    stored.write_bytes(bytes(data))
    return stored


async def test_a_full_queue_answers_429_with_retry_after(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    options = InferenceOptions(max_queue=2)
    async with fleet(database, mosquitto_root, edge_nodes=1, inference=options) as running:
        api = running.api
        token = await api.tenant("vision")
        deployment_id = await deploy(api, token, await api.model(token))
        (endpoint,) = await ready_endpoints(api, token, deployment_id)
        big = np.tile(X, (200, 1))  # one request of 600 rows: longer runs, a queue forms

        async def one(http: aiohttp.ClientSession) -> tuple[int, str | None]:
            async with http.post(endpoint, json={"inputs": {"x": big.tolist()}}) as answer:
                await answer.read()
                return answer.status, answer.headers.get("Retry-After")

        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as http:
            results = await asyncio.gather(*(one(http) for _ in range(64)))
        statuses = [status for status, _ in results]
        assert set(statuses) <= {200, 429}
        assert statuses.count(429) > 0
        assert statuses.count(200) > 0
        assert all(retry == "1" for status, retry in results if status == 429)


async def test_a_cpu_only_device_serves_several_models_side_by_side(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    """A Raspberry Pi's CPU is four cores: two CPU deployments fit on it at once."""
    async with fleet(
        database, mosquitto_root, edge_nodes=1, edge_profile="raspberry-pi-5"
    ) as running:
        api = running.api
        token = await api.tenant("vision")
        first = await deploy(api, token, await api.model(token, mlp(seed=7), name="a"))
        second = await deploy(api, token, await api.model(token, mlp(seed=8), name="b"))
        for deployment_id, seed in ((first, 7), (second, 8)):
            (endpoint,) = await ready_endpoints(api, token, deployment_id)
            async with (
                aiohttp.ClientSession() as http,
                http.post(endpoint, json={"inputs": {"x": X.tolist()}}) as answer,
            ):
                assert answer.status == 200, await answer.text()
                outputs = (await answer.json())["outputs"]["y"]
            np.testing.assert_allclose(outputs, mlp_reference(X, seed=seed), rtol=1e-5)
        placed = (await work(api, token, first, "deployments"))["allocations"]
        assert placed[0]["accelerator_kind"] == "cpu"
        assert placed[0]["accelerator_ids"] == []  # cores are counted, not pinned
