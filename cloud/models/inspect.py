"""Is this file an ONNX model, and what does it take and give?

`onnx.checker` decides validity (the same checks ONNX Runtime's loader relies on);
the graph's inputs (less its initializers, which older exporters list as inputs too)
and outputs are described by name, numpy dtype and shape, where a dimension is a
size, a symbolic name such as "batch", or unknown.

Memory stays small whatever the weights weigh: the file is read as protobuf wire
format, field by field with seeks, and rebuilt in memory as a *skeleton*, the same
model in which every tensor's payload (`raw_data`, `float_data`, ...) is left out and
the tensor marked as stored externally at `#greenfed-unread` (a location the checker
does not look up). The checker then checks the skeleton's graph, nodes, types and
tensor headers; what it would have checked of the payloads (one value field, of the
right kind for the data type, holding enough values for the shape) is checked here
from the counted payload sizes, with the checker's own messages. A file that ends
inside a field, or whose lengths and varints do not add up, is not a model. Nor is one
that writes a singular field holding a tensor twice in one message (an attribute's `t`
or `sparse_tensor`, a sparse tensor's `values`): protobuf would merge the two into one
tensor (dims appended, the last `raw_data` kept) whose payloads were counted apart, and
no ONNX writer does it. Other fields written twice are merged in the skeleton as in the
file, so the checker sees what a whole load would.

Kept in memory as they are: every field that is not a tensor payload (names, docs,
shapes, attributes) and the indices of sparse tensors (the checker reads them to
check their range); together at most `MAX_SKELETON_BYTES`, and the whole file at most
`MAX_FIELDS` fields, so that one check's memory and CPU are bounded whatever is sent.

A tensor the uploader stored as external data (anywhere: initializers, attributes,
subgraphs, sparse tensors) is refused: agents download the one .onnx file, and the
checker would look the named file up relative to the control plane's directory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, BinaryIO, Final

import onnx
from onnx import TensorProto, helper

from cloud.store import ModelTensor

_DEFAULT_DOMAINS = ("", "ai.onnx")
Descriptor = Any  # google.protobuf.descriptor.Descriptor (protobuf has no type stubs here)
_PROTOBUF_MAX_BYTES: Final = 2**31 - 1  # protobuf refuses to parse a larger message
_MAX_NESTING: Final = 64  # messages inside messages (graphs in If/Loop nodes, ...)
_WINDOW_BYTES: Final = 1 << 16  # read ahead this much when scanning keys and lengths
_COUNT_BYTES: Final = 1 << 20  # count packed varints this much at a time
_UNREAD_LOCATION: Final = "#greenfed-unread"  # '#': the checker does not open it
# The skeleton (every field but the tensors' values) is held in memory about twice
# while it is checked: bounded, so one check's memory does not grow with the file.
MAX_SKELETON_BYTES: Final = 64 << 20
# The scan is Python, about 2 us a field, and the parsed skeleton about 80 bytes a field
# (measured: 10 million small fields, 17 s and 850 MiB): far more than a large
# transformer's graph has, and what docs/deploy.md sizes the control plane's pod for.
MAX_FIELDS: Final = 10_000_000


class InvalidModelError(ValueError):
    """The file is not a usable ONNX model; the message says why, for the uploader."""


@dataclass(frozen=True, slots=True)
class ModelInfo:
    opset: int
    inputs: tuple[ModelTensor, ...]
    outputs: tuple[ModelTensor, ...]


def _tensor(value: Any) -> ModelTensor:
    if not isinstance(value.name, str):  # protobuf gives bytes where they are not UTF-8
        raise InvalidModelError(f"the name {value.name!r} is not valid UTF-8")
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
        with path.open("rb") as file:
            skeleton = _skeleton(file)
        model = onnx.ModelProto.FromString(skeleton.model_bytes)
    except InvalidModelError:
        raise
    except _MalformedError as error:
        raise InvalidModelError(f"not an ONNX model: {error}") from None
    except Exception as error:  # protobuf's DecodeError, OSError: not a model at all
        raise InvalidModelError(f"not an ONNX model: {error or type(error).__name__}") from None
    if skeleton.payload_faults:
        raise InvalidModelError(f"the ONNX checker rejected it: {skeleton.payload_faults[0]}")
    # Described now and the parsed copy let go before the checker parses its own (the
    # skeleton may be MAX_SKELETON_BYTES); the checker's verdict still comes first.
    described: ModelInfo | InvalidModelError
    try:
        described = _describe(model)
    except InvalidModelError as error:
        described = error
    del model
    try:
        onnx.checker.check_model(skeleton.model_bytes)
    except onnx.checker.ValidationError as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else "invalid"
        raise InvalidModelError(f"the ONNX checker rejected it: {first_line}") from None
    except UnicodeDecodeError:  # its message quotes a name that is not UTF-8
        raise InvalidModelError(
            "the ONNX checker rejected it: a name in the model is not valid UTF-8"
        ) from None
    if isinstance(described, InvalidModelError):
        raise described
    return described


def _describe(model: onnx.ModelProto) -> ModelInfo:
    opsets = [o.version for o in model.opset_import if o.domain in _DEFAULT_DOMAINS]
    if not opsets:
        raise InvalidModelError("it imports no default-domain opset")
    initializers = {init.name for init in model.graph.initializer}
    inputs = tuple(_tensor(v) for v in model.graph.input if v.name not in initializers)
    outputs = tuple(_tensor(v) for v in model.graph.output)
    if not inputs or not outputs:
        raise InvalidModelError("the graph has no inputs or no outputs")
    return ModelInfo(opset=int(max(opsets)), inputs=inputs, outputs=outputs)


@dataclass(frozen=True, slots=True)
class _Skeleton:
    model_bytes: bytes  # a serialized ModelProto without tensor payloads
    payload_faults: tuple[str, ...]  # what the checker would say of the left-out payloads


def _skeleton(file: BinaryIO) -> _Skeleton:
    """Raises `_MalformedError` where the wire format does not hold together."""
    size = file.seek(0, 2)
    if size > _PROTOBUF_MAX_BYTES:
        raise _MalformedError(
            f"{size} bytes is over protobuf's 2 GiB limit (a model served here is one file)"
        )
    scanner = _Scanner(_Wire(file, size))
    model_buffer = scanner.message(onnx.ModelProto.DESCRIPTOR, size, depth=0)
    model_bytes = bytes(model_buffer)  # the checker takes bytes only
    del model_buffer
    return _Skeleton(model_bytes, tuple(scanner.payload_faults))


class _MalformedError(Exception):
    pass


def _refuse_second_occurrence(
    descriptor: Descriptor, field: int, seen: set[int], key_start: int
) -> None:
    """Protobuf merges two occurrences of a singular field into one tensor (dims
    appended, the last raw_data kept), while each was counted alone here: the merged
    payload would go unchecked, so a second occurrence is refused rather than merged."""
    if field in seen:
        name = descriptor.fields_by_number[field].name
        raise InvalidModelError(
            f"{descriptor.name}.{name} is written twice in one message (again at byte "
            f"{key_start}); protobuf would merge the two into one tensor, which is not "
            "checked here; write it once, as onnx.save does"
        )
    seen.add(field)


def _refuse_external_data(tensor: TensorProto) -> None:
    """Data in another file is refused: agents download the one .onnx file (such a model
    could never be served), and looking the file up here would tell the uploader which
    files the control plane can read."""
    if tensor.data_location == TensorProto.EXTERNAL:
        raise InvalidModelError(
            f"tensor {tensor.name!r} keeps its values in another file (external data); "
            "upload one self-contained .onnx file (onnx.save with "
            "save_as_external_data=False)"
        )


# Wire types (https://protobuf.dev/programming-guides/encoding/).
_VARINT, _FIXED64, _LENGTH, _GROUP_START, _GROUP_END, _FIXED32 = 0, 1, 2, 3, 4, 5


class _Wire:
    """A file read at a position, with a small read-ahead window."""

    def __init__(self, file: BinaryIO, size: int) -> None:
        self._file = file
        self.size = size
        self.pos = 0
        self._window = b""
        self._window_start = 0

    def _byte(self) -> int:
        offset = self.pos - self._window_start
        if not 0 <= offset < len(self._window):
            self._file.seek(self.pos)
            self._window = self._file.read(_WINDOW_BYTES)
            self._window_start = self.pos
            offset = 0
            if not self._window:
                raise _MalformedError(f"the file ends inside a field at byte {self.pos}")
        self.pos += 1
        return self._window[offset]

    def varint(self, end: int) -> int:
        start = self.pos
        value = 0
        for shift in range(0, 70, 7):
            if self.pos >= end:
                raise _MalformedError(f"a varint at byte {start} runs past its message")
            byte = self._byte()
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value
        raise _MalformedError(f"the varint at byte {start} is longer than 10 bytes")

    def read(self, start: int, end: int) -> bytes:
        offset = start - self._window_start
        if offset >= 0 and end - self._window_start <= len(self._window):
            return self._window[offset : end - self._window_start]
        self._file.seek(start)
        data = self._file.read(end - start)
        if len(data) != end - start:
            raise _MalformedError(f"the file ends inside a field at byte {start + len(data)}")
        return data

    def length(self, end: int) -> int:
        """Reads a length prefix; the position is left on the payload's first byte."""
        length = self.varint(end)
        if length > end - self.pos:
            raise _MalformedError(
                f"a field at byte {self.pos} declares {length} bytes; its message has "
                f"{end - self.pos} left (truncated?)"
            )
        return length


