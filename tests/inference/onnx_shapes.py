"""Real ONNX models whose shapes stress batching: a free non-batch dimension, an output
without a batch axis, a run whose cost grows with the square of its input. Built with
onnx.helper, like tests/support/onnx_models.py."""

from __future__ import annotations

from collections.abc import Sequence

from onnx import NodeProto, TensorProto, ValueInfoProto, helper


def _model(
    nodes: list[NodeProto], inputs: list[ValueInfoProto], outputs: list[ValueInfoProto]
) -> bytes:
    graph = helper.make_graph(nodes, "shapes", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def identity(shape: Sequence[int | str] = ("batch", 4), dtype: int = TensorProto.FLOAT) -> bytes:
    """x[shape] -> y = x."""
    return _model(
        [helper.make_node("Identity", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", dtype, list(shape))],
        [helper.make_tensor_value_info("y", dtype, list(shape))],
    )


def total() -> bytes:
    """x[batch, 4] -> y = the sum of every element: a scalar, with no batch axis."""
    return _model(
        [helper.make_node("ReduceSum", ["x"], ["y"], keepdims=0)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
    )


def gram() -> bytes:
    """x[batch, n] -> y = x @ x^T: microseconds for one small row, far longer for a
    large request."""
    return _model(
        [
            helper.make_node("Transpose", ["x"], ["t"]),
            helper.make_node("MatMul", ["x", "t"], ["y"]),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "batch"])],
    )
