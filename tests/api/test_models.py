"""`/v1/models`: ONNX uploads checked with onnx.checker, described, stored by content,
downloadable with Range; bad files refused with the reason; tenants kept apart."""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import onnx
import pytest

from shared.settings import CloudSettings
from tests.api.support import PROBLEM, Api, bearer, deployment_spec, problem, running_api
from tests.store.databases import DatabaseUnderTest
from tests.support.onnx_models import broken_graph, mlp

OCTETS = {"Content-Type": "application/octet-stream"}


async def upload(api: Api, token: str, body: bytes, name: str = "mlp") -> dict[str, object]:
    response = await api.client.post(
        f"/v1/models?name={name}", data=body, headers=bearer(token) | OCTETS
    )
    assert response.status == 201, await response.text()
    assert response.headers["Location"].startswith("/v1/models/")
    created = await response.json()
    assert isinstance(created, dict)
    return created


async def test_an_uploaded_model_is_described_stored_by_content_and_downloadable(
    api: Api,
) -> None:
    token = await api.tenant("vision")
    body = mlp()
    model = await upload(api, token, body)
    assert model["sha256"] == hashlib.sha256(body).hexdigest()
    assert model["size_bytes"] == len(body)
    assert model["opset"] == 17
    assert model["inputs"] == [{"name": "x", "dtype": "float32", "shape": ["batch", 4]}]
    assert model["outputs"] == [{"name": "y", "dtype": "float32", "shape": ["batch", 3]}]

    fixed = await upload(api, token, mlp(dynamic_batch=False), name="mlp-fixed")
    assert fixed["inputs"] == [{"name": "x", "dtype": "float32", "shape": [1, 4]}]

    shown = await (await api.get(token, f"/v1/models/{model['id']}")).json()
    assert shown == model
    listed = await (await api.get(token, "/v1/models")).json()
    assert [item["id"] for item in listed["items"]] == [fixed["id"], model["id"]]

    blob = await api.get(token, str(model["blob_url"]))
    assert blob.status == 200
    assert await blob.read() == body
    assert blob.headers["X-Greenfed-SHA256"] == model["sha256"]
    part = await api.client.get(
        str(model["blob_url"]), headers=bearer(token) | {"Range": "bytes=10-29"}
    )
    assert part.status == 206
    assert await part.read() == body[10:30]
    # The same bytes again: a second model, one stored file.
    again = await upload(api, token, body, name="mlp-again")
    assert again["id"] != model["id"]
    assert again["sha256"] == model["sha256"]
    data_dir = api.database.settings.resolved_data_dir()
    stored = list((data_dir / "models" / "sha256").rglob("*.onnx"))
    assert len(stored) == 2
    assert (
        data_dir / "models" / "sha256" / body_prefix(model) / f"{model['sha256']}.onnx"
    ) in stored


def body_prefix(model: dict[str, object]) -> str:
    return str(model["sha256"])[:2]


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"this is not a model at all", "not an ONNX model"),
        (broken_graph(), "the ONNX checker rejected it"),
        (b"", "the body is empty"),
    ],
)
async def test_a_file_that_is_not_a_valid_model_is_refused_with_the_reason(
    api: Api, body: bytes, reason: str
) -> None:
    token = await api.tenant("vision")
    response = await api.client.post(
        "/v1/models?name=bad", data=body, headers=bearer(token) | OCTETS
    )
    refused = await problem(response, 422)
    assert refused["type"].endswith("/invalid-model")
    assert reason in refused["detail"]
    assert (await (await api.get(token, "/v1/models")).json())["items"] == []
    staging = api.database.settings.resolved_data_dir() / "models" / "staging"
    assert not any(staging.iterdir())


async def test_uploads_need_a_name_the_octet_stream_type_and_stay_with_their_tenant(
    api: Api,
) -> None:
    vision = await api.tenant("vision")
    other = await api.tenant("other")
    await problem(
        await api.client.post("/v1/models", data=mlp(), headers=bearer(vision) | OCTETS), 400
    )
    await problem(
        await api.client.post(
            "/v1/models?name=m", data=mlp(), headers=bearer(vision) | {"Content-Type": "text/plain"}
        ),
        415,
    )
    model = await upload(api, vision, mlp())
    for path in (f"/v1/models/{model['id']}", f"/v1/models/{model['id']}/blob"):
        await problem(await api.get(other, path), 404)
    assert (await (await api.get(other, "/v1/models")).json())["count"] == 0


@pytest.fixture
async def small_api(database: DatabaseUnderTest) -> AsyncIterator[Api]:
    async with running_api(database, cloud=CloudSettings(max_model_bytes=1000)) as running:
        yield running


async def test_a_model_over_the_size_limit_is_refused_whether_or_not_its_length_is_announced(
    small_api: Api,
) -> None:
    token = await small_api.tenant("vision")
    body = mlp() + b"\0" * 1000
    announced = await small_api.client.post(
        "/v1/models?name=big", data=body, headers=bearer(token) | OCTETS
    )
    assert (await problem(announced, 413))["detail"].endswith("(cloud.max_model_bytes)")

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(body), 256):
            yield body[start : start + 256]

    streamed = await small_api.client.post(
        "/v1/models?name=big", data=chunks(), headers=bearer(token) | OCTETS
    )
    assert streamed.status == 413
    assert streamed.content_type == PROBLEM
    onnx.checker.check_model(onnx.load_from_string(mlp()))  # the payload itself was fine


