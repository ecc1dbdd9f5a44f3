"""What review 8 found the agent's inference endpoint (edge/inference/server.py) and its
batcher getting wrong, with real ONNX Runtime sessions behind the real endpoint:

- one client's values the model refuses (a token id beyond an embedding table) failed
  every request stacked with it, with 500s counted as the model's errors (which abort a
  canary's rollout): now only that request fails, with a 400 not counted as an error;
- request bodies were read whole before any bound: now bodies held at once are bounded
  in bytes (`BODY_BUDGET_BYTES`), past which a request is answered 429 before its body
  is read;
- a large JSON body was decoded and checked on the event loop, and a large answer
  encoded there: now in a thread;
- a request whose replica was withdrawn while its body was read was answered 503 though
  a sibling replica was ready: now the sibling answers it.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from onnx import TensorProto, helper, numpy_helper

from edge.inference import server
from edge.inference.batching import Batcher
from edge.inference.model_fetch import ModelCache
from edge.inference.runtime import InferenceRuntime, ServedDeployment, ServedReplica
from edge.inference.server import MAX_REQUEST_BYTES, inference_app
from edge.inference.session import LoadedModel, check_feeds
from edge.inference.stats import ServingStats
from shared.messages import DesiredDeployment
from tests.inference.onnx_shapes import identity
from tests.support.onnx_models import failing_at_run
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(30)

Client = TestClient[web.Request, web.Application]
ANSWER_S = 5.0  # bound on any one wait below
NPY = "application/x-npy"
TABLE_ROWS = 10


def embedding() -> bytes:
    """ids: int64[batch, 4] -> y: float32[batch, 4, 3], the rows of a 10-row table: an
    id beyond it is ONNX Runtime's INVALID_ARGUMENT, for the whole run."""
    table = numpy_helper.from_array(
        np.arange(TABLE_ROWS * 3, dtype=np.float32).reshape(TABLE_ROWS, 3), "table"
    )
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["y"])],
        "embedding",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, 3])],
        initializer=[table],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def served(
    tmp_path: Path, name: str, body: bytes, *, max_batch_size: int = 8, delay_s: float = 0.0
) -> ServedReplica:
    """A ready replica of `body`, as InferenceRuntime._load leaves it, its batcher not yet
    running (see `running`)."""
    path = tmp_path / f"{name}.onnx"
    path.write_bytes(body)
    model = LoadedModel(path, hashlib.sha256(body).hexdigest(), None)
    model.warm_up()
    replica = ServedReplica(DesiredDeployment(deployment_id="d"), ServingStats("d"), state="ready")
    replica.batcher = Batcher(
        model, replica.stats, max_batch_size=max_batch_size, max_queue_delay_s=delay_s
    )
    return replica


@contextmanager
def running(*replicas: ServedReplica) -> Iterator[None]:
    tasks = [asyncio.create_task(r.batcher.run()) for r in replicas if r.batcher is not None]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()


@asynccontextmanager
async def endpoint(
    tmp_path: Path, *replicas: ServedReplica
) -> AsyncIterator[tuple[InferenceRuntime, ServedDeployment, Client]]:
    """The endpoint of an agent serving deployment "d" with `replicas` (numbered in
    order), the runtime's tasks (drains) in a task group of their own."""
    async with asyncio.TaskGroup() as tasks:
        runtime = InferenceRuntime(
            (),
            ModelCache(tmp_path / "cache", max_bytes=10**6),
            on_change=lambda: None,
            endpoint_base=lambda: None,
        )
        runtime.bind(tasks)
        stats = ServingStats("d")
        deployment = ServedDeployment(stats, dict(enumerate(replicas)))
        runtime._deployments["d"] = deployment
        try:
            async with TestClient(TestServer(inference_app(runtime))) as client:
                yield runtime, deployment, client
        finally:
            await runtime.close()


# ---- one client's bad values --------------------------------------------------------------


async def test_a_model_that_refuses_every_input_fails_as_the_models_error(
    tmp_path: Path,
) -> None:
    """The same InvalidArgument from a model none of whose runs has worked (its warm-up
    failed too) is the model's failure: a 500, counted, so a canary of it is rolled back
    (tests/loop/test_rollout.py)."""
    replica = served(tmp_path, "failing", failing_at_run(), max_batch_size=1)
    async with endpoint(tmp_path, replica) as (_, _, client):
        with running(replica):
            answer = await asyncio.wait_for(
                client.post("/v1/infer/d", json={"inputs": {"x": [[1.0, 2.0, 3.0, 4.0]]}}),
                ANSWER_S,
            )
    assert answer.status == 500
    assert replica.stats.errors_total == 1


async def test_a_token_id_beyond_the_table_fails_its_own_request_only_as_a_400(
    tmp_path: Path,
) -> None:
    """Three clients' requests stacked into one run (three rows fill the batch), one
    with id 99 for a 10-row table: the other two are answered, it gets a 400, and no
    request counts as the model's error (the canary error rate a rollout is judged on)."""
    replica = served(tmp_path, "emb", embedding(), max_batch_size=3, delay_s=30)
    async with endpoint(tmp_path, replica) as (_, _, client):

        async def post(ids: list[int]) -> tuple[int, dict[str, object]]:
            answer = await client.post("/v1/infer/d", json={"inputs": {"ids": [ids]}})
            return answer.status, await answer.json(content_type=None)

        with running(replica):
            (a, a_body), (b, b_body), (c, c_body) = await asyncio.wait_for(
                asyncio.gather(post([1, 2, 3, 4]), post([5, 6, 7, 8]), post([1, 2, 3, 99])),
                ANSWER_S,
            )
            replica.batcher.configure(max_batch_size=1, max_queue_delay_s=0.0)  # type: ignore[union-attr]
            alone, alone_body = await asyncio.wait_for(post([99, 0, 0, 0]), ANSWER_S)
    table = np.arange(TABLE_ROWS * 3, dtype=np.float32).reshape(TABLE_ROWS, 3)
    assert (a, b) == (200, 200), (a_body, b_body)
    np.testing.assert_array_equal(a_body["outputs"]["y"], table[[[1, 2, 3, 4]]])  # type: ignore[index]
    np.testing.assert_array_equal(b_body["outputs"]["y"], table[[[5, 6, 7, 8]]])  # type: ignore[index]
    for status, body in ((c, c_body), (alone, alone_body)):
        assert status == 400, body
        assert body["title"] == "Invalid input"
        assert "INVALID_ARGUMENT" in str(body["detail"])
    assert replica.stats.errors_total == 0
    assert replica.stats.requests_total == 2


