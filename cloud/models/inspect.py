"""Is this file an ONNX model, and what does it take and give?

`onnx.checker` decides validity (the same checks ONNX Runtime's loader relies on);
the graph's inputs (less its initializers, which older exporters list as inputs too)
and outputs are described by name, numpy dtype and shape, where a dimension is a
size, a symbolic name such as "batch", or unknown.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
from onnx import helper

from cloud.store import ModelTensor

_DEFAULT_DOMAINS = ("", "ai.onnx")


class InvalidModelError(ValueError):
    """The file is not a usable ONNX model; the message says why, for the uploader."""


@dataclass(frozen=True, slots=True)
class ModelInfo:
    opset: int
    inputs: tuple[ModelTensor, ...]
    outputs: tuple[ModelTensor, ...]


def _tensor(value: Any) -> ModelTensor:
    tensor_type = value.type.tensor_type
    if not value.type.HasField("tensor_type"):
        raise InvalidModelError(
            f"{value.name!r} is not a tensor (sequences and maps are not served)"
        )
    try:
        dtype = helper.tensor_dtype_to_np_dtype(tensor_type.elem_type).name
    except KeyError:
        raise InvalidModelError(f"{value.name!r} has an unknown element type") from None
    dims: list[int | str | None] = []
    if tensor_type.HasField("shape"):
        for dim in tensor_type.shape.dim:
            if dim.HasField("dim_value"):
                dims.append(int(dim.dim_value))
            elif dim.HasField("dim_param"):
                dims.append(str(dim.dim_param))
            else:
                dims.append(None)
    return ModelTensor(value.name, dtype, tuple(dims))


def inspect_model(path: Path) -> ModelInfo:
    """Raises `InvalidModelError` with the reason; blocking (call it off the event loop)."""
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as error:  # protobuf's DecodeError and friends: not a model at all
        raise InvalidModelError(f"not an ONNX model: {error or type(error).__name__}") from None
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else "invalid"
        raise InvalidModelError(f"the ONNX checker rejected it: {first_line}") from None
    opsets = [o.version for o in model.opset_import if o.domain in _DEFAULT_DOMAINS]
    if not opsets:
        raise InvalidModelError("it imports no default-domain opset")
    initializers = {init.name for init in model.graph.initializer}
    inputs = tuple(_tensor(v) for v in model.graph.input if v.name not in initializers)
    outputs = tuple(_tensor(v) for v in model.graph.output)
    if not inputs or not outputs:
        raise InvalidModelError("the graph has no inputs or no outputs")
    return ModelInfo(opset=int(max(opsets)), inputs=inputs, outputs=outputs)