_HIGH_BYTES: Final = bytes(range(0x80, 0x100))
_OVERLONG_VARINT: Final = re.compile(rb"[\x80-\xff]{10}")


class _Scanner:
    def __init__(self, wire: _Wire) -> None:
        self.wire = wire
        self.payload_faults: list[str] = []
        self.skeleton_bytes = 0  # what the skeleton holds so far, all messages together
        self.fields = 0  # fields read so far, payload values included

    def message(self, descriptor: Descriptor, end: int, depth: int) -> bytearray:
        """The message from here to `end`, with the payloads of its tensors left out."""
        if depth > _MAX_NESTING:
            raise _MalformedError(f"messages are nested more than {_MAX_NESTING} deep")
        nested = _tensor_holding_fields(descriptor)
        merging = _merging_tensor_fields(descriptor)
        merging_seen: set[int] = set()  # at most the few fields of `merging`
        wire = self.wire
        # One growing buffer, not a list of parts: a field of a few bytes would cost
        # ten times its size as a bytes object of its own.
        body = bytearray()
        while wire.pos < end:
            key_start = wire.pos
            field, wire_type = self._key(end)
            child = nested.get(field) if wire_type == _LENGTH else None
            if child is not None and field in merging:
                _refuse_second_occurrence(descriptor, field, merging_seen, key_start)
            if child is None:
                self._skip_value(field, wire_type, end)
                value = self._read_kept(key_start, wire.pos)
                if (descriptor, field) == _SPARSE_INDICES:  # kept whole, so checked here
                    _refuse_external_data(onnx.SparseTensorProto.FromString(value).indices)
                body += value
                continue
            key = wire.read(key_start, wire.pos)
            length = wire.length(end)
            child_end = wire.pos + length
            if child is TensorProto.DESCRIPTOR:
                child_body = self.tensor(child_end)
            else:
                child_body = self.message(child, child_end, depth + 1)
            body += self._keep(key + _varint(len(child_body)))
            body += child_body
            del child_body  # before the next child is read
        return body

    def _read_kept(self, start: int, end: int) -> bytes:
        """The file's bytes from `start` to `end`, counted (before they are read)
        against the skeleton's bound."""
        self._count_kept(end - start)
        return self.wire.read(start, end)

    def _keep(self, part: bytes) -> bytes:
        """`part`, counted against the skeleton's bound."""
        self._count_kept(len(part))
        return part

    def _count_kept(self, size_bytes: int) -> None:
        self.skeleton_bytes += size_bytes
        if self.skeleton_bytes > MAX_SKELETON_BYTES:
            raise InvalidModelError(
                f"its graph, less the tensors' values, is over {MAX_SKELETON_BYTES} bytes "
                "(names, doc strings, attributes, shapes); that is not a model served here"
            )

    def _key(self, end: int) -> tuple[int, int]:
        self.fields += 1
        if self.fields > MAX_FIELDS:
            raise InvalidModelError(
                f"it has more than {MAX_FIELDS} protobuf fields (write repeated values "
                "packed, as onnx does); that is not a model served here"
            )
        start = self.wire.pos
        key = self.wire.varint(end)
        field, wire_type = key >> 3, key & 7
        if field == 0 or field >= 1 << 29 or wire_type > _FIXED32:
            raise _MalformedError(f"byte {start} does not start a protobuf field")
        return field, wire_type

    def _skip_value(self, field: int, wire_type: int, end: int) -> None:
        wire = self.wire
        if wire_type == _VARINT:
            wire.varint(end)
        elif wire_type in (_FIXED64, _FIXED32):
            width = 8 if wire_type == _FIXED64 else 4
            if width > end - wire.pos:
                raise _MalformedError(f"a field at byte {wire.pos} runs past its message")
            wire.pos += width
        elif wire_type == _LENGTH:
            length = wire.length(end)
            wire.pos += length
        elif wire_type == _GROUP_START:
            while True:  # a group (deprecated): fields up to its end marker
                inner_field, inner_type = self._key(end)
                if inner_type == _GROUP_END:
                    if inner_field != field:
                        raise _MalformedError(f"a group ends at byte {wire.pos} unopened")
                    return
                self._skip_value(inner_field, inner_type, end)
        else:
            raise _MalformedError(f"a group ends at byte {wire.pos} unopened")

    def tensor(self, end: int) -> bytearray:
        """A TensorProto's fields less its payload, marked as stored elsewhere."""
        wire = self.wire
        header = bytearray()  # every field but the payload
        kept = bytearray()  # those, less any `external_data`: the skeleton marks its own
        counts = dict.fromkeys(_PAYLOAD_FIELDS, 0)  # values in each repeated payload field
        raw_data_bytes = 0  # raw_data is a singular field: its last occurrence counts
        while wire.pos < end:
            key_start = wire.pos
            field, wire_type = self._key(end)
            kind = _PAYLOAD_FIELDS.get(field)
            if kind is None or (wire_type != _LENGTH and wire_type != kind):
                # Not a payload, or a wire type protobuf keeps as an unknown field.
                self._skip_value(field, wire_type, end)
                part = self._read_kept(key_start, wire.pos)
                header += part
                if field != _EXTERNAL_DATA:
                    kept += part
            elif wire_type != _LENGTH:  # one unpacked number
                self._skip_value(field, wire_type, end)
                counts[field] += 1
            elif kind == _LENGTH:  # raw_data, or one string of string_data
                length = wire.length(end)
                wire.pos += length
                if field == _RAW_DATA:
                    raw_data_bytes = length
                else:
                    counts[field] += 1
            else:  # packed numbers
                length = wire.length(end)
                counts[field] += self._packed_count(field, kind, length)
        parsed = TensorProto.FromString(header)
        del header
        _refuse_external_data(parsed)
        present = [f for f, count in counts.items() if count] + (
            [_RAW_DATA] if raw_data_bytes else []
        )
        fault = _payload_fault(parsed, present, counts, raw_data_bytes)
        if fault is not None:
            self.payload_faults.append(fault)
        kept += self._keep(_STORED_ELSEWHERE)
        return kept

    def _packed_count(self, field: int, kind: int, length: int) -> int:
        wire = self.wire
        start = wire.pos
        wire.pos += length
        if kind != _VARINT:
            width = 8 if kind == _FIXED64 else 4
            if length % width:
                raise _MalformedError(f"a packed field at byte {start} splits a value")
            return length // width
        # A varint ends on each byte below 0x80; at most 9 bytes of a run continue it.
        count = 0
        tail = b""
        for chunk_start in range(start, start + length, _COUNT_BYTES):
            chunk = wire.read(chunk_start, min(chunk_start + _COUNT_BYTES, start + length))
            count += len(chunk.translate(None, _HIGH_BYTES))
            if _OVERLONG_VARINT.search(tail + chunk):
                raise _MalformedError(f"a varint near byte {chunk_start} is over 10 bytes")
            tail = chunk[-9:]
        if tail and tail[-1] >= 0x80:
            raise _MalformedError(f"a packed field at byte {start} ends inside a varint")
        return count


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


