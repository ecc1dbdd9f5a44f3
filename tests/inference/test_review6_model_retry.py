"""A model the agent cannot download for now is fetched again, never given up for good
(review 6):

- a replica whose model download runs out of attempts while the control plane is
  unreachable or busy stays `starting` and is fetched again after a backoff, or at once
  when a desired document is applied, the same generation included: an agent restored
  offline with a damaged cache serves once the control plane is back, and never
  reports the replica failed (the control plane would fail the whole deployment);
- a transfer that keeps going has no time limit, and an attempt that added bytes starts
  the count of failed attempts again: a model that takes longer than the attempts'
  total over a slow or flaky link is still served. A stalled transfer is still cut.

Real runtime, real downloads from a local HTTP server, real ONNX Runtime sessions;
the agent test runs the real agent on the real Mosquitto."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import aiomqtt
import pytest
from aiohttp import web

from edge.agent import Agent
from edge.inference.model_fetch import ModelCache, ModelFetchError
from edge.inference.options import InferenceOptions
from edge.inference.runtime import (
    DOWNLOAD_RETRY_BASE_S,
    DOWNLOAD_RETRY_MAX_S,
    InferenceRuntime,
)
from shared.messages import REPORTED_DECODER, Accelerator, DesiredDeployment, DesiredState
from shared.settings import parse_mqtt_url
from shared.topics import Channel, Topics
from tests.support.fleet import mqtt_settings, publish_desired, running, simulated_agent
from tests.support.onnx_models import mlp
from tests.support.tcp_proxy import TcpProxy
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(60)

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
    """The control plane's model blobs on a port of their own: answers `status` while
    it is not 200 (503: busy or restarting; 404: a refusal), and can be stopped and
    started again on the same port (the control plane unreachable meanwhile)."""

    def __init__(self, *bodies: bytes) -> None:
        self.by_sha256 = {sha256(body): body for body in bodies}
        self.status = 200
        self.downloads = 0
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        async def blob(request: web.Request) -> web.Response:
            if self.status != 200:
                return web.Response(status=self.status, text="not now")
            self.downloads += 1
            return web.Response(body=self.by_sha256[request.match_info["sha256"]])

        app = web.Application()
        app.router.add_get("/models/{sha256}", blob)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

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


def replica(blobs: ModelBlobs, body: bytes) -> DesiredDeployment:
    return DesiredDeployment(
        deployment_id="d1",
        replica=0,
        model_id="m1",
        model_url=blobs.url(body),
        model_sha256=sha256(body),
        model_size_bytes=len(body),
        accelerator_kind="cpu",
    )


class Node:
    """The agent's inference runtime on a CPU node, each state it reported kept."""

    def __init__(self, runtime: InferenceRuntime) -> None:
        self.runtime = runtime
        self.reported_states: list[str] = []

    def state(self) -> tuple[str, str]:
        (reported,) = self.runtime.reported()
        return reported.state, reported.reason


@asynccontextmanager
async def cpu_node(tmp_path: Path, *, quick_backoff: bool = False) -> AsyncIterator[Node]:
    """Fetches that give up after 2 quick attempts (the production ones take about two
    minutes); `quick_backoff`: the runtime fetches again within 0.2 s (its own: 15 s at
    the least)."""
    cache = ModelCache(tmp_path / "cache", max_bytes=10**7, attempts=2, retry_base_s=0.01)
    node: Node | None = None

    def on_change() -> None:
        if node is not None:
            node.reported_states.extend(r.state for r in node.runtime.reported())

    async with asyncio.TaskGroup() as tasks:
        runtime = InferenceRuntime(
            CPU,
            cache,
            on_change=on_change,
            endpoint_base=lambda: None,
            download_retry_base_s=0.05 if quick_backoff else DOWNLOAD_RETRY_BASE_S,
            download_retry_max_s=0.2 if quick_backoff else DOWNLOAD_RETRY_MAX_S,
        )
        runtime.bind(tasks)
        node = Node(runtime)
        try:
            yield node
        finally:
            await runtime.close()


def waiting_to_fetch_again(node: Node) -> bool:
    state, reason = node.state()
    return state == "starting" and "fetching it again" in reason


# ---- the runtime -----------------------------------------------------------------------


async def test_a_busy_control_plane_delays_a_replica_but_never_fails_it(tmp_path: Path) -> None:
    model = mlp()
    async with (
        model_blobs(model) as blobs,
        cpu_node(tmp_path, quick_backoff=True) as node,
    ):
        blobs.status = 503  # longer than a fetch's attempts
        node.runtime.apply([replica(blobs, model)])
        await eventually(lambda: waiting_to_fetch_again(node), message=lambda: str(node.state()))
        reason = node.state()[1]
        assert "could not download the model after 2 attempts" in reason
        assert "503" in reason

        blobs.status = 200  # the control plane is itself again
        await eventually(lambda: node.state() == ("ready", ""), message=lambda: str(node.state()))
        assert "failed" not in node.reported_states, node.reported_states


