"""Several replicas of one deployment on one node (`max_replicas_per_node` above 1, or a
canary rollout's replica with the new model beside one with the current model): each
is loaded with its own model on its own accelerators and reported with its own state
and model, a replica moved to another accelerator is loaded there again, and the
node's one endpoint for the deployment hands requests to its replicas in turn.

Real runtime, real model downloads from a local HTTP server, real ONNX Runtime
sessions; only the CUDA build is simulated (this machine has no GPU): its sessions run
on the CPU and remember the device they were asked for."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from edge.inference.batching import Batcher, QueueFull
from edge.inference.model_fetch import ModelCache
from edge.inference.runtime import InferenceRuntime, ServedDeployment, ServedReplica
from edge.inference.server import inference_app
from edge.inference.session import LoadedModel
from edge.inference.stats import ServingStats
from shared.messages import Accelerator, DesiredDeployment
from tests.support.onnx_models import mlp, mlp_reference
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(30)

CUDA = "CUDAExecutionProvider"
GPUS = tuple(
    Accelerator(
        id=f"gpu{index}",
        kind="gpu",
        vendor="nvidia",
        model="simulated",
        memory_bytes=8 << 30,
        compute_units=16,
        index=index,
        onnx_providers=(CUDA, "CPUExecutionProvider"),
    )
    for index in range(2)
)
X = np.arange(8, dtype=np.float32).reshape(2, 4) / 10.0
CURRENT_SEED, CANARY_SEED = 1, 2  # the deployment's model, and a rollout's new one


def sha256(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


class CudaBuild:
    """ONNX Runtime's CUDA build at the seam of the GPUs this machine lacks: each session
    runs on the CPU provider, says it is CUDA on the device it was asked for, and is
    recorded as (model sha256, device_id)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import onnxruntime as ort

        self.sessions: list[tuple[str, int]] = []
        real = ort.InferenceSession
        sessions = self.sessions

        class Session:
            def __init__(self, path: str, options: object, providers: list[object]) -> None:
                asked = providers[0]
                assert isinstance(asked, tuple), providers
                assert asked[0] == CUDA, providers
                self._device_id = int(asked[1]["device_id"])
                self._real = real(path, options, providers=["CPUExecutionProvider"])
                sessions.append((Path(path).stem, self._device_id))

            def get_providers(self) -> list[str]:
                return [CUDA, "CPUExecutionProvider"]

            def get_provider_options(self) -> dict[str, dict[str, str]]:
                return {CUDA: {"device_id": str(self._device_id)}}

            def __getattr__(self, name: str) -> object:
                return getattr(self._real, name)

        monkeypatch.setattr(ort, "InferenceSession", Session)
        monkeypatch.setattr(ort, "get_available_providers", lambda: [CUDA, "CPUExecutionProvider"])


@asynccontextmanager
async def model_registry(*bodies: bytes) -> AsyncIterator[str]:
    """The control plane's model blobs, by sha256, under the URL yielded."""
    by_sha256 = {sha256(body): body for body in bodies}

    async def blob(request: web.Request) -> web.Response:
        return web.Response(body=by_sha256[request.match_info["sha256"]])

    app = web.Application()
    app.router.add_get("/models/{sha256}", blob)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/models"
    finally:
        await runner.cleanup()


@asynccontextmanager
async def node_runtime(tmp_path: Path) -> AsyncIterator[InferenceRuntime]:
    """The agent's runtime on a node with GPUS, its tasks in a task group of its own."""
    async with asyncio.TaskGroup() as tasks:
        runtime = InferenceRuntime(
            GPUS,
            ModelCache(tmp_path / "cache", max_bytes=10**7),
            on_change=lambda: None,
            endpoint_base=lambda: "http://node:8000",
        )
        runtime.bind(tasks)
        try:
            yield runtime
        finally:
            await runtime.close()


def replica(number: int, registry: str, model: bytes, gpu: str) -> DesiredDeployment:
    """Replica `number` of deployment d1 as cloud/loop/desired.py sends it."""
    return DesiredDeployment(
        deployment_id="d1",
        replica=number,
        model_id=sha256(model)[:8],
        model_url=f"{registry}/{sha256(model)}",
        model_sha256=sha256(model),
        accelerator_kind="gpu",
        accelerators=1,
        accelerator_ids=(gpu,),
        max_batch_size=4,
    )