# ---- bodies held at once -------------------------------------------------------------------


async def test_bodies_past_the_byte_budget_are_refused_before_they_are_read(
    tmp_path: Path,
) -> None:
    """Four uploads of the largest body a request may carry, still being sent, take the
    budget: a fifth is answered 429 at once (its body never read), and once they are gone
    a request is answered again."""
    replica = served(tmp_path, "id", identity())
    async with endpoint(tmp_path, replica) as (_, deployment, client):
        assert client.port is not None
        # BODY_BUDGET_BYTES is four of the largest bodies.
        uploads = [await asyncio.open_connection("127.0.0.1", client.port) for _ in range(4)]
        head = (
            "POST /v1/infer/d HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-npy\r\n"
            f"Content-Length: {MAX_REQUEST_BYTES}\r\n\r\n"
        ).encode()
        try:
            for _, writer in uploads:
                writer.write(head + b"\x93NUMPY")  # and then nothing, for now
                await writer.drain()
            await eventually(lambda: deployment.turns == len(uploads))  # each one handled
            refused = await asyncio.wait_for(
                client.post("/v1/infer/d", data=b"x" * 1024, headers={"Content-Type": NPY}),
                ANSWER_S,
            )
            assert refused.status == 429, await refused.text()
            assert refused.headers["Retry-After"] == "1"
            assert refused.content_type == "application/problem+json"
        finally:
            for _, writer in uploads:
                writer.close()
        budget = client.app[server.BODY_BUDGET]
        await eventually(lambda: budget.in_use_bytes == 0)
        with running(replica):
            answer = await asyncio.wait_for(
                client.post("/v1/infer/d", json={"inputs": {"x": [[1, 2, 3, 4]]}}), ANSWER_S
            )
            assert answer.status == 200, await answer.text()


# ---- large bodies and answers off the event loop ---------------------------------------


async def test_a_large_body_is_checked_and_its_answer_encoded_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A JSON body of a few MiB takes the loop for a noticeable time (a 60 MiB one for
    seconds): it is decoded and checked in a thread, and a large answer written there."""
    replica = served(tmp_path, "wide", identity(("batch", 1024)))
    threads: list[str] = []
    write_npy = server.write_npy

    def recording_check(*args: object) -> int:
        threads.append(f"check on {threading.current_thread().name}")
        return check_feeds(*args)  # type: ignore[arg-type]

    def recording_write(array: np.ndarray) -> bytes:
        threads.append(f"write on {threading.current_thread().name}")
        return write_npy(array)

    monkeypatch.setattr(server, "check_feeds", recording_check)
    monkeypatch.setattr(server, "write_npy", recording_write)
    loop_thread = threading.current_thread().name
    rows = np.full((400, 1024), 0.5, np.float32)  # 1.6 MiB as .npy, more in JSON
    async with endpoint(tmp_path, replica) as (_, _, client):
        with running(replica):
            answer = await asyncio.wait_for(
                client.post(
                    "/v1/infer/d",
                    json={"inputs": {"x": rows.tolist()}},
                    headers={"Accept": NPY},
                ),
                ANSWER_S,
            )
            assert answer.status == 200, await answer.text()
            np.testing.assert_array_equal(server.read_npy(await answer.read()), rows)
    assert threads, "nothing checked or written"
    assert all(not entry.endswith(f" on {loop_thread}") for entry in threads), threads


# ---- a replica withdrawn while the body is read ---------------------------------------------


async def test_a_request_to_a_replica_withdrawn_during_its_upload_is_answered_by_a_sibling(
    tmp_path: Path,
) -> None:
    first, second = served(tmp_path, "a", identity()), served(tmp_path, "b", identity())
    async with endpoint(tmp_path, first, second) as (runtime, deployment, client):
        assert client.port is not None
        deployment.turns = 1  # the next request is replica 1's
        body = b'{"inputs": {"x": [[1, 2, 3, 4]]}}'
        reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
        try:
            writer.write(
                (
                    "POST /v1/infer/d HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                ).encode()
                + body[:10]
            )
            await writer.drain()
            await eventually(lambda: deployment.turns == 2)  # its replica was picked
            with running(first, second):
                runtime._withdraw(deployment.replicas.pop(1))  # as a scale-down does
                await eventually(lambda: not runtime.being_removed("d"))  # drained
                writer.write(body[10:])
                await writer.drain()
                status = await asyncio.wait_for(reader.readline(), ANSWER_S)
                rest = await asyncio.wait_for(reader.read(), ANSWER_S)
        finally:
            writer.close()
    assert status.startswith(b"HTTP/1.1 200"), (status, rest)
    assert b'"y":[[1.0,2.0,3.0,4.0]]' in rest
