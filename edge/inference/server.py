"""The agent's local inference endpoint.

- `POST /v1/infer/{deployment}` with JSON `{"inputs": {"x": [[...], ...]}}` answers
  `{"outputs": {"y": [[...]]}, "model_sha256": ..., "provider": ...}`; with a raw
  `.npy` body (`Content-Type: application/x-npy`, models with one input) and
  `Accept: application/x-npy` it answers the first output as `.npy`, or `406` where
  that output is not an array of numbers (strings, maps, sequences: JSON only).
- Inputs are checked against the model (names, dtypes, shapes): a clear `400`; so are
  values the model refuses when run on them alone (ONNX Runtime's INVALID_ARGUMENT, a
  token id beyond an embedding table), which are not counted as the model's errors.
- Several replicas of a deployment on this node (a canary's beside the current
  model's) answer at its one endpoint, taking turns; `model_sha256` says which model
  answered.
- A full queue (every ready replica's), or request bodies already taking
  `BODY_BUDGET_BYTES`, is `429` with `Retry-After`; a deployment not
  (yet) served here is `404`, one being removed (its accepted requests still being
  answered) `503` with `Retry-After`.
- `GET /metrics` (Prometheus text) and `GET /healthz`.

Errors are `application/problem+json`, like the control plane's.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import math
import re
from collections.abc import Callable, Iterable
from typing import Any, Final, ParamSpec, TypeVar, cast

import msgspec
import numpy as np
from aiohttp import web

from edge.inference.batching import Batcher, InvalidInput, QueueFull, Unavailable
from edge.inference.runtime import InferenceRuntime
from edge.inference.session import LoadedModel, check_feeds
from edge.inference.stats import render_prometheus
from shared.problems import PROBLEM_CONTENT_TYPE, ProblemBody

NPY: Final = "application/x-npy"
MAX_REQUEST_BYTES: Final = 64 * 1024 * 1024
# Request bodies held at once (being read, decoded, queued or run), in bytes at most. The
# queue bound counts requests, not bytes: without this one, a few dozen clients each
# sending a body near MAX_REQUEST_BYTES make the agent hold gigabytes, and an edge
# device (4-8 GiB for the agent, its jobs and every deployment) is killed for memory.
# Four of the largest bodies at once still leaves room for a burst of small ones.
BODY_BUDGET_BYTES: Final = 4 * MAX_REQUEST_BYTES
# A body or answer larger than this is decoded, checked or encoded in a thread: in JSON
# that is a pass over every number, seconds for a body near MAX_REQUEST_BYTES, during
# which the event loop (every deployment, /healthz, the agent's MQTT) would wait. In a
# thread it waits for one step at most (msgspec's decode and numpy's conversions each
# hold the GIL while they run: under a second for such a body).
OFF_LOOP_BYTES: Final = 1024 * 1024
# Replicas tried for one request: the one picked may be withdrawn while the body is read.
_REPLICA_TRIES: Final = 3
_JSON_BODY = msgspec.json.Decoder(dict[str, Any])
_P = ParamSpec("_P")
_T = TypeVar("_T")


class BodyBudget:
    """Bytes of request bodies the endpoint may hold at once: a body takes its share
    (its Content-Length) before it is read, and gives it back once answered."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.in_use_bytes = 0

    def try_take(self, size_bytes: int) -> bool:
        if self.in_use_bytes + size_bytes > self.capacity_bytes:
            return False
        self.in_use_bytes += size_bytes
        return True

    def give_back(self, size_bytes: int) -> None:
        self.in_use_bytes -= size_bytes


RUNTIME = web.AppKey("runtime", InferenceRuntime)
BODY_BUDGET = web.AppKey("body_budget", BodyBudget)


