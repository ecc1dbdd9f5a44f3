"""Small, real ONNX models built with onnx.helper, and their numpy references."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

MLP_SEED = 7


def mlp_weights(seed: int = MLP_SEED) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (
        rng.standard_normal((4, 3)).astype(np.float32),
        rng.standard_normal(3).astype(np.float32),
    )


def mlp(*, dynamic_batch: bool = True, opset: int = 17, seed: int = MLP_SEED) -> bytes:
    """x[batch, 4] -> Relu(x @ W + b) -> y[batch, 3]."""
    weights, bias = mlp_weights(seed)
    batch: int | str = "batch" if dynamic_batch else 1
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["h"]),
            helper.make_node("Add", ["h", "b"], ["z"]),
            helper.make_node("Relu", ["z"], ["y"]),
        ],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 3])],
        initializer=[numpy_helper.from_array(weights, "W"), numpy_helper.from_array(bias, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def mlp_reference(x: np.ndarray, seed: int = MLP_SEED) -> np.ndarray:
    weights, bias = mlp_weights(seed)
    result: np.ndarray = np.maximum(x.astype(np.float32) @ weights + bias, 0.0)
    return result


def broken_graph() -> bytes:
    """Parses as ONNX, but a node reads a tensor nothing produces."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["missing"], ["y"])],
        "broken",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def failing_at_run() -> bytes:
    """x[batch, 4] -> y[batch, 3], like `mlp`, but every run fails: a Gather reads a column
    x does not have (ONNX Runtime checks indices when it runs, not when it loads)."""
    graph = helper.make_graph(
        [helper.make_node("Gather", ["x", "columns"], ["y"], axis=1)],
        "failing",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        initializer=[numpy_helper.from_array(np.array([0, 1, 9], dtype=np.int64), "columns")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return bytes(model.SerializeToString())