async def test_a_spec_never_sets_a_canary_so_another_tenants_model_stays_out(api: Api) -> None:
    # `canary` is greenfed's record of a rollout, made by a model update whose model is
    # checked to be the tenant's. Sent in a spec, another tenant's model id rode in it
    # (then "promote" made it the deployment's model), with no check of its size either.
    acme = await api.tenant("acme")
    mallory = await api.tenant("mallory")
    acme_model = await api.model(acme)
    own_model = await api.model(mallory)
    spec = deployment_spec(
        own_model, allow_unschedulable=True, canary={"model_id": acme_model, "replicas": 5}
    )
    for method, path in (
        ("POST", "/v1/deployments"),
        ("PUT", "/v1/deployments/detector"),
        ("POST", "/v1/deployments/dry-run"),
    ):
        response = await api.client.request(method, path, json=spec, headers=bearer(mallory))
        body = await problem(response, 422)
        assert body["invalid_params"][0]["name"] == "$.canary", (method, path)
    listed = await api.get(mallory, "/v1/deployments")
    assert (await listed.json())["items"] == []


class BlockedChecks:
    """Holds every model check (the checker call in it) until released, counting those
    under way, as a slow check of a large model would."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.loop = asyncio.get_running_loop()
        self.released = threading.Event()
        self.changed = asyncio.Event()  # set on each check started or upload answered
        self.entered = 0
        self.most_at_once = 0
        self._running = 0
        self._lock = threading.Lock()
        real_check = onnx.checker.check_model

        def blocked_check(*args: Any, **kwargs: Any) -> None:
            with self._lock:
                self._running += 1
                self.most_at_once = max(self.most_at_once, self._running)
            self.loop.call_soon_threadsafe(self._entered)
            self.released.wait(30)
            with self._lock:
                self._running -= 1
            real_check(*args, **kwargs)

        monkeypatch.setattr(onnx.checker, "check_model", blocked_check)

    def _entered(self) -> None:
        self.entered += 1
        self.changed.set()

    async def until(self, condition: Any) -> None:
        async with asyncio.timeout(20):
            while not condition():
                self.changed.clear()
                await self.changed.wait()


@pytest.fixture
async def blocked_checks(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[BlockedChecks]:
    checks = BlockedChecks(monkeypatch)
    yield checks
    checks.released.set()


async def test_uploads_being_checked_never_hold_the_threads_scheduling_passes_run_on(
    api: Api, blocked_checks: BlockedChecks
) -> None:
    """A scheduling pass runs on asyncio's default pool: uploads, however many and
    however slow their checks, leave it free (checks have a small pool of their own),
    and those past the bound are refused at once with Retry-After."""
    default_pool_threads = min(32, (os.cpu_count() or 1) + 4)  # asyncio's own choice
    tokens = [await api.tenant(f"tenant-{index}") for index in range(default_pool_threads)]
    uploads = [
        asyncio.create_task(
            api.client.post("/v1/models?name=m", data=mlp(), headers=bearer(token) | OCTETS)
        )
        for token in tokens
    ]
    for upload_task in uploads:
        upload_task.add_done_callback(lambda _: blocked_checks.changed.set())
    try:
        # Every upload's check holds a default-pool thread (as before), or two checks run
        # and the uploads past the bound of four are answered.
        def settled() -> bool:
            answered = sum(task.done() for task in uploads)
            return blocked_checks.entered == default_pool_threads or (
                blocked_checks.entered >= 2 and answered >= default_pool_threads - 4
            )

        await blocked_checks.until(settled)
        async with asyncio.timeout(5):
            await asyncio.to_thread(lambda: None)  # what a scheduling pass does
    finally:
        blocked_checks.released.set()
        answers: list[aiohttp.ClientResponse] = await asyncio.gather(*uploads)
    statuses = sorted(answer.status for answer in answers)
    assert statuses == [201] * 4 + [503] * (default_pool_threads - 4)
    refused = next(answer for answer in answers if answer.status == 503)
    assert refused.headers["Retry-After"] == "10"
    assert (await refused.json())["type"].endswith("/too-many-uploads")
    assert blocked_checks.most_at_once <= 2
    staging = api.database.settings.resolved_data_dir() / "models" / "staging"
    assert not any(staging.iterdir())


async def test_a_tenant_with_its_share_of_uploads_in_progress_is_told_to_retry(
    api: Api, blocked_checks: BlockedChecks
) -> None:
    vision, other = await api.tenant("vision"), await api.tenant("other")

    def post(token: str) -> Any:
        return api.client.post("/v1/models?name=m", data=mlp(), headers=bearer(token) | OCTETS)

    first_two = [asyncio.create_task(post(vision)) for _ in range(2)]
    try:
        await blocked_checks.until(lambda: blocked_checks.entered == 2)
        async with asyncio.timeout(10):
            third = await post(vision)
        refused = await problem(third, 429)
        assert refused["type"].endswith("/too-many-uploads")
        assert third.headers["Retry-After"] == "10"
        another_tenants = asyncio.create_task(post(other))  # its own share: waits its turn
    finally:
        blocked_checks.released.set()
    assert [answer.status for answer in await asyncio.gather(*first_two)] == [201, 201]
    assert (await another_tenants).status == 201
