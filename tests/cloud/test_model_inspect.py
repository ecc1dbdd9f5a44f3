"""cloud/models/inspect.py: a model is checked without its weights in memory, and
judged as `onnx.load` + `onnx.checker.check_model` judge the whole file."""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from cloud.models import inspect as inspect_module
from cloud.models.inspect import InvalidModelError, ModelInfo, _tensor, inspect_model
from cloud.store import ModelTensor
from tests.support.onnx_models import broken_graph, mlp

MiB = 1 << 20


def inspect_by_loading(path: Path) -> ModelInfo:
    """The former inspect_model: every weight in memory, then the checker."""
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as error:
        raise InvalidModelError(f"not an ONNX model: {error or type(error).__name__}") from None
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else "invalid"
        raise InvalidModelError(f"the ONNX checker rejected it: {first_line}") from None
    except UnicodeDecodeError:  # was a 500; now refused as invalid
        raise InvalidModelError(
            "the ONNX checker rejected it: a name in the model is not valid UTF-8"
        ) from None
    opsets = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    if not opsets:
        raise InvalidModelError("it imports no default-domain opset")
    initializers = {init.name for init in model.graph.initializer}
    inputs = tuple(_tensor(v) for v in model.graph.input if v.name not in initializers)
    outputs = tuple(_tensor(v) for v in model.graph.output)
    if not inputs or not outputs:
        raise InvalidModelError("the graph has no inputs or no outputs")
    return ModelInfo(opset=int(max(opsets)), inputs=inputs, outputs=outputs)


def verdict(inspect: Callable[[Path], ModelInfo], path: Path) -> ModelInfo | str:
    try:
        return inspect(path)
    except InvalidModelError as error:
        return str(error)


def assert_same_verdict(path: Path) -> ModelInfo | str:
    """The same description, or the same reason; where the file is no protobuf at all,
    only the details of the wire format's fault differ."""
    ours, theirs = verdict(inspect_model, path), verdict(inspect_by_loading, path)
    not_a_model = "not an ONNX model: "
    if isinstance(ours, str) and isinstance(theirs, str) and theirs.startswith(not_a_model):
        assert ours.startswith(not_a_model), (ours, theirs)
    else:
        assert ours == theirs
    return ours


def model_with(
    initializers: list[TensorProto],
    nodes: list[onnx.NodeProto] | None = None,
    sparse: list[onnx.SparseTensorProto] | None = None,
    ir_version: int = 8,
) -> bytes:
    graph = helper.make_graph(
        nodes or [helper.make_node("Identity", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])],
        initializer=initializers,
        sparse_initializer=sparse,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = ir_version
    return bytes(model.SerializeToString())


def external(name: str, location: str, **payload: object) -> TensorProto:
    tensor = TensorProto(
        name=name, data_type=TensorProto.FLOAT, dims=[2], data_location=TensorProto.EXTERNAL
    )
    tensor.external_data.add(key="location", value=location)
    for field, value in payload.items():
        if field == "raw_data":
            tensor.raw_data = value  # type: ignore[assignment]
        else:
            getattr(tensor, field).extend(value)
    return tensor


def if_node_with_initializer_in_branch() -> onnx.NodeProto:
    def branch(name: str, value: float) -> onnx.GraphProto:
        return helper.make_graph(
            [helper.make_node("Identity", ["c"], [f"{name}_out"])],
            name,
            [],
            [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, [2])],
            initializer=[numpy_helper.from_array(np.full(2, value, np.float32), "c")],
        )

    return helper.make_node(
        "If",
        ["flag"],
        ["y"],
        then_branch=branch("then", 1.0),
        else_branch=branch("else", 2.0),
    )