@cache
def _tensor_holding_fields(descriptor: Descriptor) -> dict[int, Descriptor]:
    """The message fields of `descriptor` through which a TensorProto can be reached."""
    fields: dict[int, Descriptor] = {}
    for field in descriptor.fields:
        child = field.message_type
        if child is None or (descriptor, field.number) == _SPARSE_INDICES:
            continue
        if child is TensorProto.DESCRIPTOR or _reaches_tensor(child, frozenset({descriptor})):
            fields[field.number] = child
    return fields


@cache
def _merging_tensor_fields(descriptor: Descriptor) -> frozenset[int]:
    """The singular fields of `descriptor` whose second occurrence protobuf would merge
    into the first one's tensor: singular fields all the way down to a TensorProto (a
    repeated field on the way keeps each occurrence's tensors apart)."""
    return _singular_paths_to_tensor(descriptor, frozenset())


def _singular_paths_to_tensor(
    descriptor: Descriptor, seen: frozenset[Descriptor]
) -> frozenset[int]:
    if descriptor in seen:
        return frozenset()
    return frozenset(
        number
        for number, child in _tensor_holding_fields(descriptor).items()
        if not _is_repeated(descriptor.fields_by_number[number])
        and (
            child is TensorProto.DESCRIPTOR or _singular_paths_to_tensor(child, seen | {descriptor})
        )
    )