async def test_a_desired_document_applied_again_fetches_an_unreachable_model_at_once(
    tmp_path: Path,
) -> None:
    """The runtime's own backoff is 15 s at the least: only the document that an agent
    gets again on reconnecting (the retained one, same generation) can make the replica
    ready within the few seconds this test waits."""
    model = mlp()
    async with model_blobs(model) as blobs, cpu_node(tmp_path) as node:
        desired = [replica(blobs, model)]
        await blobs.stop()  # the control plane is unreachable
        node.runtime.apply(desired)
        await eventually(lambda: waiting_to_fetch_again(node), message=lambda: str(node.state()))

        await blobs.start()  # back, on its address
        node.runtime.apply(desired)  # the same document again
        await eventually(
            lambda: node.state() == ("ready", ""), timeout_s=5.0, message=lambda: str(node.state())
        )
        assert blobs.downloads == 1
        assert "failed" not in node.reported_states, node.reported_states


async def test_a_refused_model_still_fails_its_replica_at_once(tmp_path: Path) -> None:
    model = mlp()
    async with model_blobs(model) as blobs, cpu_node(tmp_path) as node:
        blobs.status = 404  # not in the registry (or a bad signature): final
        node.runtime.apply([replica(blobs, model)])
        await eventually(lambda: node.state()[0] == "failed", message=lambda: str(node.state()))
        assert "answered 404" in node.state()[1]


async def test_an_update_whose_model_is_unreachable_keeps_the_old_one_and_swaps_later(
    tmp_path: Path,
) -> None:
    old, new = mlp(seed=1), mlp(seed=2)
    async with (
        model_blobs(old, new) as blobs,
        cpu_node(tmp_path, quick_backoff=True) as node,
    ):
        node.runtime.apply([replica(blobs, old)])
        await eventually(lambda: node.state() == ("ready", ""), message=lambda: str(node.state()))

        blobs.status = 503
        node.runtime.apply([replica(blobs, new)])
        await eventually(
            lambda: "waits: could not download" in node.state()[1],
            message=lambda: str(node.state()),
        )
        (reported,) = node.runtime.reported()
        assert (reported.state, reported.model_sha256) == ("ready", sha256(old))

        blobs.status = 200
        await eventually(lambda: node.runtime.swaps == 1, message=lambda: str(node.state()))
        (reported,) = node.runtime.reported()
        assert (reported.state, reported.model_sha256) == ("ready", sha256(new))


# ---- the agent, restored offline -------------------------------------------------------


async def reported_states(url: str, topic: str, seen: list[str], subscribed: asyncio.Event) -> None:
    """Every replica state the agent publishes on `topic` from now on (not the retained
    report of an earlier agent process), into `seen`."""
    endpoint = parse_mqtt_url(url)
    async with aiomqtt.Client(endpoint.host, endpoint.port) as watcher:
        await watcher.subscribe(topic, qos=1)
        subscribed.set()
        async for message in watcher.messages:
            if message.retain or not isinstance(message.payload, bytes) or not message.payload:
                continue
            report = REPORTED_DECODER.decode(message.payload)
            seen.extend(d.state for d in report.deployments)


