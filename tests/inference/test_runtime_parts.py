"""The agent's serving parts on their own: the ONNX Runtime session and its input
checks, dynamic batching (batch forming, swaps, draining, full queues), and the model
cache (resumed downloads, checksums, LRU eviction) against a real local HTTP server."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import numpy as np
import pytest
from aiohttp import web

from edge.inference import model_fetch
from edge.inference.batching import Batcher, QueueFull, Unavailable
from edge.inference.model_fetch import ModelCache, ModelFetchError
from edge.inference.server import read_npy, write_npy
from edge.inference.session import (
    OPENVINO,
    LoadedModel,
    ModelLoadError,
    check_feeds,
    provider_options,
)
from edge.inference.stats import ServingStats, render_prometheus
from shared.file_digests import file_sha256
from tests.support.onnx_models import mlp, mlp_reference

pytestmark = pytest.mark.timeout(30)

X = np.arange(12, dtype=np.float32).reshape(3, 4) / 10.0


def loaded(tmp_path: Path, body: bytes, name: str = "m.onnx") -> LoadedModel:
    path = tmp_path / name
    path.write_bytes(body)
    return LoadedModel(path, hashlib.sha256(body).hexdigest(), "CUDAExecutionProvider")


# ---- the session -----------------------------------------------------------------------


def test_a_session_reports_the_provider_that_really_runs_and_checks_inputs(
    tmp_path: Path,
) -> None:
    model = loaded(tmp_path, mlp())
    assert model.provider == "CPUExecutionProvider"  # no CUDA in this build
    assert "CUDAExecutionProvider is not available" in model.fallback
    assert model.batchable
    model.warm_up()
    np.testing.assert_allclose(model.run({"x": X})[0], mlp_reference(X), rtol=1e-6)
    assert check_feeds(model, {"x": X}) == 3
    with pytest.raises(ValueError, match=r"x: shape \[3, 5\], the model takes x: float32\[\?, 4\]"):
        check_feeds(model, {"x": np.zeros((3, 5), np.float32)})
    with pytest.raises(ValueError, match="dtype float64, the model takes float32"):
        check_feeds(model, {"x": X.astype(np.float64)})
    fixed = loaded(tmp_path, mlp(dynamic_batch=False), "fixed.onnx")
    assert not fixed.batchable
    with pytest.raises(ModelLoadError, match="ONNX Runtime cannot load the model"):
        loaded(tmp_path, b"\x08\x01garbage", "bad.onnx")


def test_each_provider_is_told_which_accelerator_to_run_on() -> None:
    assert provider_options(OPENVINO, "npu", None) == {"device_type": "NPU"}
    assert provider_options(OPENVINO, "gpu", 1) == {"device_type": "GPU.1"}
    assert provider_options(OPENVINO, "cpu", None) == {"device_type": "CPU"}
    assert provider_options("QNNExecutionProvider", "npu", 0) == {"backend_path": "libQnnHtp.so"}
    assert provider_options("CUDAExecutionProvider", "gpu", 2) == {"device_id": 2}
    assert provider_options("CoreMLExecutionProvider", "npu", None) == {}


class OpenVinoBuild:
    """ONNX Runtime as its OpenVINO build behaves, at the seam of hardware this machine
    lacks: the session really runs on the CPU provider, and says it is OpenVINO on the
    device it was given (`runs_on`), or fails to start when that device is missing."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, runs_on: str | None) -> None:
        import onnxruntime as ort

        self.asked: list[object] = []
        real = ort.InferenceSession
        runs = runs_on

        class Session:
            def __init__(self, path: str, options: object, providers: list[object]) -> None:
                first = providers[0]
                self._openvino = isinstance(first, tuple) and first[0] == OPENVINO
                if self._openvino and runs is None:
                    raise RuntimeError("[OpenVINO-EP] No NPU device found")
                self._real = real(path, options, providers=["CPUExecutionProvider"])

            def get_providers(self) -> list[str]:
                return (
                    [OPENVINO, "CPUExecutionProvider"]
                    if self._openvino
                    else ["CPUExecutionProvider"]
                )

            def get_provider_options(self) -> dict[str, dict[str, str]]:
                return {OPENVINO: {"device_type": runs or ""}} if self._openvino else {}

            def __getattr__(self, name: str) -> object:
                return getattr(self._real, name)

        def session(path: str, options: object, providers: list[object]) -> Session:
            self.asked.append(providers[0])
            return Session(path, options, providers)

        monkeypatch.setattr(ort, "InferenceSession", session)
        monkeypatch.setattr(
            ort, "get_available_providers", lambda: [OPENVINO, "CPUExecutionProvider"]
        )


