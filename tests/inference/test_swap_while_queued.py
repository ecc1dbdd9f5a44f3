"""A model update swapped in while requests wait in a batcher's queue (runtime.py
swaps as soon as the new model is warm): each request runs on the model it was checked
against, so none fails for the switch, even when the new model takes other shapes or
cannot be batched. docs/inference.md: "No request fails during the switch"."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer

from edge.inference.batching import Batcher
from edge.inference.model_fetch import ModelCache
from edge.inference.runtime import InferenceRuntime, ServedDeployment, ServedReplica
from edge.inference.server import inference_app
from edge.inference.session import LoadedModel, check_feeds
from edge.inference.stats import ServingStats
from shared.messages import DesiredDeployment
from tests.inference.onnx_shapes import identity, total
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(30)

ANSWER_S = 5.0  # bound on any one wait below: a batcher that stopped must not hang a test
ROW = [[1.0, 2.0, 3.0, 4.0]]


def loaded(tmp_path: Path, name: str, body: bytes) -> LoadedModel:
    path = tmp_path / f"{name}.onnx"
    path.write_bytes(body)
    return LoadedModel(path, hashlib.sha256(body).hexdigest(), None)


@contextmanager
def running(batcher: Batcher) -> Iterator[asyncio.Task[None]]:
    task = asyncio.create_task(batcher.run())
    try:
        yield task
    finally:
        task.cancel()


async def test_queued_requests_run_on_the_model_they_were_checked_against(
    tmp_path: Path,
) -> None:
    old = loaded(tmp_path, "old", identity(("batch", 4)))
    new = loaded(tmp_path, "new", identity(("batch", 8)))
    # Not running yet: what is sent stays queued until the swap is done.
    batcher = Batcher(old, ServingStats("d"), max_batch_size=8)
    four, eight = np.ones((1, 4), np.float32), np.ones((1, 8), np.float32)
    before = [
        asyncio.create_task(batcher.infer({"x": four}, check_feeds(old, {"x": four}), model=old))
        for _ in range(2)
    ]
    await eventually(lambda: batcher.queued == 2)
    assert batcher.swap(new) is old
    after = asyncio.create_task(batcher.infer({"x": eight}, check_feeds(new, {"x": eight})))
    await eventually(lambda: batcher.queued == 3)
    with running(batcher):
        answers = await asyncio.wait_for(asyncio.gather(*before, after), ANSWER_S)
    assert [used for used, _ in answers] == [old, old, new]
    np.testing.assert_array_equal(answers[0][1][0], four)
    np.testing.assert_array_equal(answers[2][1][0], eight)
    # The two checked against the old model shared its run; the new one ran alone.
    assert dict(batcher.stats.batches_by_size) == {2: 1, 1: 1}


@pytest.mark.parametrize(
    "new_body",
    [identity(("batch", 8)), total()],
    ids=["new-model-takes-other-shapes", "new-model-not-batchable"],
)
async def test_requests_the_endpoint_accepted_before_a_swap_are_answered(
    tmp_path: Path, new_body: bytes
) -> None:
    old = loaded(tmp_path, "old", identity(("batch", 4)))
    new = loaded(tmp_path, "new", new_body)
    runtime = InferenceRuntime(
        (),
        ModelCache(tmp_path / "cache", max_bytes=10**6),
        on_change=lambda: None,
        endpoint_base=lambda: None,
    )
    serving = ServedReplica(DesiredDeployment(deployment_id="d"), ServingStats("d"), state="ready")
    # Not running yet: the accepted requests wait in its queue while the model changes.
    batcher = serving.batcher = Batcher(old, serving.stats, max_batch_size=8)
    # What InferenceRuntime._load leaves once a model is ready, without a download.
    runtime._deployments["d"] = ServedDeployment(serving.stats, {0: serving})
    async with TestClient(TestServer(inference_app(runtime))) as client:

        async def answer() -> tuple[int, dict[str, object]]:
            response = await client.post("/v1/infer/d", json={"inputs": {"x": ROW}})
            return response.status, await response.json(content_type=None)

        sent = [asyncio.create_task(answer()) for _ in range(2)]
        await eventually(lambda: batcher.queued == 2)
        batcher.swap(new)  # what InferenceRuntime._load does once the new model is warm
        with running(batcher):
            answers = await asyncio.wait_for(asyncio.gather(*sent), ANSWER_S)
    for status, body in answers:
        assert status == 200, body
        assert body["model_sha256"] == old.sha256
        assert body["outputs"] == {"y": ROW}
