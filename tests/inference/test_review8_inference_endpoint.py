"""The agent's inference endpoint as InferenceServer (edge/agent/inference_server.py)
runs it, for what review 8 found: a client that sends half a request is cut off (it
held one of the agent's open files for ever, and 400 of them starved the agent's
health check and model downloads), the endpoint holds a bounded number of connections
and tells the rest so at once, the agent's unit leaves it room, and a stop with a
request queued for a batch answers that request 503 and ends within seconds (it hung
for two minutes, past systemd's TimeoutStopSec, and the client got no answer)."""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import structlog
from aiohttp import web

from edge.agent.context import AgentContext, AgentCounters, NodeIdentity
from edge.agent.inference_server import InferenceServer
from edge.inference.options import InferenceOptions
from shared.messages import Accelerator, DesiredDeployment
from shared.topics import Topics
from tests.inference.onnx_shapes import identity
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(60)

ANSWER_S = 5.0  # bound on any one wait below
UNIT = Path(__file__).resolve().parents[2] / "deploy/edge/greenfed-agent.service"
CPU = Accelerator(
    id="cpu0",
    kind="cpu",
    vendor="test",
    model="test",
    memory_bytes=1 << 30,
    compute_units=4,
    onnx_providers=("CPUExecutionProvider",),
)


