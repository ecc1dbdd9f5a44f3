"""The inference runtime's model updates and model cache (review 8):

- an update whose download was refused (the old model serving on) is loaded again once
  a desired document for the same model differs (a fresh, working URL): the node does
  not serve the old version until something else changes. The same document again is
  not retried, as for a replica whose first load failed;
- the model cache never evicts the model a replica serves, nor one it is about to load,
  even by a download that began before that replica was deployed (the deployment would
  have to be downloaded again, could not be restored offline, or failed for good when
  ONNX Runtime found no file); a withdrawn replica's model may be evicted again.

Real runtime, real downloads from a local HTTP server, real ONNX Runtime sessions."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiohttp import web

from edge.inference.model_fetch import ModelCache
from edge.inference.runtime import InferenceRuntime, ServedReplica
from edge.inference.session import LoadedModel
from shared.messages import Accelerator, DesiredDeployment
from tests.support.onnx_models import mlp
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(30)

CPU = (
    Accelerator(
        id="cpu0",
        kind="cpu",
        vendor="generic",
        model="simulated",
        memory_bytes=4 << 30,
        compute_units=4,
        onnx_providers=("CPUExecutionProvider",),
    ),
)


def sha256(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


class ModelBlobs:
    """The control plane's model blobs: `held` ones answer once released."""

    def __init__(self, *bodies: bytes) -> None:
        self.by_sha256 = {sha256(body): body for body in bodies}
        self.held: dict[str, asyncio.Event] = {}
        self.requested: dict[str, asyncio.Event] = {}
        self.downloads: list[str] = []
        self.port = 0
        self._runner: web.AppRunner | None = None

    def hold(self, body: bytes) -> asyncio.Event:
        """Its download waits until the returned event is set."""
        release = self.held[sha256(body)] = asyncio.Event()
        self.requested[sha256(body)] = asyncio.Event()
        return release

    async def start(self) -> None:
        async def blob(request: web.Request) -> web.Response:
            digest = request.match_info["sha256"]
            if digest not in self.by_sha256:
                return web.Response(status=404, text="no such model")
            self.downloads.append(digest)
            if digest in self.held:
                self.requested[digest].set()
                await self.held[digest].wait()
            return web.Response(body=self.by_sha256[digest])

        app = web.Application()
        app.router.add_get("/models/{sha256}", blob)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        for release in self.held.values():
            release.set()
        if self._runner is not None:
            await self._runner.cleanup()

    def url(self, body: bytes) -> str:
        return f"http://127.0.0.1:{self.port}/models/{sha256(body)}"


@asynccontextmanager
async def model_blobs(*bodies: bytes) -> AsyncIterator[ModelBlobs]:
    blobs = ModelBlobs(*bodies)
    await blobs.start()
    try:
        yield blobs
    finally:
        await blobs.stop()


def replica(blobs: ModelBlobs, deployment_id: str, body: bytes) -> DesiredDeployment:
    return DesiredDeployment(
        deployment_id=deployment_id,
        replica=0,
        model_id=f"m-{deployment_id}",
        model_url=blobs.url(body),
        model_sha256=sha256(body),
        model_size_bytes=len(body),
        accelerator_kind="cpu",
    )


@asynccontextmanager
async def cpu_node(cache: ModelCache) -> AsyncIterator[InferenceRuntime]:
    async with asyncio.TaskGroup() as tasks:
        runtime = InferenceRuntime(CPU, cache, on_change=lambda: None, endpoint_base=lambda: None)
        runtime.bind(tasks)
        try:
            yield runtime
        finally:
            await runtime.close()


def served(runtime: InferenceRuntime, deployment_id: str) -> ServedReplica:
    replica = runtime.serving(deployment_id)
    assert replica is not None, deployment_id
    return replica


def describe(runtime: InferenceRuntime) -> str:
    return str([(r.deployment_id, r.state, r.model_sha256, r.reason) for r in runtime.reported()])


# ---- a failed update ---------------------------------------------------------------------


async def test_a_refused_update_is_loaded_once_a_desired_document_brings_a_working_url(
    tmp_path: Path,
) -> None:
    old, new = mlp(seed=1), mlp(seed=2)
    async with (
        model_blobs(old, new) as blobs,
        cpu_node(ModelCache(tmp_path / "cache", 10**7)) as runtime,
    ):
        runtime.apply([replica(blobs, "d1", old)])
        await eventually(
            lambda: served(runtime, "d1").state == "ready", message=lambda: describe(runtime)
        )

        update = replica(blobs, "d1", new)
        refused = msgspec.structs.replace(
            update, model_url=blobs.url(new).replace("/models/", "/unsigned/")
        )
        runtime.apply([refused])  # 404: a final refusal
        await eventually(
            lambda: "failed" in served(runtime, "d1").reason, message=lambda: describe(runtime)
        )
        assert served(runtime, "d1").loaded_sha256 == sha256(old)  # the old model serves on

        # The same document again: final, as for a replica whose first load failed.
        failed_load = served(runtime, "d1").loading
        runtime.apply([refused])
        assert served(runtime, "d1").loading is failed_load

        runtime.apply([update])  # the same model, a URL that works
        await eventually(
            lambda: served(runtime, "d1").loaded_sha256 == sha256(new),
            message=lambda: describe(runtime),
        )
        (reported,) = runtime.reported()
        assert (reported.state, reported.model_sha256, reported.reason) == (
            "ready",
            sha256(new),
            "",
        )