def reported(runtime: InferenceRuntime) -> list[tuple[int, str, str | None]]:
    return [(r.replica, r.state, r.model_sha256) for r in runtime.reported()]


async def test_each_replica_on_a_node_serves_its_own_model_on_its_own_accelerator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    build = CudaBuild(monkeypatch)
    current, canary = mlp(seed=CURRENT_SEED), mlp(seed=CANARY_SEED)
    async with model_registry(current, canary) as registry, node_runtime(tmp_path) as runtime:
        runtime.apply([replica(0, registry, canary, "gpu0"), replica(1, registry, current, "gpu1")])
        wanted = [(0, "ready", sha256(canary)), (1, "ready", sha256(current))]
        await eventually(
            lambda: reported(runtime) == wanted, message=lambda: str(reported(runtime))
        )
        assert sorted(build.sessions) == sorted([(sha256(canary), 0), (sha256(current), 1)])
        for state in runtime.reported():
            assert (state.provider, state.reason) == (CUDA, "")
            assert state.endpoint == "http://node:8000/v1/infer/d1"


async def test_a_replica_that_cannot_load_fails_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    CudaBuild(monkeypatch)
    model = mlp(seed=CURRENT_SEED)
    async with model_registry(model) as registry, node_runtime(tmp_path) as runtime:
        runtime.apply([replica(0, registry, model, "gpu0"), replica(1, registry, model, "gpu7")])
        await eventually(lambda: {r.state for r in runtime.reported()} == {"ready", "failed"})
        ready, failed = runtime.reported()
        assert (ready.replica, ready.state, ready.model_sha256) == (0, "ready", sha256(model))
        assert (failed.replica, failed.state, failed.endpoint) == (1, "failed", None)
        assert failed.reason == "accelerator gpu7 is not on this node"


async def test_a_replica_moved_to_another_accelerator_is_loaded_there_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    build = CudaBuild(monkeypatch)
    model = mlp(seed=CURRENT_SEED)
    async with model_registry(model) as registry, node_runtime(tmp_path) as runtime:
        runtime.apply([replica(0, registry, model, "gpu0")])
        await eventually(lambda: reported(runtime) == [(0, "ready", sha256(model))])
        runtime.apply([replica(0, registry, model, "gpu1")])  # same model, other GPU
        await eventually(lambda: runtime.swaps == 1, message=lambda: str(build.sessions))
        assert build.sessions == [(sha256(model), 0), (sha256(model), 1)]
        assert reported(runtime) == [(0, "ready", sha256(model))]


async def test_the_nodes_endpoint_hands_requests_to_its_replicas_in_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A canary beside the current model: each takes every other request, and each answer
    is its own model's; once the canary is withdrawn the current model takes them all."""
    CudaBuild(monkeypatch)
    current, canary = mlp(seed=CURRENT_SEED), mlp(seed=CANARY_SEED)
    seeds = {sha256(current): CURRENT_SEED, sha256(canary): CANARY_SEED}
    async with (
        model_registry(current, canary) as registry,
        node_runtime(tmp_path) as runtime,
        TestClient(TestServer(inference_app(runtime))) as client,
    ):
        runtime.apply([replica(0, registry, canary, "gpu0"), replica(1, registry, current, "gpu1")])
        await eventually(lambda: [r.state for r in runtime.reported()] == ["ready", "ready"])

        async def answered_by() -> str:
            answer = await client.post("/v1/infer/d1", json={"inputs": {"x": X.tolist()}})
            assert answer.status == 200, await answer.text()
            body = await answer.json()
            model_sha256: str = body["model_sha256"]
            expected = mlp_reference(X, seed=seeds[model_sha256])
            np.testing.assert_allclose(body["outputs"]["y"], expected, rtol=1e-6)
            return model_sha256

        answers = [await answered_by() for _ in range(6)]
        assert answers == [sha256(canary), sha256(current)] * 3

        runtime.apply([replica(1, registry, current, "gpu1")])  # the canary rolled back
        assert reported(runtime) == [(1, "ready", sha256(current))]
        assert [await answered_by() for _ in range(3)] == [sha256(current)] * 3
        # One deployment's figures on this node, whichever replica answered.
        assert [s.requests_total for s in runtime.stats()] == [9]


