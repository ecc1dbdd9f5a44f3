"""The session's request checks and warm-up against models a tenant may really deploy:
a batched input beside a scalar and a fixed-shape one, inputs that share a named
dimension, a convolution that needs a real image size, a run that fails on zeros, and
a tiny file declaring an input no request could carry."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
from onnx import NodeProto, TensorProto, ValueInfoProto, helper, numpy_helper
from structlog.testing import capture_logs

from edge.inference.session import LoadedModel, ModelLoadError, check_feeds

pytestmark = pytest.mark.timeout(30)

FLOAT = TensorProto.FLOAT


def _model(
    nodes: list[NodeProto],
    inputs: list[ValueInfoProto],
    outputs: list[ValueInfoProto],
    initializers: list[TensorProto] | None = None,
) -> bytes:
    graph = helper.make_graph(nodes, "review8", inputs, outputs, initializers or [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def _loaded(tmp_path: Path, body: bytes) -> LoadedModel:
    path = tmp_path / "model.onnx"
    path.write_bytes(body)
    return LoadedModel(path, hashlib.sha256(body).hexdigest(), None)


def _affine() -> bytes:
    """y = x * scale + bias, with x[N, 4], scale a scalar and bias[4]."""
    return _model(
        [
            helper.make_node("Mul", ["x", "scale"], ["scaled"]),
            helper.make_node("Add", ["scaled", "bias"], ["y"]),
        ],
        [
            helper.make_tensor_value_info("x", FLOAT, ["N", 4]),
            helper.make_tensor_value_info("scale", FLOAT, []),
            helper.make_tensor_value_info("bias", FLOAT, [4]),
        ],
        [helper.make_tensor_value_info("y", FLOAT, ["N", 4])],
    )


def test_a_scalar_and_a_fixed_shape_input_do_not_count_as_the_batch(tmp_path: Path) -> None:
    model = _loaded(tmp_path, _affine())
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    feeds = {"x": x, "scale": np.array(2.0, np.float32), "bias": np.ones(4, np.float32)}
    assert check_feeds(model, feeds) == 2  # x's rows, not bias's 4 nor the scalar's 1
    assert check_feeds(model, {**feeds, "x": x[:1]}) == 1
    np.testing.assert_allclose(model.run(feeds)[0], x * 2.0 + 1.0)
    with pytest.raises(ValueError, match=r"bias: shape \[3\], the model takes bias: float32\[4\]"):
        check_feeds(model, {**feeds, "bias": np.ones(3, np.float32)})
    with pytest.raises(ValueError, match=r"scale: shape \[1\]"):
        check_feeds(model, {**feeds, "scale": np.ones(1, np.float32)})


def test_inputs_sharing_a_named_dimension_must_agree_on_its_size(tmp_path: Path) -> None:
    body = _model(
        [helper.make_node("Add", ["a", "b"], ["y"])],
        [
            helper.make_tensor_value_info("a", FLOAT, ["N", "S"]),
            helper.make_tensor_value_info("b", FLOAT, ["N", "S"]),
        ],
        [helper.make_tensor_value_info("y", FLOAT, ["N", "S"])],
    )
    model = _loaded(tmp_path, body)
    three = np.ones((2, 3), np.float32)
    assert check_feeds(model, {"a": three, "b": three}) == 2
    with pytest.raises(ValueError, match=r"dimension 'S' is 3 in a but 4 in b"):
        check_feeds(model, {"a": three, "b": np.ones((2, 4), np.float32)})


def test_warm_up_never_fails_a_model_that_serves_real_requests(tmp_path: Path) -> None:
    # An unpadded 3x3 convolution: a 1x1 image of zeros is no valid input, a real one is.
    weights = numpy_helper.from_array(np.ones((2, 3, 3, 3), np.float32), "w")
    conv = _loaded(
        tmp_path,
        _model(
            [helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3])],
            [helper.make_tensor_value_info("x", FLOAT, ["N", 3, "H", "W"])],
            [helper.make_tensor_value_info("y", FLOAT, ["N", 2, "OH", "OW"])],
            [weights],
        ),
    )
    conv.warm_up()
    assert conv.run({"x": np.zeros((1, 3, 8, 8), np.float32)})[0].shape == (1, 2, 6, 6)


def test_a_warm_up_run_that_fails_is_logged_and_the_model_still_serves(tmp_path: Path) -> None:
    # Reshapes x[N, 4] to [3, -1]: one row of zeros cannot be, three rows can.
    target = numpy_helper.from_array(np.array([3, -1], np.int64), "target")
    model = _loaded(
        tmp_path,
        _model(
            [helper.make_node("Reshape", ["x", "target"], ["y"])],
            [helper.make_tensor_value_info("x", FLOAT, ["N", 4])],
            [helper.make_tensor_value_info("y", FLOAT, [3, "M"])],
            [target],
        ),
    )
    with capture_logs() as logs:
        model.warm_up()
    warnings = [line for line in logs if line["log_level"] == "warning"]
    assert [line["event"] for line in warnings] == ["warm-up run failed; serving the model anyway"]
    assert model.run({"x": np.ones((3, 4), np.float32)})[0].shape == (3, 4)


def test_a_model_whose_fixed_inputs_no_request_could_carry_is_refused_at_load(
    tmp_path: Path,
) -> None:
    # 1 GiB of float32 declared in a file of under 100 bytes: refused before anything
    # (the warm-up's zeros included) is allocated for it.
    body = _model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", FLOAT, [16384, 16384])],
        [helper.make_tensor_value_info("y", FLOAT, [16384, 16384])],
    )
    with pytest.raises(ModelLoadError, match=r"x: float32\[16384, 16384\].*64 MiB"):
        _loaded(tmp_path, body)
    # The same input with its first axis free is 64 KiB a row: it loads.
    free = _model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", FLOAT, ["N", 16384])],
        [helper.make_tensor_value_info("y", FLOAT, ["N", 16384])],
    )
    assert _loaded(tmp_path, free).batchable