def problem_response(status: int, title: str, detail: str, **headers: str) -> web.Response:
    """A problem+json answer of the endpoint (and of its connections: edge/agent/
    inference_server.py)."""
    body = ProblemBody(type="about:blank", title=title, status=status, detail=detail)
    response = web.Response(
        status=status, body=msgspec.json.encode(body), content_type=PROBLEM_CONTENT_TYPE
    )
    response.headers.update(headers)
    return response


def _feeds_from_json(raw: bytes, model: LoadedModel) -> dict[str, np.ndarray]:
    try:
        document = _JSON_BODY.decode(raw)
    except msgspec.DecodeError as error:
        raise ValueError(f"the body is not a JSON object: {error}") from None
    except RecursionError:  # msgspec's guard against a stack overflow: '[' * 3000
        raise ValueError("the body is not a JSON object: it is nested too deeply") from None
    inputs = document.get("inputs")
    if not isinstance(inputs, dict):
        raise ValueError('the body must be {"inputs": {"<input name>": <nested list>}}')
    dtypes = {spec.name: spec.dtype for spec in model.inputs}
    # Looking for true and false among numbers costs a pass over every value in Python:
    # only where the body has them at all (a string holding the word too, at worst).
    may_hold_booleans = b"true" in raw or b"false" in raw
    return {
        name: _json_array(
            name,
            value,
            dtypes.get(name, np.dtype(np.float32)),
            may_hold_booleans=may_hold_booleans,
        )
        for name, value in inputs.items()
    }


# What a JSON array holds, by the kind of numpy dtype it is read as without a target.
_JSON_KINDS: Final = {
    "b": "booleans",
    "i": "numbers",
    "u": "numbers",
    "f": "numbers",
    "U": "strings",
    "O": "nulls or objects",
}


def _json_array(
    name: str, value: object, dtype: np.dtype[Any], *, may_hold_booleans: bool = True
) -> np.ndarray:
    """One input's decoded JSON as an array of `dtype`, or ValueError: only numbers
    (true and false for a bool input), each one the dtype holds (a float to its
    precision, an integer exactly). numpy's own conversion to `dtype` would take null
    as NaN, "1" as 1.0, true as 1 and truncate 1.5 to 1, silently.
    `may_hold_booleans`: False where the JSON text has no true or false at all."""
    try:
        parsed = np.asarray(value)
    except (ValueError, TypeError) as error:  # ragged, or more than numpy's 64 dimensions
        raise ValueError(f"{name}: not a rectangular array of numbers ({error})") from None
    wanted = "b" if dtype.kind == "b" else "iuf"
    kind = parsed.dtype.kind
    if kind == "O" and wanted != "b" and all(type(item) in (int, float) for item in parsed.flat):
        # An integer beyond 64 bits, which numpy keeps as a Python int (and its fellow
        # numbers with it): numbers still, and the conversion below says whether the
        # dtype holds them.
        kind = "f"
    if kind not in wanted and parsed.size:  # `[]` reads as float64: check_feeds refuses it
        takes = "true or false" if wanted == "b" else "numbers"
        held = _JSON_KINDS.get(parsed.dtype.kind, "other values")
        raise ValueError(f"{name}: {dtype.name} takes {takes}, not {held}")
    if wanted != "b" and may_hold_booleans and _holds_a_boolean(value, parsed.ndim):
        # numpy reads true and false among numbers as 1 and 0, into a number array.
        raise ValueError(f"{name}: {dtype.name} takes numbers, not true or false")
    try:
        # A number beyond a float's range would become infinity, with only a warning.
        with np.errstate(over="raise", invalid="raise"):
            array = parsed.astype(dtype, copy=False)
    except (OverflowError, FloatingPointError) as error:  # 2**64 into int64, 1e39 into float32
        raise ValueError(f"{name}: a number does not fit {dtype.name} ({error})") from None
    if dtype.kind in "iu":
        # Integer casts wrap (-1 into uint8 is 255) and truncate (1.5 is 1) silently.
        changed = array != parsed
        if changed.any():
            number = parsed[changed].flat[0]
            raise ValueError(
                f"{name}: a number does not fit {dtype.name} ({number} is not a {dtype.name} value)"
            )
    return array


