"""The agent's inference endpoint (edge/inference/server.py) answers bodies it cannot
use with a 400 that says why, never a 500 and never an allocation larger than the body:
numbers that do not fit the input's dtype, values that are not numbers, JSON nested
deeper than a decoder goes, .npy headers cut short or that declare more data than they
carry, zip archives, requests without rows."""

from __future__ import annotations

import asyncio
import hashlib
import io
import zipfile
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from onnx import TensorProto

from edge.inference.batching import Batcher
from edge.inference.model_fetch import ModelCache
from edge.inference.runtime import InferenceRuntime, ServedDeployment, ServedReplica
from edge.inference.server import inference_app, write_npy
from edge.inference.session import LoadedModel
from edge.inference.stats import ServingStats
from shared.messages import DesiredDeployment
from tests.inference.onnx_shapes import identity

pytestmark = pytest.mark.timeout(30)

Client = TestClient[web.Request, web.Application]
JSON = {"Content-Type": "application/json"}
NPY = {"Content-Type": "application/x-npy"}
# Identity models x[batch, 4] -> y, served under these deployment ids.
DTYPES = {
    "f32": TensorProto.FLOAT,
    "i64": TensorProto.INT64,
    "u8": TensorProto.UINT8,
    "bool": TensorProto.BOOL,
}


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[Client]:
    """The endpoint of an agent serving the DTYPES deployments, ready and batching."""
    runtime = InferenceRuntime(
        (),
        ModelCache(tmp_path / "cache", max_bytes=10**6),
        on_change=lambda: None,
        endpoint_base=lambda: None,
    )
    runners = []
    for deployment_id, dtype in DTYPES.items():
        body = identity(dtype=dtype)
        path = tmp_path / f"{deployment_id}.onnx"
        path.write_bytes(body)
        model = LoadedModel(path, hashlib.sha256(body).hexdigest(), None)
        serving = ServedReplica(
            DesiredDeployment(deployment_id=deployment_id),
            ServingStats(deployment_id),
            state="ready",
        )
        serving.batcher = Batcher(model, serving.stats, max_batch_size=8)
        runners.append(asyncio.create_task(serving.batcher.run()))
        # What InferenceRuntime._load leaves once a model is ready, without a download.
        runtime._deployments[deployment_id] = ServedDeployment(serving.stats, {0: serving})
    try:
        async with TestClient(TestServer(inference_app(runtime))) as test_client:
            yield test_client
    finally:
        for runner in runners:
            runner.cancel()
        await asyncio.gather(*runners, return_exceptions=True)


async def refused(client: Client, deployment_id: str, body: bytes, headers: dict[str, str]) -> str:
    """The 400's detail."""
    answer = await client.post(f"/v1/infer/{deployment_id}", data=body, headers=headers)
    text = await answer.text()
    assert answer.status == 400, text
    detail: str = (await answer.json(content_type=None))["detail"]
    return detail