def _is_repeated(field: Any) -> bool:
    """Newer protobuf has `is_repeated` (and drops `label`); older has only `label`."""
    is_repeated = getattr(field, "is_repeated", None)
    if is_repeated is not None:
        return bool(is_repeated)
    return bool(field.label == field.LABEL_REPEATED)


def _reaches_tensor(descriptor: Descriptor, seen: frozenset[Descriptor]) -> bool:
    if descriptor is TensorProto.DESCRIPTOR:
        return True
    if descriptor in seen:
        return False
    return any(
        field.message_type is not None and _reaches_tensor(field.message_type, seen | {descriptor})
        for field in descriptor.fields
    )


# The checker reads the indices of a sparse tensor (range, order): they stay.
_SPARSE_INDICES: Final = (onnx.SparseTensorProto.DESCRIPTOR, 2)

_FLOAT_DATA, _INT32_DATA, _STRING_DATA, _INT64_DATA = 4, 5, 6, 7
_RAW_DATA, _DOUBLE_DATA, _UINT64_DATA = 9, 10, 11
_EXTERNAL_DATA, _DATA_LOCATION = 13, 14
_PAYLOAD_FIELDS: Final = {  # field number: the wire type of one value
    _FLOAT_DATA: _FIXED32,
    _INT32_DATA: _VARINT,
    _STRING_DATA: _LENGTH,
    _INT64_DATA: _VARINT,
    _RAW_DATA: _LENGTH,
    _DOUBLE_DATA: _FIXED64,
    _UINT64_DATA: _VARINT,
}
_FIELD_NAMES: Final = {
    number: TensorProto.DESCRIPTOR.fields_by_number[number].name for number in _PAYLOAD_FIELDS
}
_STORED_ELSEWHERE: Final[bytes] = (
    bytes([_DATA_LOCATION << 3 | _VARINT, TensorProto.EXTERNAL])
    + TensorProto(
        external_data=[onnx.StringStringEntryProto(key="location", value=_UNREAD_LOCATION)]
    ).SerializeToString()
)


