"""JSON nested too deeply to read (the JSON module raises RecursionError there, not a
ValueError) from a Slurm cluster is read as any answer that is not JSON:
slurmrestd's answer is `ClusterRefused` (cloud/clusters/slurm/rest_client.py), so the
bridge shows the cluster failing instead of losing its task; a registration's JWT
whose claims are nested so names no user (cloud/clusters/slurm/rest_backend.py), as
any token that is not a readable JWT."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from aiohttp import web

from cloud.clusters.backend import ClusterRefused
from cloud.clusters.slurm.rest_backend import SlurmRestBackend
from cloud.clusters.slurm.rest_client import SlurmRestAccess, SlurmRestClient
from cloud.clusters.slurm.script import SubmitOptions
from tests.support.brokers import free_port

pytestmark = pytest.mark.timeout(30)

# Far deeper than any recursion guard (Python's default limit is 1,000 frames).
NESTING = 10_000
NESTED_ANSWER = b'{"errors":[],"x":' + b"[" * NESTING + b"]" * NESTING + b"}"


@asynccontextmanager
async def slurmrestd_answering(body: bytes) -> AsyncIterator[str]:
    """The URL of a server that answers every request 200 with `body`, as JSON."""

    async def handle(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_a_slurmrestd_answer_nested_too_deeply_is_refused() -> None:
    async with slurmrestd_answering(NESTED_ANSWER) as url:
        access = SlurmRestAccess(url=url, user_name="greenfed", token="a-token")
        backend = SlurmRestBackend(SlurmRestClient(access), SubmitOptions(work_dir="/shared/gf"))
        try:
            with pytest.raises(ClusterRefused, match="slurmrestd answered GET /openapi/v3 200"):
                await backend.dialect()
        finally:
            await backend.close()


async def test_a_jwt_with_claims_nested_too_deeply_names_no_user() -> None:
    depth = 2_000
    claims = base64.urlsafe_b64encode(b"[" * depth + b"]" * depth).decode().rstrip("=")
    token = f"eyJhbGciOiJIUzI1NiJ9.{claims}.c2lnbmF0dXJl"
    access = SlurmRestAccess(url="http://127.0.0.1:1", token=token)
    backend = SlurmRestBackend(SlurmRestClient(access), SubmitOptions(work_dir="/shared/gf"))
    try:
        # As for any token that names no user: no job is believed to be greenfed's.
        with pytest.raises(ClusterRefused, match="cannot tell greenfed's jobs from other"):
            backend.account()
    finally:
        await backend.close()
