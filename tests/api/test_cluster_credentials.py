"""A cluster reached through slurmrestd over TCP with a JWT (`rest_auth/jwt`): the token
is a secret (encrypted in the store, masked in every view, sent only as slurmrestd's
`X-SLURM-USER-TOKEN` header), and the OpenAPI version is the best both offer.

Debian's Slurm 22.05 has no `auth/jwt` plugin and no slurmrestd of v0.0.41 or later can
be installed here, so what stands at the other end is an HTTP server answering as such
a slurmrestd would (the shapes checked against Slurm's published schemas in
tests/cloud/test_slurm_rest_dialects.py); the real slurmrestd over a UNIX socket is in
tests/integration/test_slurm_backend.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web

from cloud.app_keys import CLUSTERS, REGISTRY, STORE
from shared.redact import MASK
from tests.api.support import Api, bearer, problem
from tests.support.brokers import free_port
from tests.support.waiting import eventually, eventually_async

pytestmark = [
    pytest.mark.timeout(120),
    # The store's part (the token kept encrypted) is the same on both databases.
    pytest.mark.parametrize("database", ["sqlite"], indirect=True),
]
TOKEN = "eyJhbGciOiJIUzI1NiJ9.eyJzdW4iOiJncmVlbmZlZCJ9.c2lnbmF0dXJl"


class FakeSlurmrestd:
    """Answers `/openapi/v3`, nodes and jobs of the versions it is told to offer, and
    keeps the headers of every request."""

    def __init__(self, versions: tuple[str, ...], queued: int = 0) -> None:
        self.versions = versions
        self.queued = queued
        self.headers: list[dict[str, str]] = []
        self.paths: list[str] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.headers.append(dict(request.headers))
        self.paths.append(request.path)
        if request.headers.get("X-SLURM-USER-TOKEN") != TOKEN:
            return web.json_response({"errors": [{"error": "Authentication failure"}]}, status=401)
        path = request.path.rstrip("/")
        if path == "/openapi/v3":
            paths: dict[str, Any] = {
                f"/slurm/{v}/{p}/": {} for v in self.versions for p in ("jobs", "nodes")
            }
            return web.json_response({"openapi": "3.0.3", "paths": paths})
        if path.endswith("/nodes"):
            node = {
                "name": "gpu01",
                "partitions": ["gpu"],
                "cpus": 32,
                "real_memory": 256000,
                "gres": "gpu:h100:8",
                "gres_used": "gpu:h100:0",
                "state": ["IDLE"],
                "reason": "",
            }
            return web.json_response({"nodes": [node], "errors": []})
        if path.endswith("/jobs"):
            # A busy cluster's queue: an answer of megabytes, read whole.
            others = [
                {"job_id": i, "name": f"sim-{i}", "job_state": ["PENDING"], "comment": "x" * 100}
                for i in range(1, self.queued + 1)
            ]
            return web.json_response({"jobs": others, "errors": []})
        return web.json_response({"errors": [{"error": "Unknown path"}]}, status=404)


@asynccontextmanager
async def slurmrestd(
    versions: tuple[str, ...], queued: int = 0
) -> AsyncIterator[tuple[FakeSlurmrestd, str]]:
    fake = FakeSlurmrestd(versions, queued)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", fake.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield fake, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def registration(url: str, **slurm: Any) -> dict[str, Any]:
    return {
        "name": "hpc",
        "zone": "FR",
        "region": "europe-west9",
        "slurm": {"rest_url": url, "rest_user": "greenfed", "rest_token": TOKEN, **slurm},
        "refresh_interval_s": 1.0,
    }


async def test_a_jwt_is_a_secret_sent_only_to_slurmrestd(api: Api) -> None:
    async with slurmrestd(("v0.0.40", "v0.0.41", "v0.0.42"), queued=20_000) as (fake, url):
        response = await api.client.post(
            "/v1/clusters", json=registration(url), headers=bearer(api.admin_token)
        )
        assert response.status == 201, await response.text()
        assert (await response.json())["spec"]["slurm"]["rest_token"] == MASK

        await eventually(lambda: api.app[REGISTRY].get("hpc.gpu01") is not None, timeout_s=30)
        listed = await (await api.get(api.admin_token, "/v1/clusters")).json()
        (cluster,) = listed["items"]
        assert cluster["reachable"] is True
        assert cluster["accelerators"] == {"NVIDIA H100 80GB HBM3": 8}
        assert cluster["pending_jobs"] == 20_000
        assert cluster["spec"]["slurm"]["rest_token"] == MASK
        assert TOKEN not in str(listed)
        # Every request carried the token and the user it is for, and the version spoken
        # is the best both offer.
        assert fake.headers
        assert all(h["X-SLURM-USER-TOKEN"] == TOKEN for h in fake.headers)
        assert all(h["X-SLURM-USER-NAME"] == "greenfed" for h in fake.headers)
        assert {p.split("/")[2] for p in fake.paths if p.startswith("/slurm/")} == {"v0.0.42"}
        # Encrypted in the store: the plaintext is nowhere in what it keeps.
        (stored,) = await api.app[STORE].list_clusters()
        assert stored.spec.slurm.rest_token
        assert TOKEN not in stored.spec.slurm.rest_token


async def test_a_slurmrestd_offering_no_version_greenfed_speaks_is_shown_unreachable(
    api: Api,
) -> None:
    async with slurmrestd(("v0.0.39", "v0.0.40")) as (_, url):
        response = await api.client.post(
            "/v1/clusters", json=registration(url), headers=bearer(api.admin_token)
        )
        assert response.status == 201, await response.text()
        shown: dict[str, Any] = {}

        async def refused() -> bool:
            shown.update(await (await api.get(api.admin_token, "/v1/clusters/hpc")).json())
            return "v0.0.39, v0.0.40" in shown.get("last_error", "")

        await eventually_async(refused, timeout_s=30, message=lambda: f"cluster: {shown}")
        assert shown["reachable"] is False
        assert "greenfed speaks" in shown["last_error"]
        assert api.app[CLUSTERS].bridge("hpc") is not None


@pytest.mark.parametrize(
    ("slurm", "field"),
    [
        ({"ssh": "login1"}, "slurm.rest_url"),
        ({"slurm_conf": "/etc/slurm/slurm.conf"}, "slurm.rest_url"),
        ({"rest_url": ""}, "slurm.rest_token"),
        ({"rest_url": "ftp://login1"}, "slurm.rest_url"),
    ],
)
async def test_a_registration_reaches_a_cluster_one_way(
    api: Api, slurm: dict[str, Any], field: str
) -> None:
    response = await api.client.post(
        "/v1/clusters",
        json=registration("http://127.0.0.1:6820", **slurm),
        headers=bearer(api.admin_token),
    )
    body = await problem(response, 422)
    assert body["invalid_params"][0]["name"] == f"$.{field}", body