def _holds_a_boolean(value: object, ndim: int) -> bool:
    """Whether decoded JSON, nested lists `ndim` deep (numpy read them as a rectangular
    array), holds true or false. Iterated in C (chain, map, set): a loop in Python over a
    body of millions of numbers would hold the event loop for seconds."""
    items: Iterable[object] = (value,)
    for _ in range(ndim):
        # Every level above the numbers is a list: numpy found the array rectangular.
        items = itertools.chain.from_iterable(cast("Iterable[Iterable[object]]", items))
    return bool in set(map(type, items))


def _feeds_from_npy(raw: bytes, model: LoadedModel) -> dict[str, np.ndarray]:
    if len(model.inputs) != 1:
        names = [spec.name for spec in model.inputs]
        raise ValueError(f"a .npy body feeds a model with one input; this one takes {names}")
    return {model.inputs[0].name: read_npy(raw)}


_NPY_MAGIC = b"\x93NUMPY"
_NPY_HEADER = re.compile(
    r"""\{'descr': '(?P<descr>[^']+)', 'fortran_order': (?P<fortran>True|False), """
    r"""'shape': \((?P<shape>[0-9, ]*)\), \}"""
)


def read_npy(raw: bytes) -> np.ndarray:
    """A .npy body as an array, never unpickling, and never allocating more than the body
    holds. The common header (format 1.0, as numpy writes it) is parsed here directly:
    numpy's reader evaluates it as a Python literal, which costs more than the small
    arrays a request carries."""
    if not raw.startswith(_NPY_MAGIC):
        raise ValueError("the body is not a .npy array: it does not start with the .npy magic")
    if raw[6:8] == b"\x01\x00" and len(raw) >= 10:
        header_length = int.from_bytes(raw[8:10], "little")
        header = raw[10 : 10 + header_length].decode("latin1").strip()
        match = _NPY_HEADER.fullmatch(header)
        if match is not None:
            try:
                dtype = np.dtype(match["descr"])
            except (TypeError, ValueError) as error:
                raise ValueError(f"the body is not a .npy array: {error}") from None
            shape = tuple(int(d) for d in match["shape"].replace(" ", "").split(",") if d)
            fortran_order = match["fortran"] == "True"
            return _npy_data(raw, 10 + header_length, dtype, shape, fortran_order)
    # Another header layout or format version (2.0, 3.0): numpy's own header reader,
    # which reads the header only; the data is checked against it before any array.
    stream = io.BytesIO(raw)
    try:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(stream)
        elif version in ((2, 0), (3, 0)):
            # 3.0 differs from 2.0 only by a UTF-8 header, for structured dtypes' field
            # names: no input a model takes has one.
            shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(stream)
        else:
            raise ValueError(f".npy format version {version[0]}.{version[1]} is not read")
    except Exception as error:
        # numpy's reader evaluates the header as a Python literal: hostile text raises
        # whatever its tokenizer or parser raises (tokenize.TokenError for a header cut
        # short), none of which is more than a malformed body.
        why = error.args[0] if error.args and isinstance(error.args[0], str) else error
        raise ValueError(f"the body is not a .npy array: {why}") from None
    return _npy_data(raw, stream.tell(), dtype, shape, fortran_order)