def if_model() -> bytes:
    graph = helper.make_graph(
        [
            helper.make_node(
                "Constant", [], ["flag"], value=numpy_helper.from_array(np.array(True))
            ),
            if_node_with_initializer_in_branch(),
        ],
        "if",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def sparse_initializer(indices: list[int]) -> onnx.SparseTensorProto:
    values = numpy_helper.from_array(np.ones(len(indices), np.float32), "s")
    index_tensor = numpy_helper.from_array(np.array(indices, np.int64), "s_indices")
    return helper.make_sparse_tensor(values, index_tensor, [8])


W = np.arange(6, dtype=np.float32).reshape(3, 2)


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(mlp(), id="mlp"),
        pytest.param(mlp(dynamic_batch=False, opset=13), id="mlp-fixed"),
        pytest.param(broken_graph(), id="broken-graph"),
        pytest.param(b"this is not a model at all", id="text"),
        pytest.param(b"\x08", id="cut-varint"),
        pytest.param(if_model(), id="if-with-initializers-in-branches"),
        pytest.param(
            model_with(
                [],
                [
                    helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(W)),
                    helper.make_node("Identity", ["x"], ["y"]),
                ],
            ),
            id="constant-node",
        ),
        pytest.param(model_with([], sparse=[sparse_initializer([1, 5])]), id="sparse"),
        pytest.param(model_with([], sparse=[sparse_initializer([5, 1])]), id="sparse-unsorted"),
        pytest.param(
            model_with([numpy_helper.from_array(W, "w")], ir_version=3), id="ir3-not-input"
        ),
    ],
)
def test_models_get_the_verdict_loading_them_whole_gave(tmp_path: Path, body: bytes) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(body)
    assert_same_verdict(path)


def sparse_with_external(part: str) -> onnx.SparseTensorProto:
    sparse = sparse_initializer([1, 5])
    tensor = sparse.values if part == "values" else sparse.indices
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    tensor.external_data.add(key="location", value="pyproject.toml")
    return sparse


def constant_of(tensor: TensorProto) -> list[onnx.NodeProto]:
    return [
        helper.make_node("Constant", [], ["c"], value=tensor),
        helper.make_node("Identity", ["x"], ["y"]),
    ]