def openvino_model(tmp_path: Path, kind: str) -> LoadedModel:
    path = tmp_path / "m.onnx"
    path.write_bytes(mlp())
    return LoadedModel(path, "sha", OPENVINO, accelerator_kind=kind)


def test_an_npu_replica_asks_openvino_for_the_npu_and_runs_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    build = OpenVinoBuild(monkeypatch, runs_on="NPU")
    model = openvino_model(tmp_path, "npu")
    assert build.asked == [(OPENVINO, {"device_type": "NPU"})]
    assert (model.provider, model.fallback) == (OPENVINO, "")
    np.testing.assert_allclose(model.run({"x": X})[0], mlp_reference(X), rtol=1e-6)


def test_an_npu_replica_openvino_serves_on_the_cpu_is_reported_as_a_fallback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    OpenVinoBuild(monkeypatch, runs_on="CPU")
    model = openvino_model(tmp_path, "npu")
    assert model.fallback == (f"runs on {OPENVINO}: {OPENVINO} runs with device_type=CPU, not NPU")


def test_a_missing_npu_falls_back_to_the_cpu_provider_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    OpenVinoBuild(monkeypatch, runs_on=None)
    model = openvino_model(tmp_path, "npu")
    assert model.provider == "CPUExecutionProvider"
    assert model.fallback.startswith(f"runs on CPUExecutionProvider: {OPENVINO} failed on the npu")
    assert "No NPU device found" in model.fallback
    np.testing.assert_allclose(model.run({"x": X})[0], mlp_reference(X), rtol=1e-6)


# ---- batching --------------------------------------------------------------------------


@pytest.fixture
async def batcher(tmp_path: Path) -> AsyncIterator[Batcher]:
    model = loaded(tmp_path, mlp())
    running = Batcher(
        model, ServingStats("d"), max_batch_size=8, max_queue_delay_s=0.05, max_queue=16
    )
    task = asyncio.create_task(running.run())
    yield running
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_concurrent_requests_share_a_run_and_each_gets_its_own_rows(
    batcher: Batcher,
) -> None:
    rows = [X[i : i + 1] * (i + 1) for i in range(3)] + [X]
    answers = await asyncio.gather(*(batcher.infer({"x": r}, len(r)) for r in rows))
    for request, (_, outputs) in zip(rows, answers, strict=True):
        np.testing.assert_allclose(outputs[0], mlp_reference(request), rtol=1e-6)
    # 6 rows arrived within the 50 ms window: one run, not four.
    assert dict(batcher.stats.batches_by_size) == {4: 1}
    assert batcher.stats.requests_total == 4


async def test_a_swap_takes_effect_between_runs_and_a_drain_refuses_new_requests(
    batcher: Batcher, tmp_path: Path
) -> None:
    first_model = batcher.model
    _, before = await batcher.infer({"x": X}, 3)
    replacement = loaded(tmp_path, mlp(seed=8), "v2.onnx")
    assert batcher.swap(replacement) is first_model
    used, after = await batcher.infer({"x": X}, 3)
    assert used is replacement
    np.testing.assert_allclose(after[0], mlp_reference(X, seed=8), rtol=1e-6)
    assert not np.allclose(before[0], after[0])

    pending = asyncio.create_task(batcher.infer({"x": X}, 3))
    await asyncio.sleep(0)  # accepted before the drain starts
    await batcher.drain()
    assert pending.done()
    assert (await pending)[0] is replacement
    with pytest.raises(Unavailable):
        await batcher.infer({"x": X}, 3)