def _npy_data(
    raw: bytes, offset: int, dtype: np.dtype[Any], shape: tuple[int, ...], fortran_order: bool
) -> np.ndarray:
    """The array a .npy header describes, from the body's bytes after the header, in
    this machine's byte order: a big-endian array of an input's type is that input, and
    ONNX Runtime reads native order only."""
    if dtype.hasobject:
        raise ValueError("the body is not a .npy array: object arrays are refused")
    # Python integers: a declared shape cannot overflow into a small count.
    count = math.prod(shape)
    if len(raw) - offset != count * dtype.itemsize:
        raise ValueError(
            f"the body is not a .npy array: its header declares shape {list(shape)} of "
            f"{dtype.name} ({count * dtype.itemsize} bytes), its data has {len(raw) - offset}"
        )
    native = dtype.newbyteorder("=")
    try:
        if count == 0:
            return np.empty(shape, dtype=native)
        array = np.frombuffer(raw, dtype=dtype, count=count, offset=offset)
        array = array.reshape(shape, order="F" if fortran_order else "C")
        return array if dtype.isnative else array.astype(native)
    except (ValueError, TypeError, OverflowError) as error:  # a dimension numpy refuses
        raise ValueError(f"the body is not a .npy array: {error}") from None


def _numbers_only(output: object) -> bool:
    """Whether a model's output has a .npy form without pickling: an array of numbers
    or booleans, not one of Python objects (strings, or a sequence of maps)."""
    return isinstance(output, np.ndarray) and not output.dtype.hasobject


def write_npy(array: np.ndarray) -> bytes:
    """Format 1.0 .npy bytes of a C-contiguous copy of `array` (what np.save writes).
    An array of objects has none (its bytes are pointers): ValueError."""
    if array.dtype.hasobject:
        raise ValueError("an array of Python objects has no .npy form without pickling")
    array = np.ascontiguousarray(array)
    header = f"{{'descr': '{array.dtype.str}', 'fortran_order': False, 'shape': {array.shape!r}, }}"
    padding = 64 - (10 + len(header) + 1) % 64
    header = header + " " * padding + "\n"
    return (
        _NPY_MAGIC
        + b"\x01\x00"
        + len(header).to_bytes(2, "little")
        + header.encode("latin1")
        + array.tobytes()
    )


async def infer(request: web.Request) -> web.StreamResponse:
    deployment_id = request.match_info["deployment"]
    runtime = request.app[RUNTIME]
    # The replica whose turn it is (a deployment may have several here, a canary's
    # model beside the current one): the request is read and checked against its model,
    # and runs on that model even if an update is swapped in meanwhile.
    batcher = runtime.next_batcher(deployment_id)
    if batcher is None:
        return _not_served(runtime, deployment_id)
    # Taken before the body is read: a body being read is memory already. One without a
    # Content-Length (chunked) may be as large as any.
    declared = request.content_length
    body_bytes = MAX_REQUEST_BYTES if declared is None else min(declared, MAX_REQUEST_BYTES)
    budget = request.app[BODY_BUDGET]
    if not budget.try_take(body_bytes):
        detail = (
            f"request bodies being handled take {budget.in_use_bytes} bytes "
            f"(at most {budget.capacity_bytes}); this one declares {body_bytes}"
        )
        return problem_response(429, "Too many requests", detail, **{"Retry-After": "1"})
    try:
        raw = await request.read()
        return await _answer(request, runtime, deployment_id, batcher, raw)
    finally:
        budget.give_back(body_bytes)


def _not_served(runtime: InferenceRuntime, deployment_id: str) -> web.Response:
    """The 404 of a deployment with no ready replica here, or the 503 of one withdrawn
    whose accepted requests are still being answered."""
    replica = runtime.serving(deployment_id)
    if replica is None and runtime.being_removed(deployment_id):
        # Withdrawn, its accepted requests still being answered: the client may
        # find it on another node (or here again) in a moment.
        detail = f"deployment {deployment_id} is being removed from this node"
        return problem_response(503, "Deployment being removed", detail, **{"Retry-After": "1"})
    state = "not served on this node" if replica is None else f"{replica.state}"
    detail = f"deployment {deployment_id} is {state}"
    if replica is not None and replica.reason:
        detail += f": {replica.reason}"
    return problem_response(404, "Deployment not served here", detail)