# ---- eviction ----------------------------------------------------------------------------


def cache_for_two(tmp_path: Path, *bodies: bytes) -> ModelCache:
    """A cache with room for any two of the models, not three."""
    return ModelCache(tmp_path / "cache", max_bytes=sum(len(body) for body in bodies) - 10)


async def test_a_download_that_began_earlier_never_evicts_a_running_replicas_model(
    tmp_path: Path,
) -> None:
    a, b, c, d = (mlp(seed=seed) for seed in (11, 12, 13, 14))
    cache = cache_for_two(tmp_path, a, b, c)
    async with model_blobs(a, b, c, d) as blobs, cpu_node(cache) as runtime:
        runtime.apply([replica(blobs, "a", a)])
        await eventually(
            lambda: served(runtime, "a").state == "ready", message=lambda: describe(runtime)
        )
        release_b = blobs.hold(b)
        runtime.apply([replica(blobs, "a", a), replica(blobs, "b", b)])
        await asyncio.wait_for(blobs.requested[sha256(b)].wait(), 10)

        # Deployed while b downloads: c is fetched and served first.
        runtime.apply([replica(blobs, name, body) for name, body in (("a", a), ("b", b), ("c", c))])
        await eventually(
            lambda: served(runtime, "c").state == "ready", message=lambda: describe(runtime)
        )
        release_b.set()
        await eventually(
            lambda: served(runtime, "b").state == "ready", message=lambda: describe(runtime)
        )

        # Every model a replica serves stays, over the bound: an agent restarted offline
        # restores all three without a download.
        assert all(cache.path(sha256(body)).exists() for body in (a, b, c))

        # Withdrawn, c's model is the least recently used one not in use: d's download
        # evicts it (the pins of a withdrawn replica are given back).
        runtime.apply([replica(blobs, name, body) for name, body in (("a", a), ("b", b), ("d", d))])
        await eventually(
            lambda: served(runtime, "d").state == "ready", message=lambda: describe(runtime)
        )
        assert not cache.path(sha256(c)).exists()
        assert all(cache.path(sha256(body)).exists() for body in (a, b, d))


async def test_a_download_that_began_earlier_never_evicts_a_model_about_to_be_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """c's file is downloaded and about to be opened (ONNX Runtime's thread is late, as
    when the default pool is busy) when b's download, begun before c was deployed,
    finishes and evicts: c must still load, not fail for good with "no such file"."""
    a, b, c = (mlp(seed=seed) for seed in (21, 22, 23))
    cache = cache_for_two(tmp_path, a, b, c)
    opening_c, open_c = threading.Event(), threading.Event()

    def late_for_c(path: Path, digest: str, *args: Any, **kwargs: Any) -> Any:
        if digest == sha256(c):
            opening_c.set()
            assert open_c.wait(10), "never told to open c"
        return LoadedModel(path, digest, *args, **kwargs)

    monkeypatch.setattr("edge.inference.runtime.LoadedModel", late_for_c)
    try:
        async with model_blobs(a, b, c) as blobs, cpu_node(cache) as runtime:
            runtime.apply([replica(blobs, "a", a)])
            await eventually(
                lambda: served(runtime, "a").state == "ready", message=lambda: describe(runtime)
            )
            release_b = blobs.hold(b)
            runtime.apply([replica(blobs, "a", a), replica(blobs, "b", b)])
            await asyncio.wait_for(blobs.requested[sha256(b)].wait(), 10)

            runtime.apply(
                [replica(blobs, name, body) for name, body in (("a", a), ("b", b), ("c", c))]
            )
            await eventually(opening_c.is_set, message="c's model was never about to be opened")
            release_b.set()
            await eventually(
                lambda: served(runtime, "b").state == "ready", message=lambda: describe(runtime)
            )
            open_c.set()
            await eventually(
                lambda: served(runtime, "c").state != "starting", message=lambda: describe(runtime)
            )
            assert served(runtime, "c").state == "ready", describe(runtime)
            assert cache.path(sha256(c)).exists()
    finally:
        open_c.set()  # never leave ONNX Runtime's thread waiting