def npy_header(descr: str, shape: str, *, keys_in_numpy_order: bool = True) -> bytes:
    """A format 1.0 .npy header declaring `shape` (Python syntax), with no data after it.
    Keys in another order than numpy writes take the endpoint's slower path (numpy's own
    header reader)."""
    if keys_in_numpy_order:
        header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}"
    else:
        header = f"{{'shape': {shape}, 'fortran_order': False, 'descr': '{descr}', }}"
    header += " " * (64 - (10 + len(header) + 1) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode("latin1")


@pytest.mark.parametrize(
    ("deployment_id", "number", "words"),
    [
        ("i64", "100000000000000000000", "a number does not fit int64"),
        ("u8", "-1", "a number does not fit uint8"),
        ("u8", "300", "a number does not fit uint8"),
        ("f32", "1" + "0" * 47, "a number does not fit float32"),  # infinity once cast
        ("f32", "1" + "0" * 400, "a number does not fit float32"),  # beyond any float
    ],
    ids=["beyond-int64", "negative-uint8", "300-uint8", "1e47-float32", "1e400-float32"],
)
async def test_json_numbers_that_do_not_fit_the_inputs_dtype_are_refused(
    client: Client, deployment_id: str, number: str, words: str
) -> None:
    body = b'{"inputs": {"x": [[1, 2, 3, ' + number.encode() + b"]]}}"
    assert words in await refused(client, deployment_id, body, JSON)


@pytest.mark.parametrize(
    ("deployment_id", "values", "words"),
    [
        # Each was silently converted: null to NaN, "1" to 1.0, 1.5 to 1, 255.9 to 255.
        ("f32", "null, null, null, null", "float32 takes numbers, not nulls"),
        ("f32", '"1", "2", "3", "nan"', "float32 takes numbers, not strings"),
        ("f32", "true, false, true, false", "float32 takes numbers, not booleans"),
        ("i64", "1.5, 2.9, -0.5, 3", "a number does not fit int64"),
        ("u8", "255.9, 0.5, 1, 1", "a number does not fit uint8"),
        ("i64", "9223372036854775808, 1, 2, 3", "a number does not fit int64"),  # 2**63
        ("bool", "1, 0, 1, 0", "bool takes true or false, not numbers"),
    ],
    ids=[
        "null-float32",
        "strings-float32",
        "booleans-float32",
        "fraction-int64",
        "fraction-uint8",
        "2**63-int64",
        "numbers-bool",
    ],
)
async def test_json_values_the_inputs_dtype_cannot_hold_are_refused(
    client: Client, deployment_id: str, values: str, words: str
) -> None:
    body = b'{"inputs": {"x": [[' + values.encode() + b"]]}}"
    assert words in await refused(client, deployment_id, body, JSON)


@pytest.mark.parametrize(
    ("deployment_id", "values"),
    [
        ("f32", [[1, 0.5, -2.25, 2**100]]),  # 2**100: beyond int64, a float32
        ("i64", [[1, 2.0, -3, 4]]),
        ("i64", [[-(2**63), 2**63 - 1, 2**53 + 1, 0]]),  # exactly, not through a float
        ("u8", [[0, 255, 1.0, 7]]),
        ("bool", [[True, False, True, False]]),
    ],
    ids=["float32", "whole-floats-int64", "int64-extremes", "uint8", "bool"],
)
async def test_json_values_the_inputs_dtype_holds_are_served_exactly(
    client: Client, deployment_id: str, values: list[list[object]]
) -> None:
    answer = await client.post(f"/v1/infer/{deployment_id}", json={"inputs": {"x": values}})
    assert answer.status == 200, await answer.text()
    assert (await answer.json())["outputs"]["y"] == values


@pytest.mark.parametrize(
    ("depth", "words"),
    [
        (3000, "the body is not a JSON object"),  # past the decoder's recursion limit
        (100, "not a rectangular array of numbers"),  # past numpy's 64 dimensions
    ],
)
async def test_json_nested_too_deeply_is_refused(client: Client, depth: int, words: str) -> None:
    body = b'{"inputs": {"x": ' + b"[" * depth + b"1" + b"]" * depth + b"}}"
    assert words in await refused(client, "f32", body, JSON)


def npz_archive() -> bytes:
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as members:
        members.writestr("x.npy", write_npy(np.ones((1, 4), np.float32)))
    return archive.getvalue()


@pytest.mark.parametrize(
    ("body", "words"),
    [
        # A dimension beyond int64: np.prod overflowed.
        (npy_header("<f4", "(99999999999999999999, 4)"), "its data has 0"),
        # 2**62 * 4 rows of 4 bytes: 2**64 wraps to 0 in int64, which "matched" no data.
        (npy_header("<f4", "(4611686018427387904, 4)"), "its data has 0"),
        # 14.6 TiB declared in a header numpy's reader parses: numpy allocated it.
        (npy_header("<f4", "(1000000000000, 4)", keys_in_numpy_order=False), "its data has 0"),
        (npy_header("<f4", "(0, 99999999999999999999)"), "not a .npy array"),
        (npz_archive(), "does not start with the .npy magic"),
        # A request without rows would take another request's rows in a shared run.
        (write_npy(np.zeros((0, 4), np.float32)), "x: shape [0, 4] has no rows"),
    ],
    ids=[
        "dimension-beyond-int64",
        "count-wraps-to-0",
        "huge-slow-path",
        "zero-rows-huge-dim",
        "npz",
        "zero-rows",
    ],
)
async def test_npy_bodies_that_declare_what_they_do_not_carry_are_refused(
    client: Client, body: bytes, words: str
) -> None:
    assert words in await refused(client, "f32", body, NPY)


def npy_bytes(header: str, *, version: int = 1) -> bytes:
    """A .npy body with `header` as it is (no padding, no data): format 1.0 or 2.0."""
    length = len(header).to_bytes(2 if version == 1 else 4, "little")
    return b"\x93NUMPY" + bytes([version, 0]) + length + header.encode("latin1")


@pytest.mark.parametrize(
    "body",
    [
        npy_bytes("{'descr': '<f4', 'fortran_order': False,\n"),
        npy_bytes("{'descr': '<f4', 'shape': (2,\n", version=2),
    ],
    ids=["v1-cut-short", "v2-cut-short"],
)
async def test_npy_headers_cut_short_are_refused(client: Client, body: bytes) -> None:
    """numpy's header reader raised its tokenizer's error for these: a 500."""
    assert "the body is not a .npy array" in await refused(client, "f32", body, NPY)


async def test_a_big_endian_npy_body_of_the_inputs_type_is_served(client: Client) -> None:
    x = np.arange(8, dtype=">f4").reshape(2, 4)
    answer = await client.post("/v1/infer/f32", data=write_npy(x), headers=NPY)
    assert answer.status == 200, await answer.text()
    assert (await answer.json())["outputs"]["y"] == x.tolist()


async def test_npy_bodies_numpy_writes_in_other_layouts_are_still_served(client: Client) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    for version in ((2, 0), (3, 0)):
        written = io.BytesIO()
        np.lib.format.write_array(written, x, version=version)
        answer = await client.post("/v1/infer/f32", data=written.getvalue(), headers=NPY)
        assert answer.status == 200, await answer.text()
        assert (await answer.json())["outputs"]["y"] == x.tolist()
    reordered = npy_header("<f4", "(2, 4)", keys_in_numpy_order=False) + x.tobytes()
    answer = await client.post("/v1/infer/f32", data=reordered, headers=NPY)
    assert answer.status == 200, await answer.text()
    assert (await answer.json())["outputs"]["y"] == x.tolist()
