"""One ONNX Runtime session for one model file, on the providers asked for.

Which provider really runs is what `session.get_providers()` says afterwards, not
what was asked: a build without CUDA silently falls back to the CPU, and the agent
reports that fallback instead of pretending. Everything here blocks: call it off the
event loop.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shared.lean_logs import get_logger

# ONNX Runtime's type strings -> numpy dtypes (the ones a served model may take).
ORT_DTYPES: Mapping[str, np.dtype[Any]] = {
    "tensor(float)": np.dtype(np.float32),
    "tensor(float16)": np.dtype(np.float16),
    "tensor(double)": np.dtype(np.float64),
    "tensor(int8)": np.dtype(np.int8),
    "tensor(int16)": np.dtype(np.int16),
    "tensor(int32)": np.dtype(np.int32),
    "tensor(int64)": np.dtype(np.int64),
    "tensor(uint8)": np.dtype(np.uint8),
    "tensor(uint16)": np.dtype(np.uint16),
    "tensor(uint32)": np.dtype(np.uint32),
    "tensor(uint64)": np.dtype(np.uint64),
    "tensor(bool)": np.dtype(np.bool_),
}
CPU = "CPUExecutionProvider"
OPENVINO = "OpenVINOExecutionProvider"
QNN = "QNNExecutionProvider"
# Providers that take a device index (`device_id`) from the assigned accelerator.
_DEVICE_PROVIDERS = ("CUDAExecutionProvider", "TensorrtExecutionProvider", "ROCMExecutionProvider")
# OpenVINO runs on the CPU unless `device_type` says otherwise; QNN on the HTP (its NPU)
# or the Adreno GPU by the backend library it is given.
_OPENVINO_DEVICES = {"npu": "NPU", "gpu": "GPU", "cpu": "CPU"}
_QNN_BACKENDS = {"npu": "libQnnHtp.so", "gpu": "libQnnGpu.so", "cpu": "libQnnCpu.so"}


def provider_options(
    provider: str, accelerator_kind: str, device_index: int | None
) -> dict[str, str | int]:
    """What `provider` needs to run on the assigned accelerator, not just anywhere."""
    if provider in _DEVICE_PROVIDERS:
        return {"device_id": device_index} if device_index is not None else {}
    if provider == OPENVINO and accelerator_kind in _OPENVINO_DEVICES:
        device = _OPENVINO_DEVICES[accelerator_kind]
        if device == "GPU" and device_index is not None:
            device = f"GPU.{device_index}"
        return {"device_type": device}
    if provider == QNN and accelerator_kind in _QNN_BACKENDS:
        return {"backend_path": _QNN_BACKENDS[accelerator_kind]}
    return {}


class ModelLoadError(RuntimeError):
    """ONNX Runtime refused the model (or the providers); says why."""


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    dtype: np.dtype[Any]
    shape: tuple[int | None, ...]  # None: any size (a symbolic or unknown dimension)
    # Per axis, the name the model gives a free dimension ('' where it gives none): axes
    # that share a name, in one input or several, must have the same size.
    dim_names: tuple[str, ...] = ()

    @property
    def least_bytes(self) -> int:
        """What one value of this input takes at the least (every free dimension 1)."""
        return math.prod(d or 1 for d in self.shape) * self.dtype.itemsize  # no overflow

    def describe(self) -> str:
        dims = ", ".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.name}: {self.dtype.name}[{dims}]"


class LoadedModel:
    def __init__(
        self,
        path: Path,
        sha256: str,
        provider: str | None,
        *,
        device_index: int | None = None,
        intra_op_threads: int = 0,
        accelerator_kind: str = "cpu",
    ) -> None:
        import onnxruntime as ort  # the agent loads it only when it serves something

        options = ort.SessionOptions()
        options.intra_op_num_threads = intra_op_threads
        self.requested_provider = provider or CPU
        self._failure = ""  # why the requested provider could not be used, if it failed
        # Whether a run of it has worked (its warm-up, or a request): until one has, a run
        # it refuses is the model's failure, not a client's values (edge/inference/
        # batching.py), so a model that fails on every input still fails its canary.
        self.has_run = False
        wanted: list[Any] = []
        if provider is not None and provider != CPU:
            extra = provider_options(provider, accelerator_kind, device_index)
            wanted.append((provider, extra) if extra else provider)
        available = set(ort.get_available_providers())
        usable = [p for p in wanted if (p[0] if isinstance(p, tuple) else p) in available]
        try:
            try:
                self.session = ort.InferenceSession(str(path), options, providers=[*usable, CPU])
            except Exception as error:  # ORT raises its own exception types
                if not usable:
                    raise
                # The accelerator's provider failed to start (an NPU driver missing, say):
                # serve on the CPU, and say so.
                self._failure = f"{provider} failed on the {accelerator_kind}: {error}"
                self.session = ort.InferenceSession(str(path), options, providers=[CPU])
        except Exception as error:
            raise ModelLoadError(f"ONNX Runtime cannot load the model: {error}") from None
        self.sha256 = sha256
        self.provider = self.session.get_providers()[0]
        if not self._failure and usable and isinstance(usable[0], tuple):
            self._failure = _runs_elsewhere(self.session, *usable[0])
        self.inputs = tuple(self._spec(i) for i in self.session.get_inputs())
        _refuse_unsendable_inputs(self.inputs)
        self.output_names = tuple(o.name for o in self.session.get_outputs())
        self.batchable = _batchable(self.session.get_inputs(), self.session.get_outputs())

    @staticmethod
    def _spec(node: Any) -> TensorSpec:
        dtype = ORT_DTYPES.get(node.type)
        if dtype is None:
            raise ModelLoadError(f"input {node.name!r} has type {node.type}, which is not served")
        shape = tuple(d if isinstance(d, int) and d > 0 else None for d in node.shape)
        dim_names = tuple(d if isinstance(d, str) else "" for d in node.shape)
        return TensorSpec(node.name, dtype, shape, dim_names)

    @property
    def fallback(self) -> str:
        """Why the provider differs from the one asked for, or runs on another device
        ('' when it runs as asked)."""
        if self._failure:
            return f"runs on {self.provider}: {self._failure}"
        if self.provider == self.requested_provider:
            return ""
        return (
            f"runs on {self.provider}: {self.requested_provider} is not available in this "
            "ONNX Runtime build or failed to initialise"
        )

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        outputs = self.session.run(list(self.output_names), dict(feeds))
        self.has_run = True
        return [np.asarray(output) for output in outputs]

    def warm_up(self, batch: int = 1) -> None:
        """One run on zeros, so the first request does not pay for lazy initialisation.

        Best effort: a model that loaded is served whether or not this run works. Zeros
        with every free dimension `batch` are not a valid input for every model (an
        unpadded 3x3 convolution on a 1x1 image), so a model with free dimensions
        beyond the first axis is not warmed up at all, and a run that fails anyway is
        logged, not raised: real requests say whether the model works."""
        log = get_logger("greenfed.inference").bind(sha256=self.sha256[:12])
        if any(None in spec.shape[1:] for spec in self.inputs):
            log.debug("warm-up skipped: an input has free dimensions beyond its first axis")
            return
        feeds = {
            spec.name: np.zeros(
                tuple(batch if d is None else d for d in spec.shape), dtype=spec.dtype
            )
            for spec in self.inputs
        }
        try:
            self.run(feeds)
        except Exception as error:  # ORT raises its own exception types
            log.warning("warm-up run failed; serving the model anyway", why=str(error))


def _refuse_unsendable_inputs(inputs: Sequence[TensorSpec]) -> None:
    """ModelLoadError if the inputs' fixed dimensions alone take more bytes than a
    request may carry: no request could run such a model, and the warm-up would
    allocate all of it (a 77-byte model declaring float32[65536, 65536] is 16 GiB)."""
    # Imported here: the server imports this module.
    from edge.inference.server import MAX_REQUEST_BYTES

    total_bytes = sum(spec.least_bytes for spec in inputs)
    if total_bytes <= MAX_REQUEST_BYTES:
        return
    largest = max(inputs, key=lambda spec: spec.least_bytes)
    raise ModelLoadError(
        f"the inputs take {total_bytes / 2**20:.0f} MiB at the least (free dimensions "
        f"counted as 1; {largest.describe()} alone {largest.least_bytes / 2**20:.0f} MiB), "
        f"more than a request may carry ({MAX_REQUEST_BYTES / 2**20:.0f} MiB): no request "
        "could run this model"
    )


def _runs_elsewhere(session: Any, provider: str, asked: Mapping[str, object]) -> str:
    """'' if `provider` runs with the options asked for (say, OpenVINO on the NPU), else
    what it runs with instead."""
    if session.get_providers()[0] != provider:
        return ""  # another provider altogether: `fallback` says so by name
    applied = session.get_provider_options().get(provider, {})
    for key, value in asked.items():
        if key in applied and str(applied[key]) != str(value):
            return f"{provider} runs with {key}={applied[key]}, not {value}"
    return ""


def _batchable(inputs: Sequence[Any], outputs: Sequence[Any]) -> bool:
    """Whether requests can be stacked into one run and each handed its own rows back:
    every input's first axis is free, and no output (as the model declares it, merged
    with ONNX Runtime's shape inference) is a scalar, has a fixed first axis, or carries
    the inputs' batch dimension on a later axis. The last two mix the rows of the
    requests run together (x @ x^T is [batch, batch]: each client would get dot
    products with the others' rows). A model that mixes rows without saying so in its
    shapes cannot be told at load; a run whose outputs cannot be split still fails its
    own requests only (edge/inference/batching.py)."""
    if not inputs or any(not node.shape or not _free(node.shape[0]) for node in inputs):
        return False
    batch_names = {node.shape[0] for node in inputs if isinstance(node.shape[0], str)}
    for node in outputs:
        shape = node.shape
        if shape is None:
            continue  # its rank is not known: the split's check decides at run time
        if len(shape) == 0 or not _free(shape[0]):
            return False
        if any(isinstance(d, str) and d in batch_names for d in shape[1:]):
            return False
    return True


def _free(dimension: object) -> bool:
    """A dimension the model leaves open (a name, unknown, or not positive)."""
    return not (isinstance(dimension, int) and dimension > 0)


def check_feeds(model: LoadedModel, feeds: Mapping[str, np.ndarray]) -> int:
    """The batch size of a request, or ValueError saying what does not match the model's
    inputs, that the request has no rows, or that sizes the model says are one differ.
    The batch size is the first axis of the inputs whose first dimension is free (they
    must agree), or 1 where there are none: a fixed first axis (bias[4]) or a scalar
    is not a batch."""
    expected = {spec.name: spec for spec in model.inputs}
    if set(feeds) != set(expected):
        missing = sorted(set(expected) - set(feeds))
        extra = sorted(set(feeds) - set(expected))
        parts = [f"missing {missing}" if missing else "", f"unknown {extra}" if extra else ""]
        wanted = "; ".join(spec.describe() for spec in model.inputs)
        raise ValueError(f"inputs {' and '.join(p for p in parts if p)}; the model takes {wanted}")
    batch: int | None = None
    for name, value in feeds.items():
        spec = expected[name]
        _check_input(spec, value)
        if not spec.shape or spec.shape[0] is not None:
            continue  # a scalar or a fixed first axis: checked above, not a batch
        size = int(value.shape[0])
        if size == 0:
            # No rows to answer: counted as one, such a request stacked with another
            # would be handed that request's first row of every output.
            raise ValueError(f"{name}: shape {list(value.shape)} has no rows (its first axis is 0)")
        if batch is not None and size != batch:
            raise ValueError("inputs disagree on the batch size (their first axis)")
        batch = size
    _check_named_dimensions(model.inputs, feeds)
    return batch or 1


def _check_input(spec: TensorSpec, value: np.ndarray) -> None:
    if value.dtype != spec.dtype:
        raise ValueError(
            f"{spec.name}: dtype {value.dtype.name}, the model takes {spec.dtype.name}"
        )
    if value.ndim != len(spec.shape) or any(
        want is not None and have != want
        for have, want in zip(value.shape, spec.shape, strict=True)
    ):
        raise ValueError(
            f"{spec.name}: shape {list(value.shape)}, the model takes {spec.describe()}"
        )


def _check_named_dimensions(inputs: Sequence[TensorSpec], feeds: Mapping[str, np.ndarray]) -> None:
    """ValueError if axes the model gives one name (a[N, S] and b[N, S]) differ in size:
    ONNX Runtime would fail the run, or compute with sizes the model says cannot be."""
    first_seen: dict[str, tuple[str, int]] = {}  # dimension name -> (input, its size)
    for spec in inputs:
        shape = feeds[spec.name].shape
        for dim_name, size in zip(spec.dim_names, shape, strict=False):
            if not dim_name:
                continue
            seen = first_seen.setdefault(dim_name, (spec.name, int(size)))
            if seen[1] != size:
                raise ValueError(
                    f"dimension {dim_name!r} is {seen[1]} in {seen[0]} but {size} in "
                    f"{spec.name}: the model says they are the same size"
                )


def split(outputs: Sequence[np.ndarray], sizes: Sequence[int]) -> list[list[np.ndarray]]:
    """Per request, its rows of every output of a stacked batch."""
    bounds = np.cumsum(sizes)[:-1]
    per_output = [np.split(output, bounds) for output in outputs]
    return [[parts[i] for parts in per_output] for i in range(len(sizes))]