async def test_a_full_queue_refuses_at_once(tmp_path: Path) -> None:
    model = loaded(tmp_path, mlp())
    stats = ServingStats("d")
    idle = Batcher(model, stats, max_queue=2)  # not running: nothing leaves the queue
    waiting = [asyncio.create_task(idle.infer({"x": X}, 3)) for _ in range(2)]
    await asyncio.sleep(0)
    with pytest.raises(QueueFull, match="2 requests queued"):
        await idle.infer({"x": X}, 3)
    assert stats.rejected_total == 1
    for task in waiting:
        task.cancel()
    text = render_prometheus([stats])
    assert 'greenfed_inference_rejected_total{deployment="d"} 1' in text


# ---- the model cache -------------------------------------------------------------------


class FlakyServer:
    """Serves one file; the first answers (one unless told) break off half-way, like a
    dropped link."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.ranges: list[str | None] = []
        self.broken_answers = 1

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.ranges.append(request.headers.get("Range"))
        if len(self.ranges) <= self.broken_answers:
            response = web.StreamResponse(headers={"Content-Length": str(len(self.body))})
            await response.prepare(request)
            await response.write(self.body[: len(self.body) // 2])
            assert request.transport is not None
            request.transport.close()  # the connection drops mid-transfer
            return response
        if "Range" not in request.headers:
            return web.Response(body=self.body)
        start = int(request.headers["Range"].split("=")[1].split("-")[0])
        return web.Response(status=206, body=self.body[start:])


@pytest.fixture
async def served(unused_tcp_port: int) -> AsyncIterator[tuple[str, FlakyServer]]:
    server = FlakyServer(mlp())
    app = web.Application()
    app.router.add_get("/model", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", unused_tcp_port).start()
    yield f"http://127.0.0.1:{unused_tcp_port}/model", server
    await runner.cleanup()


async def test_a_broken_download_resumes_and_the_file_is_verified(
    served: tuple[str, FlakyServer], tmp_path: Path
) -> None:
    url, server = served
    cache = ModelCache(tmp_path, max_bytes=10**6)
    sha = hashlib.sha256(server.body).hexdigest()
    async with aiohttp.ClientSession() as http:
        path = await cache.fetch(http, url, sha)
        assert path.read_bytes() == server.body
        assert server.ranges[0] is None
        assert server.ranges[1] == f"bytes={len(server.body) // 2}-"
        assert cache.resumed == 1
        again = await cache.fetch(http, url, sha)  # cached: no request
        assert again == path
        assert len(server.ranges) == 2
        with pytest.raises(ModelFetchError, match="checksum mismatch"):
            await cache.fetch(http, url, "0" * 64)
        assert not part_files(tmp_path)


async def test_a_download_longer_than_the_model_is_stopped_before_it_fills_the_disk(
    served: tuple[str, FlakyServer], tmp_path: Path
) -> None:
    """The signed document gives the model's size: whatever answers the URL (a broken
    server, someone on a plain-http path) cannot write more than that to disk."""
    url, server = served
    server.ranges.append("the first answer breaks off: not this test's")
    server.body = server.body * 50  # far more than the model announced
    cache = ModelCache(tmp_path, max_bytes=10**9)
    sha = hashlib.sha256(server.body).hexdigest()  # even one that hashes right
    async with aiohttp.ClientSession() as http:
        with pytest.raises(ModelFetchError, match="longer than the model can be"):
            await cache.fetch(http, url, sha, size_bytes=4096)
    assert not part_files(tmp_path)  # stopped, and what it wrote removed
    assert not cache.path(sha).exists()


def part_files(directory: Path) -> list[Path]:
    return list(directory.glob("*.part"))


async def test_a_cached_file_that_is_not_the_model_is_downloaded_again(
    served: tuple[str, FlakyServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A power cut or a bad disk can leave a cached file cut short or changed: it is
    checked (size, sha256) the first time an agent process uses it and replaced; the
    loads after that do not read a model of gigabytes again."""
    url, server = served
    server.broken_answers = 0
    sha = hashlib.sha256(server.body).hexdigest()
    size = len(server.body)
    cached = tmp_path / f"{sha}.onnx"
    hashed: list[str] = []

    def counting_file_sha256(path: Path) -> tuple[str, int]:
        hashed.append(path.name)
        return file_sha256(path)

    monkeypatch.setattr(model_fetch, "file_sha256", counting_file_sha256)
    async with aiohttp.ClientSession() as http:
        cached.write_bytes(server.body[:100])  # cut short, left by an earlier process
        cache = ModelCache(tmp_path, max_bytes=10**6)
        assert (await cache.fetch(http, url, sha)).read_bytes() == server.body
        assert len(server.ranges) == 1  # downloaded again, whole
        hashed.clear()
        for _ in range(3):
            assert await cache.fetch(http, url, sha, size_bytes=size) == cached
        assert hashed == []  # verified when downloaded: not hashed on each load
        assert len(server.ranges) == 1

        cached.write_bytes(bytes(size))  # the right size, other bytes
        restarted = ModelCache(tmp_path, max_bytes=10**6)
        assert (await restarted.fetch(http, url, sha, size_bytes=size)).read_bytes() == (
            server.body
        )
        assert len(server.ranges) == 2
        hashed.clear()
        assert await restarted.fetch(http, url, sha, size_bytes=size) == cached
        assert hashed == []

        cached.write_bytes(server.body[:-1])  # the announced size tells, without a hash
        again = ModelCache(tmp_path, max_bytes=10**6)
        assert (await again.fetch(http, url, sha, size_bytes=size)).read_bytes() == server.body
        assert len(server.ranges) == 3
        assert not part_files(tmp_path)


