"""The agent's local inference endpoint.

- `POST /v1/infer/{deployment}` with JSON `{"inputs": {"x": [[...], ...]}}` answers
  `{"outputs": {"y": [[...]]}, "model_sha256": ..., "provider": ...}`; with a raw
  `.npy` body (`Content-Type: application/x-npy`, models with one input) and
  `Accept: application/x-npy` it answers the first output as `.npy`, or `406` where
  that output is not an array of numbers (strings, maps, sequences: JSON only).
- Inputs are checked against the model (names, dtypes, shapes): a clear `400`.
- Several replicas of a deployment on this node (a canary's beside the current
  model's) answer at its one endpoint, taking turns; `model_sha256` says which model
  answered.
- A full queue (every ready replica's) is `429` with `Retry-After`; a deployment not
  (yet) served here is `404`, one being removed (its accepted requests still being
  answered) `503` with `Retry-After`.
- `GET /metrics` (Prometheus text) and `GET /healthz`.

Errors are `application/problem+json`, like the control plane's.
"""

from __future__ import annotations

import io
import itertools
import math
import re
from collections.abc import Iterable
from typing import Any, Final, cast

import msgspec
import numpy as np
from aiohttp import web

from edge.inference.batching import QueueFull, Unavailable
from edge.inference.runtime import InferenceRuntime
from edge.inference.session import LoadedModel, check_feeds
from edge.inference.stats import render_prometheus
from shared.problems import PROBLEM_CONTENT_TYPE, ProblemBody

NPY: Final = "application/x-npy"
MAX_REQUEST_BYTES: Final = 64 * 1024 * 1024
RUNTIME = web.AppKey("runtime", InferenceRuntime)
_JSON_BODY = msgspec.json.Decoder(dict[str, Any])


def _problem(status: int, title: str, detail: str, **headers: str) -> web.Response:
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
        replica = runtime.serving(deployment_id)
        if replica is None and runtime.being_removed(deployment_id):
            # Withdrawn, its accepted requests still being answered: the client may
            # find it on another node (or here again) in a moment.
            detail = f"deployment {deployment_id} is being removed from this node"
            return _problem(503, "Deployment being removed", detail, **{"Retry-After": "1"})
        state = "not served on this node" if replica is None else f"{replica.state}"
        detail = f"deployment {deployment_id} is {state}"
        if replica is not None and replica.reason:
            detail += f": {replica.reason}"
        return _problem(404, "Deployment not served here", detail)
    model = batcher.model
    raw = await request.read()
    try:
        feeds = (
            _feeds_from_npy(raw, model)
            if request.content_type == NPY
            else _feeds_from_json(raw, model)
        )
        rows = check_feeds(model, feeds)
    except ValueError as error:
        return _problem(400, "Invalid input", str(error))
    try:
        used, outputs = await batcher.infer(feeds, rows, model=model)
    except QueueFull as error:
        return _problem(429, "Too many requests", str(error), **{"Retry-After": "1"})
    except Unavailable as error:
        return _problem(503, "Deployment being removed", str(error), **{"Retry-After": "1"})
    except Exception as error:  # the model failed on this input
        return _problem(500, "Inference failed", f"{type(error).__name__}: {error}")
    accepted = request.headers.get("Accept", "")
    if NPY in accepted:
        if _numbers_only(outputs[0]):
            return web.Response(body=write_npy(outputs[0]), content_type=NPY)
        if "application/json" not in accepted:
            name = used.output_names[0]
            return _problem(
                406,
                "Not acceptable",
                f"output {name} is not an array of numbers (strings, maps or sequences): "
                "it has no .npy form; ask for JSON (Accept: application/json)",
            )
    body = {
        "outputs": {
            name: value.tolist() for name, value in zip(used.output_names, outputs, strict=True)
        },
        "model_sha256": used.sha256,
        "provider": used.provider,
    }
    return web.Response(body=msgspec.json.encode(body), content_type="application/json")


async def metrics(request: web.Request) -> web.Response:
    text = render_prometheus(request.app[RUNTIME].stats())
    return web.Response(text=text, content_type="text/plain", charset="utf-8")


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


def inference_app(runtime: InferenceRuntime) -> web.Application:
    app = web.Application(client_max_size=MAX_REQUEST_BYTES)
    app[RUNTIME] = runtime
    app.router.add_post("/v1/infer/{deployment}", infer)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    return app