def _dtypes(*names: str) -> frozenset[int]:
    """The data types of these names that this onnx knows."""
    return frozenset(getattr(TensorProto, name) for name in names if hasattr(TensorProto, name))


# What the checker (onnx/checker.cc, check_tensor) asks of payloads, by data type.
_RAW_BYTES_PER_VALUE: Final = {
    **dict.fromkeys(
        _dtypes("UINT8", "INT8", "BOOL", "FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2")
        | _dtypes("FLOAT8E5M2FNUZ", "FLOAT8E8M0"),
        1,
    ),
    **dict.fromkeys(_dtypes("UINT16", "INT16", "FLOAT16", "BFLOAT16"), 2),
    **dict.fromkeys(_dtypes("FLOAT", "INT32", "UINT32"), 4),
    **dict.fromkeys(_dtypes("DOUBLE", "INT64", "UINT64", "COMPLEX64"), 8),
    **dict.fromkeys(_dtypes("COMPLEX128"), 16),
}
_RAW_VALUES_PER_BYTE: Final = {
    **dict.fromkeys(_dtypes("UINT4", "INT4", "FLOAT4E2M1"), 2),
    **dict.fromkeys(_dtypes("UINT2", "INT2"), 4),
}
_TYPED_FIELD: Final = {  # data type: (field, values per element, elements per value)
    **dict.fromkeys(_dtypes("FLOAT"), (_FLOAT_DATA, 1, 1)),
    **dict.fromkeys(_dtypes("COMPLEX64"), (_FLOAT_DATA, 2, 1)),
    **dict.fromkeys(_dtypes("DOUBLE"), (_DOUBLE_DATA, 1, 1)),
    **dict.fromkeys(_dtypes("COMPLEX128"), (_DOUBLE_DATA, 2, 1)),
    **dict.fromkeys(
        _dtypes("INT32", "UINT8", "INT8", "UINT16", "INT16", "BOOL", "FLOAT16", "BFLOAT16")
        | _dtypes("FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ")
        | _dtypes("FLOAT8E8M0"),
        (_INT32_DATA, 1, 1),
    ),
    **dict.fromkeys(_dtypes("UINT4", "INT4", "FLOAT4E2M1"), (_INT32_DATA, 1, 8)),
    **dict.fromkeys(_dtypes("UINT2", "INT2"), (_INT32_DATA, 1, 16)),
    **dict.fromkeys(_dtypes("INT64"), (_INT64_DATA, 1, 1)),
    **dict.fromkeys(_dtypes("UINT32", "UINT64"), (_UINT64_DATA, 1, 1)),
    **dict.fromkeys(_dtypes("STRING"), (_STRING_DATA, 1, 1)),
}
_INT64_MAX: Final = 2**63 - 1