async def test_a_resumed_download_that_fails_its_checksum_is_downloaded_again_whole(
    served: tuple[str, FlakyServer], tmp_path: Path
) -> None:
    """A `.part` whose bytes are damaged (written but not on disk before a power cut):
    resuming after them cannot give the model, so the whole file is downloaded once more
    before the fetch gives up; a model that is wrong even then is not fetched again."""
    url, server = served
    server.broken_answers = 0
    sha = hashlib.sha256(server.body).hexdigest()
    (tmp_path / f"{sha}.part").write_bytes(bytes(100))  # zeros, not the model's bytes
    cache = ModelCache(tmp_path, max_bytes=10**6)
    async with aiohttp.ClientSession() as http:
        path = await cache.fetch(http, url, sha, size_bytes=len(server.body))
        assert path.read_bytes() == server.body
        assert server.ranges == ["bytes=100-", None]
        assert not part_files(tmp_path)

        wrong = "0" * 64  # the registry's sha256 that no download matches
        (tmp_path / f"{wrong}.part").write_bytes(bytes(100))
        with pytest.raises(ModelFetchError, match="checksum mismatch"):
            await cache.fetch(http, url, wrong)
        assert server.ranges[2:] == ["bytes=100-", None]
        assert not part_files(tmp_path)


async def test_a_download_that_gives_up_leaves_no_part_file(
    served: tuple[str, FlakyServer], tmp_path: Path
) -> None:
    url, server = served
    server.broken_answers = 10**6  # the link drops half-way, every time
    cache = ModelCache(tmp_path, max_bytes=10**6, attempts=2, retry_base_s=0.01)
    async with aiohttp.ClientSession() as http:
        with pytest.raises(ModelFetchError, match="after 2 attempts"):
            await cache.fetch(http, url, hashlib.sha256(server.body).hexdigest())
    assert len(server.ranges) == 2
    assert not part_files(tmp_path)