def replica_requests(runtime: InferenceRuntime) -> list[tuple[str, int, list[tuple[int, int]]]]:
    """Each deployment's telemetry sample: its requests, and each replica's."""
    return [
        (s.deployment_id, s.requests, [(r.replica, r.requests) for r in s.replicas])
        for s in runtime.samples()
    ]


async def test_telemetry_samples_each_replica_on_a_node_within_its_deployment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A canary beside the current model on one node: the control plane judges the
    canary on its own figures, so each replica's come within the deployment's, and the
    deployment's count each request once."""
    CudaBuild(monkeypatch)
    current, canary = mlp(seed=CURRENT_SEED), mlp(seed=CANARY_SEED)
    async with (
        model_registry(current, canary) as registry,
        node_runtime(tmp_path) as runtime,
        TestClient(TestServer(inference_app(runtime))) as client,
    ):
        runtime.apply([replica(0, registry, canary, "gpu0"), replica(1, registry, current, "gpu1")])
        await eventually(lambda: [r.state for r in runtime.reported()] == ["ready", "ready"])
        runtime.samples()  # the window starts now

        async def infer() -> None:
            answer = await client.post("/v1/infer/d1", json={"inputs": {"x": X.tolist()}})
            assert answer.status == 200, await answer.text()

        for _ in range(6):
            await infer()
        (sample,) = runtime.samples()
        assert (sample.requests, [(r.replica, r.requests) for r in sample.replicas]) == (
            6,
            [(0, 3), (1, 3)],
        )
        for figures in sample.replicas:
            assert figures.latency_p95_ms is not None
            assert figures.mean_batch_size == 1.0

        runtime.apply([replica(1, registry, current, "gpu1")])  # the canary rolled back
        for _ in range(3):
            await infer()
        assert replica_requests(runtime) == [("d1", 3, [(1, 3)])]
        # The agent's /metrics counts on per deployment, the withdrawn replica's too.
        assert [s.requests_total for s in runtime.stats()] == [9]


def test_a_replicas_figures_are_its_own_and_count_in_its_deployments() -> None:
    deployment = ServingStats("d1")
    canary, current = (ServingStats("d1", counts_in=deployment) for _ in range(2))
    for _ in range(10):
        canary.observe(0.040)
        current.observe(0.002)
    canary.error()
    current.rejected()
    canary_sample, current_sample = canary.replica_sample(0), current.replica_sample(1)
    assert (canary_sample.replica, canary_sample.requests, canary_sample.errors) == (0, 11, 1)
    assert canary_sample.latency_p95_ms == pytest.approx(40.0)
    assert (current_sample.replica, current_sample.requests, current_sample.rejected) == (1, 10, 1)
    assert current_sample.latency_p95_ms == pytest.approx(2.0)
    together = deployment.sample(replicas=(canary_sample, current_sample))
    assert (together.requests, together.errors, together.rejected) == (21, 1, 1)
    assert together.replicas == (canary_sample, current_sample)


async def test_a_full_replica_is_passed_over_while_another_has_room(tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"
    path.write_bytes(mlp())
    model = LoadedModel(path, sha256(mlp()), None)
    stats = ServingStats("d1")
    # Batchers not running: what is queued stays queued.
    batchers = [Batcher(model, stats, max_queue=1) for _ in range(2)]
    deployment = ServedDeployment(
        stats,
        {n: ServedReplica(DesiredDeployment(deployment_id="d1"), stats) for n in range(2)},
    )
    for served, batcher in zip(deployment.replicas.values(), batchers, strict=True):
        served.batcher = batcher
    waiting = asyncio.create_task(batchers[0].infer({"x": X}, 2))
    await asyncio.sleep(0)  # queued: replica 0 is full
    try:
        assert [deployment.next_batcher() for _ in range(3)] == [batchers[1]] * 3
        also_waiting = asyncio.create_task(batchers[1].infer({"x": X}, 2))
        await asyncio.sleep(0)  # both full: the one whose turn it is refuses (429)
        full = deployment.next_batcher()
        assert full is batchers[1]
        with pytest.raises(QueueFull):
            await full.infer({"x": X}, 2)
        also_waiting.cancel()
    finally:
        waiting.cancel()
