"""What the agent's inference endpoint (edge/inference/server.py) promises in
docs/inference.md, for the cases review 6 found it broke: JSON true and false among
numbers are refused (not read as 1 and 0), a model whose output has no `.npy` form
answers `406` to a client asking for `.npy` (not the agent's heap pointers), and a
withdrawn deployment answers `503` with `Retry-After: 1` while its accepted requests
are answered, `404` only after. Real ONNX Runtime sessions behind the real endpoint."""

from __future__ import annotations

import asyncio
import hashlib
import io
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from onnx import TensorProto, helper

from edge.inference.batching import Batcher
from edge.inference.model_fetch import ModelCache
from edge.inference.runtime import InferenceRuntime, ServedDeployment, ServedReplica
from edge.inference.server import inference_app
from edge.inference.session import LoadedModel
from edge.inference.stats import ServingStats
from shared.messages import DesiredDeployment
from tests.inference.onnx_shapes import identity
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(30)

Client = TestClient[web.Request, web.Application]
ANSWER_S = 5.0  # bound on any one wait below
NPY = "application/x-npy"


def strings_out() -> bytes:
    """x: float32[batch, 2] -> y: string[batch, 2] (each number as text): the registry's
    check accepts it, and ONNX Runtime answers an array of Python strings."""
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.STRING)],
        "strings",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2])],
        [helper.make_tensor_value_info("y", TensorProto.STRING, ["batch", 2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def served(tmp_path: Path, deployment_id: str, body: bytes) -> tuple[ServedReplica, Batcher]:
    """A ready replica of `body`, as InferenceRuntime._load leaves it, and its batcher,
    not yet running (the caller runs it)."""
    path = tmp_path / f"{deployment_id}.onnx"
    path.write_bytes(body)
    model = LoadedModel(path, hashlib.sha256(body).hexdigest(), None)
    replica = ServedReplica(
        DesiredDeployment(deployment_id=deployment_id), ServingStats(deployment_id), state="ready"
    )
    replica.batcher = Batcher(model, replica.stats, max_batch_size=8)
    return replica, replica.batcher


@contextmanager
def running(batcher: Batcher) -> Iterator[None]:
    task = asyncio.create_task(batcher.run())
    try:
        yield
    finally:
        task.cancel()


@asynccontextmanager
async def endpoint(
    tmp_path: Path, replicas: dict[str, ServedReplica]
) -> AsyncIterator[tuple[InferenceRuntime, Client]]:
    """The endpoint of an agent whose runtime serves `replicas` (by deployment id), the
    runtime's tasks (drains) in a task group of their own."""
    async with asyncio.TaskGroup() as tasks:
        runtime = InferenceRuntime(
            (),
            ModelCache(tmp_path / "cache", max_bytes=10**6),
            on_change=lambda: None,
            endpoint_base=lambda: None,
        )
        runtime.bind(tasks)
        for deployment_id, replica in replicas.items():
            runtime._deployments[deployment_id] = ServedDeployment(replica.stats, {0: replica})
        try:
            async with TestClient(TestServer(inference_app(runtime))) as client:
                yield runtime, client
        finally:
            await runtime.close()


# ---- true and false among numbers ------------------------------------------------------


@pytest.mark.parametrize(
    ("dtype", "values"),
    [
        (TensorProto.FLOAT, "1, true, 0.5, false"),
        (TensorProto.FLOAT, "true, 2.5, 0, 0"),
        (TensorProto.INT64, "1, true, 0, 0"),
        (TensorProto.UINT8, "1, false, 0, 0"),
    ],
    ids=["among-floats", "first-float32", "int64", "uint8"],
)
async def test_json_true_or_false_among_numbers_is_refused(
    tmp_path: Path, dtype: int, values: str
) -> None:
    """docs/inference.md: a JSON value that is not a number (`true`) gets a 400; numpy
    alone reads it as 1 among numbers, and the model would run on it."""
    replica, batcher = served(tmp_path, "d", identity(dtype=dtype))
    async with endpoint(tmp_path, {"d": replica}) as (_, client):
        body = b'{"inputs": {"x": [[' + values.encode() + b"]]}}"
        with running(batcher):
            answer = await client.post(
                "/v1/infer/d", data=body, headers={"Content-Type": "application/json"}
            )
            text = await answer.text()
    assert answer.status == 400, text
    assert "takes numbers, not true or false" in (await answer.json(content_type=None))["detail"]
    assert replica.stats.requests_total == 0  # the model never ran it


async def test_a_bool_input_still_takes_true_and_false_and_numbers_their_names(
    tmp_path: Path,
) -> None:
    """The word true inside a name does not refuse numbers, and a bool input is served."""
    numbers, numbers_batcher = served(tmp_path, "f32", identity())
    flags, flags_batcher = served(tmp_path, "bool", identity(dtype=TensorProto.BOOL))
    async with endpoint(tmp_path, {"f32": numbers, "bool": flags}) as (_, client):
        with running(numbers_batcher), running(flags_batcher):
            answer = await client.post(
                "/v1/infer/bool", json={"inputs": {"x": [[True, False, True, False]]}}
            )
            assert answer.status == 200, await answer.text()
            assert (await answer.json())["outputs"]["y"] == [[True, False, True, False]]
            # "true" in the body, not among the numbers: served as numbers.
            answer = await client.post(
                "/v1/infer/f32", json={"inputs": {"x": [[1, 2, 3, 4]]}, "note": "true story"}
            )
            assert answer.status == 200, await answer.text()
            assert (await answer.json())["outputs"]["y"] == [[1.0, 2.0, 3.0, 4.0]]


# ---- outputs without a .npy form -------------------------------------------------------


async def test_npy_is_refused_with_406_for_an_output_of_strings_and_json_still_answers(
    tmp_path: Path,
) -> None:
    """A `.npy` of an object array would carry the agent's heap pointers, which no client
    can load (and which say where the agent's memory is)."""
    replica, batcher = served(tmp_path, "text", strings_out())
    x = {"inputs": {"x": [[0.25, 0.75]]}}
    async with endpoint(tmp_path, {"text": replica}) as (_, client):
        with running(batcher):
            answer = await asyncio.wait_for(
                client.post("/v1/infer/text", json=x, headers={"Accept": NPY}), ANSWER_S
            )
            assert answer.status == 406, await answer.text()
            assert answer.content_type == "application/problem+json"
            problem = await answer.json(content_type=None)
            assert "output y is not an array of numbers" in problem["detail"]
            assert "Accept: application/json" in problem["detail"]

            both = {"Accept": f"{NPY}, application/json;q=0.5"}
            answer = await client.post("/v1/infer/text", json=x, headers=both)
            assert answer.status == 200, await answer.text()
            assert answer.content_type == "application/json"
            assert (await answer.json())["outputs"]["y"] == [["0.25", "0.75"]]

            answer = await client.post("/v1/infer/text", json=x)
            assert answer.status == 200, await answer.text()
            assert (await answer.json())["outputs"]["y"] == [["0.25", "0.75"]]


async def test_npy_answers_an_output_of_numbers_as_before(tmp_path: Path) -> None:
    replica, batcher = served(tmp_path, "f32", identity())
    async with endpoint(tmp_path, {"f32": replica}) as (_, client):
        with running(batcher):
            answer = await client.post(
                "/v1/infer/f32", json={"inputs": {"x": [[1, 2, 3, 4]]}}, headers={"Accept": NPY}
            )
            assert answer.status == 200, await answer.text()
            y = np.load(io.BytesIO(await answer.read()), allow_pickle=False)
    np.testing.assert_array_equal(y, np.array([[1, 2, 3, 4]], np.float32))


# ---- a withdrawn deployment ------------------------------------------------------------


async def test_a_withdrawn_deployment_answers_503_until_its_accepted_requests_are_answered(
    tmp_path: Path,
) -> None:
    """docs/inference.md: a deployment being removed answers `503` with `Retry-After: 1`
    (a client tries again, maybe elsewhere); once dropped, `404`."""
    replica, batcher = served(tmp_path, "d", identity())
    row = {"inputs": {"x": [[1.0, 2.0, 3.0, 4.0]]}}
    async with endpoint(tmp_path, {"d": replica}) as (runtime, client):
        # Its batcher is not running: the accepted request waits in its queue.
        accepted = asyncio.create_task(client.post("/v1/infer/d", json=row))
        await eventually(lambda: batcher.queued == 1, timeout_s=ANSWER_S)
        runtime.apply([])  # withdrawn by the control plane

        answer = await client.post("/v1/infer/d", json=row)
        assert answer.status == 503, await answer.text()
        assert answer.headers["Retry-After"] == "1"
        assert "being removed" in (await answer.json(content_type=None))["detail"]
        assert runtime.being_removed("d")

        with running(batcher):  # the accepted request is answered, then the drain ends
            first = await asyncio.wait_for(accepted, ANSWER_S)
            assert first.status == 200, await first.text()
            await eventually(lambda: not runtime.being_removed("d"), timeout_s=ANSWER_S)
        answer = await client.post("/v1/infer/d", json=row)
        assert answer.status == 404, await answer.text()
        assert "Retry-After" not in answer.headers