async def _answer(
    request: web.Request,
    runtime: InferenceRuntime,
    deployment_id: str,
    batcher: Batcher,
    raw: bytes,
) -> web.Response:
    checked: tuple[LoadedModel, dict[str, np.ndarray], int] | None = None
    for _ in range(_REPLICA_TRIES):
        model = batcher.model
        if checked is None or checked[0].inputs != model.inputs:
            try:
                feeds, rows = await _off_loop_if(
                    len(raw) > OFF_LOOP_BYTES, _checked_feeds, raw, request.content_type, model
                )
            except ValueError as error:
                return problem_response(400, "Invalid input", str(error))
        else:
            feeds, rows = checked[1], checked[2]
        checked = (model, feeds, rows)
        try:
            used, outputs = await batcher.infer(feeds, rows, model=model)
        except Unavailable as error:
            # The replica was withdrawn while the body was read (a scale-down, a canary's
            # replica removed): a sibling still ready here answers instead.
            sibling = runtime.next_batcher(deployment_id)
            if sibling is None or sibling is batcher:
                return problem_response(
                    503, "Deployment being removed", str(error), **{"Retry-After": "1"}
                )
            batcher = sibling
            continue
        except QueueFull as error:
            return problem_response(429, "Too many requests", str(error), **{"Retry-After": "1"})
        except InvalidInput as error:  # values the model refuses: the client's error
            return problem_response(400, "Invalid input", str(error))
        except Exception as error:  # the model failed on this input
            return problem_response(500, "Inference failed", f"{type(error).__name__}: {error}")
        return await _response(request, used, outputs)
    detail = f"deployment {deployment_id}: its replicas here were withdrawn while answering"
    return problem_response(503, "Deployment being removed", detail, **{"Retry-After": "1"})


def _checked_feeds(
    raw: bytes, content_type: str, model: LoadedModel
) -> tuple[dict[str, np.ndarray], int]:
    """A body's inputs, checked against `model`, and its rows; ValueError says why not."""
    feeds = _feeds_from_npy(raw, model) if content_type == NPY else _feeds_from_json(raw, model)
    return feeds, check_feeds(model, feeds)


async def _off_loop_if(
    large: bool, work: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs
) -> _T:
    """`work` in a thread where it is `large`, on the loop otherwise (a hand-over to a
    thread costs more than decoding a small body)."""
    if large:
        return await asyncio.to_thread(work, *args, **kwargs)
    return work(*args, **kwargs)


async def _response(
    request: web.Request, used: LoadedModel, outputs: list[np.ndarray]
) -> web.Response:
    large = sum(output.nbytes for output in outputs) > OFF_LOOP_BYTES
    accepted = request.headers.get("Accept", "")
    if NPY in accepted:
        if _numbers_only(outputs[0]):
            body = await _off_loop_if(large, write_npy, outputs[0])
            return web.Response(body=body, content_type=NPY)
        if "application/json" not in accepted:
            name = used.output_names[0]
            return problem_response(
                406,
                "Not acceptable",
                f"output {name} is not an array of numbers (strings, maps or sequences): "
                "it has no .npy form; ask for JSON (Accept: application/json)",
            )
    body = await _off_loop_if(large, _json_answer, used, outputs)
    return web.Response(body=body, content_type="application/json")


def _json_answer(used: LoadedModel, outputs: list[np.ndarray]) -> bytes:
    answer = {
        "outputs": {
            name: value.tolist() for name, value in zip(used.output_names, outputs, strict=True)
        },
        "model_sha256": used.sha256,
        "provider": used.provider,
    }
    return msgspec.json.encode(answer)


async def metrics(request: web.Request) -> web.Response:
    text = render_prometheus(request.app[RUNTIME].stats())
    return web.Response(text=text, content_type="text/plain", charset="utf-8")


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


def inference_app(runtime: InferenceRuntime) -> web.Application:
    app = web.Application(client_max_size=MAX_REQUEST_BYTES)
    app[RUNTIME] = runtime
    app[BODY_BUDGET] = BodyBudget(BODY_BUDGET_BYTES)
    app.router.add_post("/v1/infer/{deployment}", infer)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    return app