def if_with_external_in_branch() -> bytes:
    node = if_node_with_initializer_in_branch()
    branch = node.attribute[0].g
    branch.initializer[0].CopyFrom(external("c", "pyproject.toml"))
    graph = helper.make_graph(
        [
            helper.make_node(
                "Constant", [], ["flag"], value=numpy_helper.from_array(np.array(True))
            ),
            node,
        ],
        "if",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(model_with([external("w", "pyproject.toml")]), id="file-that-exists"),
        pytest.param(model_with([external("w", "weights.bin")]), id="missing-file"),
        pytest.param(model_with([external("w", "/etc/passwd")]), id="absolute"),
        pytest.param(model_with([external("w", "#in-memory")]), id="hash"),
        pytest.param(model_with([external("w", "#m", raw_data=b"12345678")]), id="and-raw"),
        pytest.param(model_with([], constant_of(external("c", "pyproject.toml"))), id="attribute"),
        pytest.param(if_with_external_in_branch(), id="subgraph"),
        pytest.param(model_with([], sparse=[sparse_with_external("values")]), id="sparse-values"),
        pytest.param(model_with([], sparse=[sparse_with_external("indices")]), id="sparse-indices"),
    ],
)
def test_tensors_stored_as_external_data_are_refused_whatever_files_exist(
    tmp_path: Path, body: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agents download the one .onnx file; and whether a named file exists where
    the control plane runs must not decide the answer (that would tell a tenant)."""
    monkeypatch.chdir(Path(__file__).parents[2])  # where pyproject.toml exists
    path = tmp_path / "model.onnx"
    path.write_bytes(body)
    with pytest.raises(InvalidModelError, match=r"keeps its values in another file"):
        inspect_model(path)


def test_the_mlp_is_described(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(mlp())
    info = inspect_model(path)
    assert info == ModelInfo(
        opset=17,
        inputs=(ModelTensor("x", "float32", ("batch", 4)),),
        outputs=(ModelTensor("y", "float32", ("batch", 3)),),
    )


def test_a_name_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(mlp().replace(b"\x0a\x01x", b"\x0a\x01\xff"))
    with pytest.raises(InvalidModelError, match="is not valid UTF-8"):
        inspect_model(path)


def tensors_to_compare() -> list[TensorProto]:
    f = TensorProto
    cases = [
        f(name="raw-ok", data_type=f.FLOAT, dims=[3, 2], raw_data=W.tobytes()),
        f(name="raw-short", data_type=f.FLOAT, dims=[3, 2], raw_data=W.tobytes()[:-1]),
        f(name="raw-long", data_type=f.FLOAT, dims=[3, 2], raw_data=W.tobytes() + b"x"),
        f(name="raw-int4", data_type=f.INT4, dims=[5], raw_data=b"\1\2"),
        f(name="raw-int4-short", data_type=f.INT4, dims=[5], raw_data=b"\1\2"[:1]),
        f(name="raw-int2-short", data_type=f.INT2, dims=[9], raw_data=b"\1\2"),
        f(name="raw-string", data_type=f.STRING, dims=[1], raw_data=b"abc"),
        f(name="raw-unknown-type", data_type=999, dims=[1], raw_data=b"abc"),
        f(name="raw-huge", data_type=f.DOUBLE, dims=[2**31, 2**31], raw_data=b"abc"),
        f(name="overflow", data_type=f.FLOAT, dims=[2**40, 2**40], raw_data=b"abc"),
        f(name="negative", data_type=f.FLOAT, dims=[2, -1], float_data=[1, 2]),
        f(name="zero-with-data", data_type=f.FLOAT, dims=[0, 3], float_data=[1]),
        f(name="zero-empty", data_type=f.FLOAT, dims=[0, 3]),
        f(name="no-data", data_type=f.FLOAT, dims=[2]),
        f(name="two-fields", data_type=f.FLOAT, dims=[1], float_data=[1], raw_data=b"abcd"),
        f(name="float-short", data_type=f.FLOAT, dims=[3], float_data=[1, 2]),
        f(name="float-long", data_type=f.FLOAT, dims=[3], float_data=[1, 2, 3, 4]),
        f(name="complex-short", data_type=f.COMPLEX64, dims=[2], float_data=[1, 2, 3]),
        f(name="double", data_type=f.DOUBLE, dims=[2], double_data=[1, 2]),
        f(name="complex128-short", data_type=f.COMPLEX128, dims=[2], double_data=[1, 2]),
        f(name="int64-in-int32", data_type=f.INT64, dims=[2], int32_data=[1, 2]),
        f(name="int64-short", data_type=f.INT64, dims=[3], int64_data=[1, -2]),
        f(name="int64-ok", data_type=f.INT64, dims=[2], int64_data=[2**62, -1]),
        f(name="f16-short", data_type=f.FLOAT16, dims=[3], int32_data=[15360, 300]),
        f(name="int4-packed", data_type=f.INT4, dims=[9], int32_data=[0]),
        f(name="int4-packed-short", data_type=f.INT4, dims=[17], int32_data=[0, 1]),
        f(name="int2-packed-short", data_type=f.UINT2, dims=[17], int32_data=[0]),
        f(name="uint32-short", data_type=f.UINT32, dims=[2], uint64_data=[2**40]),
        f(name="string-ok", data_type=f.STRING, dims=[2], string_data=[b"a", b""]),
        f(name="string-short", data_type=f.STRING, dims=[2], string_data=[b"a"]),
        f(name="unknown-typed", data_type=999, dims=[1], float_data=[1]),
        f(name="undefined", data_type=0, dims=[1], raw_data=b"abcd"),
        f(name="no-type", dims=[1], raw_data=b"abcd"),
        f(name="scalar", data_type=f.FLOAT, float_data=[1]),
    ]
    not_external = f(name="not-external", data_type=f.FLOAT, dims=[1], raw_data=b"abcd")
    not_external.external_data.add(key="location", value="/etc/passwd")
    return [*cases, not_external]


@pytest.mark.parametrize("tensor", tensors_to_compare(), ids=lambda t: t.name)
@pytest.mark.parametrize("where", ["initializer", "constant-node"])
def test_payload_checks_give_the_checkers_verdict_and_message(
    tmp_path: Path, tensor: TensorProto, where: str
) -> None:
    if where == "initializer":
        body = model_with([tensor])
    else:
        constant = helper.make_node("Constant", [], ["c"], value=tensor)
        body = model_with([], [constant, helper.make_node("Identity", ["x"], ["y"])])
    path = tmp_path / "model.onnx"
    path.write_bytes(body)
    assert_same_verdict(path)


def test_unpacked_repeated_values_are_counted(tmp_path: Path) -> None:
    header = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[3]).SerializeToString()
    for values in (2, 3):
        tensor = header + b"".join(b"\x25" + np.float32(i).tobytes() for i in range(values))
        body = model_with([TensorProto.FromString(tensor)])
        path = tmp_path / f"{values}.onnx"
        path.write_bytes(body)
        assert isinstance(assert_same_verdict(path), ModelInfo) == (values == 3)


def test_every_cut_and_many_corruptions_of_a_model_are_refused_as_before(
    tmp_path: Path,
) -> None:
    body = mlp()
    path = tmp_path / "model.onnx"
    for end in range(len(body)):
        path.write_bytes(body[:end])
        ours = verdict(inspect_model, path)
        theirs = verdict(inspect_by_loading, path)
        assert isinstance(ours, str) == isinstance(theirs, str), end
    rng = random.Random(12)
    for _ in range(400):
        mutated = bytearray(body)
        for _ in range(rng.randint(1, 3)):
            mutated[rng.randrange(len(mutated))] = rng.randrange(256)
        path.write_bytes(bytes(mutated))
        ours = verdict(inspect_model, path)
        theirs = verdict(inspect_by_loading, path)
        assert isinstance(ours, str) == isinstance(theirs, str), bytes(mutated)
        if isinstance(ours, str) and isinstance(theirs, str):
            assert ours.split(":")[0] == theirs.split(":")[0], bytes(mutated)


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def write_big_model(
    path: Path, weight_bytes: int, *, declared_bytes: int | None = None, cut_bytes: int = 0
) -> None:
    """x[batch, n] @ W[n, 1]: W is `weight_bytes` of float32 zeros, written in pieces
    so that the test itself does not hold them; `declared_bytes` lies about their length
    and `cut_bytes` leaves the end of the file off."""
    n = weight_bytes // 4
    declared = weight_bytes if declared_bytes is None else declared_bytes
    header = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[n, 1]).SerializeToString()
    tensor_size = len(header) + 1 + len(_varint(declared)) + declared
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1])],
    )
    graph_head = graph.SerializeToString() + b"\x2a" + _varint(tensor_size) + header
    graph_size = len(graph_head) + 1 + len(_varint(declared)) + declared
    model = helper.make_model(
        helper.make_graph([], "", [], []), opset_imports=[helper.make_opsetid("", 17)]
    )
    model.ir_version = 8
    model.ClearField("graph")
    with path.open("wb") as file:
        file.write(model.SerializeToString() + b"\x3a" + _varint(graph_size) + graph_head)
        file.write(b"\x4a" + _varint(declared))
        zeros = bytes(16 * MiB)
        left = weight_bytes - cut_bytes
        while left > 0:
            file.write(zeros[: min(left, len(zeros))])
            left -= len(zeros)


BIG_WEIGHT_BYTES = 256 * MiB


@pytest.fixture(scope="module")
def big_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("big") / "big.onnx"
    write_big_model(path, BIG_WEIGHT_BYTES)
    return path


def test_a_big_model_is_checked_in_a_small_fraction_of_its_size(big_model: Path) -> None:
    tracemalloc.start()
    try:
        info = inspect_model(big_model)
        _, peak_traced = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.inputs[0].shape == ("batch", BIG_WEIGHT_BYTES // 4)
    assert peak_traced < 16 * MiB
    # The checker's own (C++) memory too: the peak RSS of a fresh process.
    script = textwrap.dedent(
        f"""
        import resource, sys
        from pathlib import Path
        from cloud.models.inspect import inspect_model
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        inspect_model(Path({str(big_model)!r}))
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print((after - before) * 1024)
        """
    )
    growth = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).parents[2],
    )
    assert int(growth.stdout) < 64 * MiB, growth.stdout


@pytest.mark.parametrize(
    ("declared_bytes", "cut_bytes"),
    [
        pytest.param(None, 1, id="cut-one-byte-short"),
        pytest.param(None, 8 * MiB, id="cut-in-the-middle-of-the-weights"),
        pytest.param(8 * MiB + 1, 0, id="length-says-more"),
        pytest.param(8 * MiB - 1, 0, id="length-says-less"),
        pytest.param(2 * 8 * MiB, 0, id="length-says-double"),
    ],
)
def test_truncated_or_misdeclared_weights_are_refused(
    tmp_path: Path, declared_bytes: int | None, cut_bytes: int
) -> None:
    path = tmp_path / "model.onnx"
    write_big_model(path, 8 * MiB, declared_bytes=declared_bytes, cut_bytes=cut_bytes)
    with pytest.raises(InvalidModelError, match=r"^(not an ONNX model|the ONNX checker)"):
        inspect_model(path)
    ours = verdict(inspect_model, path)
    assert isinstance(verdict(inspect_by_loading, path), str), ours


def test_a_whole_big_model_written_by_onnx_gets_the_same_description(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    write_big_model(path, 8 * MiB)
    assert isinstance(assert_same_verdict(path), ModelInfo)
    assert onnx.load(str(path)).graph.initializer[0].raw_data == bytes(8 * MiB)


def model_with_doc_string(doc_bytes: int) -> bytes:
    """A model whose bulk is a node's doc string: kept in memory as it is checked."""
    node = helper.make_node("Identity", ["x"], ["y"], doc_string="A" * doc_bytes)
    return model_with([], [node])


def test_a_model_whose_graph_alone_is_over_the_bound_is_refused_without_reading_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Memory for a check is bounded by the skeleton's bound, not by the upload's size."""
    monkeypatch.setattr(inspect_module, "MAX_SKELETON_BYTES", 1 * MiB, raising=False)
    path = tmp_path / "model.onnx"
    path.write_bytes(model_with_doc_string(1 * MiB - 4096))
    assert isinstance(assert_same_verdict(path), ModelInfo)
    path.write_bytes(model_with_doc_string(16 * MiB))
    tracemalloc.start()
    try:
        with pytest.raises(InvalidModelError, match=r"less the tensors' values, is over 1048576"):
            inspect_model(path)
        _, peak_traced = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak_traced < 4 * MiB
    # Tensor values do not count: 8 MiB of weights pass under a 1 MiB bound.
    write_big_model(path, 8 * MiB)
    assert isinstance(inspect_model(path), ModelInfo)


def test_a_model_of_too_many_fields_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scan is Python: its CPU time is bounded by a count of fields, payload values
    written one by one included (onnx packs them)."""
    monkeypatch.setattr(inspect_module, "MAX_FIELDS", 10_000, raising=False)
    header = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[20_000])
    unpacked = header.SerializeToString() + b"".join(b"\x25" + bytes(4) for _ in range(20_000))
    model = onnx.ModelProto.FromString(model_with([]))
    graph = model.graph.SerializeToString() + b"\x2a" + _varint(len(unpacked)) + unpacked
    model.ClearField("graph")
    path = tmp_path / "model.onnx"
    path.write_bytes(model.SerializeToString() + b"\x3a" + _varint(len(graph)) + graph)
    assert isinstance(verdict(inspect_by_loading, path), ModelInfo)  # a model, if odd
    with pytest.raises(InvalidModelError, match=r"more than 10000 protobuf fields"):
        inspect_model(path)
    packed = numpy_helper.from_array(np.zeros(20_000, np.float32), "w")
    packed.float_data.extend(np.zeros(20_000, np.float32).tolist())
    packed.ClearField("raw_data")
    path.write_bytes(model_with([packed]))
    assert isinstance(inspect_model(path), ModelInfo)