@asynccontextmanager
async def model_server(body: bytes) -> AsyncIterator[str]:
    """Where the agent downloads `body` from."""

    async def blob(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/octet-stream")

    app = web.Application()
    app.router.add_get("/model", blob)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/model"
    finally:
        await runner.cleanup()


@asynccontextmanager
async def serving(
    tmp_path: Path, limits: dict[str, Any] | None = None, **batching: Any
) -> AsyncIterator[tuple[InferenceServer, str]]:
    """An agent's inference server serving the identity model as deployment `dep`, and
    its endpoint's base URL. `limits`: EndpointLimits' fields, where not the defaults."""
    extra: dict[str, Any] = {}
    if limits is not None:
        from edge.agent.inference_server import EndpointLimits

        extra["limits"] = EndpointLimits(**limits)
    context = AgentContext(
        identity=NodeIdentity(node_id="infer-node", site="edge", zone="DE", region="eu"),
        instance_id="instance-1",
        topics=Topics("gftest-review8"),
        counters=AgentCounters(),
        wall_clock=time.time,
        log=structlog.get_logger("test"),
    )
    options = InferenceOptions(cache_dir=tmp_path / "models", host="127.0.0.1", port=0)
    model = identity()
    async with model_server(model) as url, asyncio.TaskGroup() as work:
        server = InferenceServer(context, options, (CPU,), on_change=lambda: None, **extra)
        await server.start(work)
        try:
            desired = DesiredDeployment(
                deployment_id="dep",
                model_url=url,
                model_sha256=hashlib.sha256(model).hexdigest(),
                model_size_bytes=len(model),
                **batching,
            )
            await server.apply([desired])

            def ready() -> bool:
                replica = server.runtime.serving("dep") if server.runtime else None
                return replica is not None and replica.state == "ready"

            await eventually(ready, timeout_s=20, message="the replica never got ready")
            yield server, f"http://127.0.0.1:{server.port}"
        finally:
            async with asyncio.timeout(ANSWER_S):
                await server.stop()


async def raw_connection(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.removeprefix("http://").split(":")
    return await asyncio.open_connection(host, int(port))


async def everything_until_closed(reader: asyncio.StreamReader) -> bytes:
    async with asyncio.timeout(ANSWER_S):
        return await reader.read()


async def test_a_stop_answers_a_queued_request_503_and_takes_seconds(tmp_path: Path) -> None:
    # A request waits up to five minutes for others to join its batch.
    queued = serving(tmp_path, max_batch_size=8, max_queue_delay_ms=300_000)
    async with queued as (server, url), aiohttp.ClientSession() as http:
        answer = asyncio.ensure_future(
            http.post(f"{url}/v1/infer/dep", json={"inputs": {"x": [[1, 2, 3, 4]]}})
        )
        assert server.runtime is not None
        batcher = server.runtime.next_batcher("dep")
        assert batcher is not None
        await eventually(lambda: batcher.queued == 1, message="the request never queued")

        started_s = time.monotonic()
        async with asyncio.timeout(ANSWER_S):
            await server.stop()
        assert time.monotonic() - started_s < ANSWER_S

        async with asyncio.timeout(ANSWER_S):
            response = await answer
        assert response.status == 503
        assert response.headers["Retry-After"] == "1"
        problem = await response.json(content_type=None)
        assert "stopping" in problem["detail"]
        response.release()


async def test_half_sent_requests_are_cut_off_and_real_clients_served(tmp_path: Path) -> None:
    limits = {"header_timeout_s": 0.3, "body_timeout_s": 0.3}
    async with serving(tmp_path, limits=limits) as (_, url):
        silent_reader, silent = await raw_connection(url)  # sends nothing at all
        head_reader, head = await raw_connection(url)
        head.write(b"POST /v1/infer/dep HTTP/1.1\r\nHost: a\r\nX-Slow: 1")
        body_reader, body = await raw_connection(url)
        body.write(b"POST /v1/infer/dep HTTP/1.1\r\nHost: a\r\nContent-Length: 1000\r\n\r\n{")

        # Each is closed by the agent, the one that stopped within its body after a 408.
        assert await everything_until_closed(silent_reader) == b""
        assert await everything_until_closed(head_reader) == b""
        answer = await everything_until_closed(body_reader)
        assert answer.startswith(b"HTTP/1.1 408"), answer
        for writer in (silent, head, body):
            writer.close()

        # A client that keeps sending is never cut off by the body timeout.
        async def slow_body() -> AsyncIterator[bytes]:
            for part in (b'{"inputs": ', b'{"x": [[1, 2, ', b"3, 4]]}}"):
                yield part
                await asyncio.sleep(0.2)  # a pause shorter than the body timeout

        async with (
            aiohttp.ClientSession() as http,
            asyncio.timeout(ANSWER_S),
            http.post(f"{url}/v1/infer/dep", data=slow_body()) as response,
        ):
            assert response.status == 200
            assert (await response.json())["outputs"]["y"] == [[1, 2, 3, 4]]


async def test_connections_past_the_limit_are_refused_at_once(tmp_path: Path) -> None:
    limits = {"max_connections": 3, "header_timeout_s": 30.0}
    async with serving(tmp_path, limits=limits) as (_, url):
        held = [await raw_connection(url) for _ in range(3)]
        # The fourth is answered 503 and closed, not kept waiting (nor kept open).
        refused_reader, refused = await raw_connection(url)
        answer = await everything_until_closed(refused_reader)
        assert answer.startswith(b"HTTP/1.1 503"), answer
        assert b"Retry-After: 1" in answer
        refused.close()

        # A connection given up frees its place for a real client.
        held.pop()[1].close()
        async with aiohttp.ClientSession() as http:

            async def healthy() -> bool:
                try:
                    async with asyncio.timeout(ANSWER_S):
                        async with http.get(f"{url}/healthz") as response:
                            return response.status == 200
                except aiohttp.ClientError:  # refused while the place was not yet free
                    return False

            deadline_s = time.monotonic() + ANSWER_S
            while not await healthy():
                assert time.monotonic() < deadline_s, "/healthz never answered 200"
                await asyncio.sleep(0.05)
        for _, writer in held:
            writer.close()


async def test_a_refused_client_still_sending_its_body_reads_the_503(tmp_path: Path) -> None:
    """Closed with its request unread, a socket is reset: a blocking client that writes
    its whole 4 MB body before reading lost the 503 to ConnectionResetError (9 in 10)."""
    import socket

    body_bytes = 4_000_000
    async with serving(tmp_path, limits={"max_connections": 1}) as (_, url):
        _, held = await raw_connection(url)
        host, port = url.removeprefix("http://").split(":")

        def post_then_read() -> bytes:
            with socket.create_connection((host, int(port)), timeout=ANSWER_S) as client:
                head = b"POST /v1/infer/x HTTP/1.1\r\nHost: a\r\n"
                client.sendall(head + b"Content-Length: %d\r\n\r\n" % body_bytes)
                client.sendall(b"a" * body_bytes)
                return client.recv(64)

        for _ in range(3):
            answer = await asyncio.to_thread(post_then_read)
            assert answer.startswith(b"HTTP/1.1 503"), answer
        held.close()


def test_by_default_the_endpoint_holds_a_quarter_of_the_agents_files_at_most() -> None:
    import resource

    from edge.agent.inference_server import MAX_CONNECTIONS, EndpointLimits

    soft_limit, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = EndpointLimits().connection_limit()
    assert 1 <= limit <= MAX_CONNECTIONS
    if soft_limit != resource.RLIM_INFINITY:
        assert limit <= max(1, soft_limit // 4)
    # The agent's unit gives it files for all of them and thrice as many of its own.
    found = re.search(r"^LimitNOFILE=(\d+)(?::\d+)?$", UNIT.read_text(), re.MULTILINE)
    assert found is not None, "the agent's unit sets no LimitNOFILE"
    assert int(found.group(1)) >= 4 * MAX_CONNECTIONS