def _payload_fault(
    tensor: TensorProto, present: list[int], counts: dict[int, int], raw_data_bytes: int
) -> str | None:
    """The checker's complaint about a payload it does not see, or None."""
    name = tensor.name
    if not tensor.HasField("data_type") or tensor.data_type == TensorProto.UNDEFINED:
        return None  # the checker says so itself, from the skeleton
    elements = 1
    for dim in tensor.dims:
        if dim < 0:
            return f"Negative dimension value (tensor name: {name})"
        elements *= dim
        if elements > _INT64_MAX:
            return f"Tensor dimension product overflow (tensor name: {name})"
    if elements == 0 and present:
        return f"TensorProto (tensor name: {name}) is 0-element but contains data!"
    if elements != 0 and len(present) != 1:
        return f"TensorProto (tensor name: {name}) should contain one and only one value field."
    if not present:
        return None
    too_large = (
        f"TensorProto (tensor name: {name}) has a shape too large to validate against its "
        "data type."
    )
    if present == [_RAW_DATA]:
        if tensor.data_type == TensorProto.STRING:
            return f"STRING data (tensor name: {name}) should not be stored in raw_data field"
        if tensor.data_type in _RAW_VALUES_PER_BYTE:
            per_byte = _RAW_VALUES_PER_BYTE[tensor.data_type]
            expected = (elements + per_byte - 1) // per_byte
        else:
            expected = elements * _RAW_BYTES_PER_VALUE.get(tensor.data_type, 0)
            if expected > _INT64_MAX:
                return too_large
        if raw_data_bytes < expected:
            return (
                f"TensorProto (tensor name: {name}) raw_data size ({raw_data_bytes} bytes) is "
                f"too small for the declared shape and type ({expected} bytes required)."
            )
        return None
    (field,) = present
    if tensor.data_type not in _TYPED_FIELD:
        return f"Unrecognized data_type (tensor name: {name}): {tensor.data_type}"
    wanted, per_element, elements_per_value = _TYPED_FIELD[tensor.data_type]
    if field != wanted:
        return (
            f"values of data_type '{tensor.data_type}' should be stored in field "
            f"'{_FIELD_NAMES[wanted]}' instead of '{_FIELD_NAMES[field]}'"
        )
    expected = (elements * per_element + elements_per_value - 1) // elements_per_value
    if expected > _INT64_MAX:
        return too_large
    if counts[field] >= expected:
        return None
    noun = _FIELD_NAMES[field].removesuffix("_data")
    packed = " and packed type" if elements_per_value > 1 else ""
    return (
        f"TensorProto (tensor name: {name}) {_FIELD_NAMES[field]} size ({counts[field]}) "
        f"is too small for the declared shape{packed} ({expected} {noun} values required)."
    )