async def test_an_agent_restored_offline_serves_once_its_control_plane_is_back(
    mosquitto_root: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Restarted while its broker and control plane are unreachable, with its cached model
    damaged (a power cut): the download gives up, the replica waits; once both are back,
    the retained document (the same generation) fetches it at once, and no report says
    failed, for which the control plane would fail the deployment."""
    url, topic_root = mosquitto_root
    broker = parse_mqtt_url(url)
    kwdefaults = ModelCache.__init__.__kwdefaults__
    assert kwdefaults is not None
    monkeypatch.setitem(kwdefaults, "attempts", 2)  # give up in well under a second
    monkeypatch.setitem(kwdefaults, "retry_base_s", 0.01)
    node_id = "orin-restored"
    model = mlp()
    options = InferenceOptions(cache_dir=tmp_path / "models")
    proxy = TcpProxy(broker.host, broker.port)
    await proxy.start()
    seen: list[str] = []
    subscribed = asyncio.Event()
    async with model_blobs(model) as blobs, asyncio.TaskGroup() as tasks:
        try:
            first = simulated_agent(
                node_id,
                mqtt_settings(proxy.url, topic_root),
                inference=options,
                state_dir=tmp_path / "state",
            )
            async with running(first):
                await eventually(first.announced.is_set)
                desired = DesiredState(
                    node_id=node_id,
                    generation=1,
                    issued_at=1.0,
                    cluster_id="c1",
                    deployments=(replica(blobs, model),),
                )
                await publish_desired(url, topic_root, desired)
                await eventually(lambda: serving_state(first) == "ready")

            (cached,) = (tmp_path / "models").rglob("*.onnx")
            cached.write_bytes(cached.read_bytes()[:100])  # damaged by a power cut
            await blobs.stop()
            await proxy.unplug()
            topic = Topics(topic_root).node(node_id, Channel.REPORTED)
            watcher = tasks.create_task(reported_states(url, topic, seen, subscribed))
            await asyncio.wait_for(subscribed.wait(), 10.0)

            again = simulated_agent(
                node_id,
                mqtt_settings(proxy.url, topic_root),
                inference=options,
                state_dir=tmp_path / "state",
            )
            async with running(again):
                await eventually(lambda: again.counters.desired_restored == 1)
                await eventually(
                    lambda: waiting_to_fetch(again), message=lambda: str(serving_reason(again))
                )
                await blobs.start()  # the control plane is back, and its broker
                await proxy.plug()
                await eventually(
                    lambda: serving_state(again) == "ready",
                    message=lambda: f"{serving_state(again)}: {serving_reason(again)}",
                )
                await eventually(lambda: seen[-1:] == ["ready"], message=lambda: str(seen))
            assert "failed" not in seen, seen
            watcher.cancel()
        finally:
            await proxy.stop()


def serving_state(agent: Agent) -> str | None:
    runtime = agent.inference
    served = runtime.serving("d1") if runtime is not None else None
    return served.state if served is not None else None


def serving_reason(agent: Agent) -> str | None:
    runtime = agent.inference
    served = runtime.serving("d1") if runtime is not None else None
    return served.reason if served is not None else None


def waiting_to_fetch(agent: Agent) -> bool:
    return serving_state(agent) == "starting" and "fetching it again" in (
        serving_reason(agent) or ""
    )


# ---- the model cache -------------------------------------------------------------------


@asynccontextmanager
async def serving(
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_get("/model", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/model"
    finally:
        await runner.cleanup()


def first_byte(request: web.Request) -> int:
    ranged = request.headers.get("Range")
    return int(ranged.split("=")[1].rstrip("-")) if ranged else 0


async def test_a_slow_transfer_that_keeps_going_is_not_cut(tmp_path: Path) -> None:
    """A model over a slow uplink takes longer than any fixed limit on an attempt: bytes
    keep coming, so the transfer goes on (the stall limit, 0.5 s here, is never hit)."""
    body = bytes(range(256)) * 120  # 30 720 bytes, in 1 024-byte steps 0.05 s apart
    requests: list[int] = []

    async def slow(request: web.Request) -> web.StreamResponse:
        start = first_byte(request)
        requests.append(start)
        response = web.StreamResponse(status=206 if start else 200)
        response.content_length = len(body) - start
        await response.prepare(request)
        for offset in range(start, len(body), 1024):
            await response.write(body[offset : offset + 1024])
            await asyncio.sleep(0.05)  # the link's pace, about 1.5 s in all
        return response

    cache = ModelCache(tmp_path, max_bytes=10**6, timeout_s=0.5, attempts=2, retry_base_s=0.01)
    async with serving(slow) as url, aiohttp.ClientSession() as http:
        path = await cache.fetch(http, url, sha256(body), size_bytes=len(body))
    assert path.read_bytes() == body
    assert requests[0] == 0


async def test_a_link_that_drops_often_but_makes_progress_is_never_given_up(
    tmp_path: Path,
) -> None:
    """Each attempt resumes where the last one stopped and adds bytes: more attempts than
    the cache allows in a row fail, and the model still arrives."""
    body = bytes(range(256)) * 200  # 51 200 bytes; each answer breaks off after 10 000
    requests: list[int] = []

    async def flaky(request: web.Request) -> web.StreamResponse:
        start = first_byte(request)
        requests.append(start)
        response = web.StreamResponse(status=206 if start else 200)
        response.content_length = len(body) - start
        await response.prepare(request)
        await response.write(body[start : start + 10_000])
        if start + 10_000 < len(body):
            assert request.transport is not None
            request.transport.close()  # the link drops mid-transfer
        return response

    cache = ModelCache(tmp_path, max_bytes=10**6, attempts=2, retry_base_s=0.01)
    async with serving(flaky) as url, aiohttp.ClientSession() as http:
        path = await cache.fetch(http, url, sha256(body), size_bytes=len(body))
    assert path.read_bytes() == body
    assert requests == [0, 10_000, 20_000, 30_000, 40_000, 50_000]
    assert cache.resumed == 5


async def test_a_stalled_transfer_is_still_cut_and_given_up(tmp_path: Path) -> None:
    """No byte for longer than the stall limit fails the attempt; attempts that add none
    run out, and the `.part` goes."""
    body = bytes(range(256)) * 40
    never = asyncio.Event()

    async def stalling(request: web.Request) -> web.StreamResponse:
        start = first_byte(request)
        response = web.StreamResponse(status=206 if start else 200)
        response.content_length = len(body) - start
        await response.prepare(request)
        if not start:
            await response.write(body[:1000])
        await never.wait()  # the link stalls
        return response

    cache = ModelCache(tmp_path, max_bytes=10**6, timeout_s=0.3, attempts=2, retry_base_s=0.01)
    async with serving(stalling) as url, aiohttp.ClientSession() as http:
        try:
            with pytest.raises(ModelFetchError, match="after 2 attempts"):
                await asyncio.wait_for(cache.fetch(http, url, sha256(body)), 10.0)
        finally:
            never.set()  # the server's handlers end before it stops
    assert not part_files(tmp_path)


def part_files(directory: Path) -> list[Path]:
    return list(directory.glob("*.part"))