async def test_part_files_count_against_the_bound_but_not_one_being_written(
    unused_tcp_port: int, tmp_path: Path
) -> None:
    """A `.part` left by a download given up in an earlier process is evicted like a
    model, the oldest first; one that a fetch is resuming now stays, oldest or not."""
    slow_body, fast_body = os.urandom(100_000), os.urandom(40_000)
    requested, release = asyncio.Event(), asyncio.Event()

    async def slow(request: web.Request) -> web.Response:
        assert request.headers["Range"] == "bytes=50000-"
        requested.set()
        await release.wait()
        return web.Response(status=206, body=slow_body[50_000:])

    async def fast(request: web.Request) -> web.Response:
        return web.Response(body=fast_body)

    app = web.Application()
    app.router.add_get("/slow", slow)
    app.router.add_get("/fast", fast)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", unused_tcp_port).start()
    base = f"http://127.0.0.1:{unused_tcp_port}"
    slow_sha = hashlib.sha256(slow_body).hexdigest()
    resumed = tmp_path / f"{slow_sha}.part"
    resumed.write_bytes(slow_body[:50_000])
    os.utime(resumed, (500, 500))  # the oldest file of all
    stale = tmp_path / f"{'e' * 64}.part"  # a download an earlier process gave up
    stale.write_bytes(bytes(40_000))
    os.utime(stale, (1000, 1000))
    cache = ModelCache(tmp_path, max_bytes=110_000)
    try:
        async with aiohttp.ClientSession() as http, asyncio.TaskGroup() as tasks:
            slow_fetch = tasks.create_task(cache.fetch(http, f"{base}/slow", slow_sha))
            await requested.wait()
            # 130 000 bytes on disk with the fast model, over the bound of 110 000.
            await cache.fetch(http, f"{base}/fast", hashlib.sha256(fast_body).hexdigest())
            assert not stale.exists()
            assert resumed.stat().st_size == 50_000
            release.set()
        assert slow_fetch.result().read_bytes() == slow_body
    finally:
        release.set()
        await runner.cleanup()


# ---- .npy bodies -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "array",
    [
        np.ones((1, 4), np.float32),
        np.arange(6, dtype=np.int64).reshape(2, 3),
        np.arange(5.0),
        np.ones(()),
        np.zeros((0, 4), np.float32),
        np.asfortranarray(np.arange(6.0).reshape(2, 3)),
    ],
)
def test_npy_bodies_read_and_write_exactly_as_numpy_does(array: np.ndarray) -> None:
    written = io.BytesIO()
    np.save(written, array)
    read = read_npy(written.getvalue())
    assert (read.dtype, read.shape) == (array.dtype, array.shape)
    assert np.array_equal(read, array)
    expected = io.BytesIO()
    np.save(expected, np.ascontiguousarray(array))
    assert write_npy(array) == expected.getvalue()


def test_npy_bodies_that_are_not_plain_arrays_are_refused() -> None:
    objects = io.BytesIO()
    np.save(objects, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    for raw in (objects.getvalue(), b"not npy at all", write_npy(np.ones(4))[:-3]):
        with pytest.raises(ValueError, match=r"not a \.npy array"):
            read_npy(raw)


async def test_a_busy_control_plane_is_waited_out_but_a_refusal_is_final(
    unused_tcp_port: int, tmp_path: Path
) -> None:
    body = mlp()
    answers = [503, 503, 200]  # then, for the second model: 403
    seen: list[int] = []

    async def handle(request: web.Request) -> web.Response:
        status = answers.pop(0) if answers else 403
        seen.append(status)
        return web.Response(status=status, body=body if status == 200 else b"no")

    app = web.Application()
    app.router.add_get("/model", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", unused_tcp_port).start()
    retries: list[str] = []
    cache = ModelCache(tmp_path, max_bytes=10**6, retry_base_s=0.01)
    url = f"http://127.0.0.1:{unused_tcp_port}/model"
    try:
        async with aiohttp.ClientSession() as http:
            path = await cache.fetch(
                http, url, hashlib.sha256(body).hexdigest(), on_retry=retries.append
            )
            assert path.read_bytes() == body
            assert seen == [503, 503, 200]
            assert len(retries) == 2
            assert "503" in retries[0]
            with pytest.raises(ModelFetchError, match="answered 403"):
                await cache.fetch(http, url, "1" * 64)
            assert seen == [503, 503, 200, 403]  # no second try after a refusal
    finally:
        await runner.cleanup()
