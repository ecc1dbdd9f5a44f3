"""A singular field holding a tensor, written twice, is not let through the upload
check: protobuf merges the two occurrences into one tensor (dims appended, the last
raw_data kept) that the checker and ONNX Runtime refuse, while each occurrence alone
looks fine. Fields that merge without joining tensors still get the whole-load verdict."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from cloud.models.inspect import InvalidModelError, ModelInfo, inspect_model
from tests.cloud.test_model_inspect import _varint, assert_same_verdict


def length_field(number: int, payload: bytes) -> bytes:
    """One length-delimited field as protobuf writes it."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


_NODE_ATTRIBUTE, _GRAPH_NODE, _GRAPH_SPARSE_INITIALIZER, _MODEL_GRAPH = 5, 1, 15, 7
_ATTRIBUTE_T, _ATTRIBUTE_SPARSE_TENSOR, _SPARSE_VALUES = 5, 22, 1


def model_bytes(graph: onnx.GraphProto, graph_prefix: bytes = b"") -> bytes:
    """The model around `graph`, with `graph_prefix` (raw fields) written before it."""
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    graph_bytes = graph_prefix + graph.SerializeToString()
    model.ClearField("graph")
    return bytes(model.SerializeToString()) + length_field(_MODEL_GRAPH, graph_bytes)


def io_graph(
    nodes: list[onnx.NodeProto] | None = None, initializer: list[TensorProto] | None = None
) -> onnx.GraphProto:
    return helper.make_graph(
        nodes or [helper.make_node("Identity", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 1000, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 1000, 1])],
        initializer=initializer,
    )


def constant_with_two_values() -> bytes:
    """Constant `c` whose `value` attribute carries `t` twice: [1000] floats, then [1];
    merged, dims [1000, 1] with 4 bytes of raw_data (the reviewer's reproduction)."""
    big = numpy_helper.from_array(np.zeros(1000, np.float32), "c")
    small = numpy_helper.from_array(np.zeros(1, np.float32), "c")
    attribute = helper.make_attribute("value", big).SerializeToString()
    attribute += length_field(_ATTRIBUTE_T, small.SerializeToString())
    node = helper.make_node("Constant", [], ["c"]).SerializeToString()
    node += length_field(_NODE_ATTRIBUTE, attribute)
    graph = io_graph(nodes=[helper.make_node("Add", ["x", "c"], ["y"])])
    return model_bytes(graph, graph_prefix=length_field(_GRAPH_NODE, node))


def sparse_values_parts() -> tuple[onnx.SparseTensorProto, bytes]:
    """A sparse tensor [8] with two values; and a second `values` that alone is fine (a
    scalar in raw_data) but merged gives the values two value fields."""
    values = helper.make_tensor("s", TensorProto.FLOAT, [2], [1.0, 2.0])  # float_data
    indices = numpy_helper.from_array(np.array([1, 5], np.int64), "s_indices")
    sparse = helper.make_sparse_tensor(values, indices, [8])
    second = numpy_helper.from_array(np.array(3.0, np.float32), "s").SerializeToString()
    return sparse, second


def sparse_initializer_with_two_values() -> bytes:
    sparse, second = sparse_values_parts()
    sparse_bytes = sparse.SerializeToString() + length_field(_SPARSE_VALUES, second)
    return model_bytes(
        io_graph(), graph_prefix=length_field(_GRAPH_SPARSE_INITIALIZER, sparse_bytes)
    )


def constant_with_two_sparse_tensors() -> bytes:
    sparse, second = sparse_values_parts()
    again = onnx.SparseTensorProto(dims=[8])
    again.values.ParseFromString(second)
    attribute = helper.make_attribute("sparse_value", sparse).SerializeToString()
    attribute += length_field(_ATTRIBUTE_SPARSE_TENSOR, again.SerializeToString())
    node = helper.make_node("Constant", [], ["c"]).SerializeToString()
    node += length_field(_NODE_ATTRIBUTE, attribute)
    return model_bytes(io_graph(), graph_prefix=length_field(_GRAPH_NODE, node))


@pytest.mark.parametrize(
    ("body", "field"),
    [
        pytest.param(constant_with_two_values(), "AttributeProto.t", id="attribute-t"),
        pytest.param(
            sparse_initializer_with_two_values(), "SparseTensorProto.values", id="sparse-values"
        ),
        pytest.param(
            constant_with_two_sparse_tensors(),
            "AttributeProto.sparse_tensor",
            id="attribute-sparse-tensor",
        ),
    ],
)
def test_a_tensor_written_twice_in_one_message_is_refused(
    tmp_path: Path, body: bytes, field: str
) -> None:
    # What the uploaded file is once loaded whole: the checker refuses it.
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(onnx.ModelProto.FromString(body))
    path = tmp_path / "model.onnx"
    path.write_bytes(body)
    with pytest.raises(InvalidModelError, match=rf"^{field} is written twice in one message"):
        inspect_model(path)


def test_fields_that_merge_without_joining_tensors_get_the_whole_load_verdict(
    tmp_path: Path,
) -> None:
    """The graph written twice (a legal protobuf merge: its lists are joined) is judged
    as loading it whole judges it, accepted here; so are many tensors in repeated fields."""
    first = io_graph(initializer=[numpy_helper.from_array(np.ones(3, np.float32), "w")])
    second = onnx.GraphProto(initializer=[numpy_helper.from_array(np.ones(2, np.float32), "v")])
    body = model_bytes(first) + length_field(_MODEL_GRAPH, second.SerializeToString())
    assert [t.name for t in onnx.ModelProto.FromString(body).graph.initializer] == ["w", "v"]
    path = tmp_path / "model.onnx"
    path.write_bytes(body)
    assert isinstance(assert_same_verdict(path), ModelInfo)
