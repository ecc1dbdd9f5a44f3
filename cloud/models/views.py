"""REST representations of models: plain msgspec types the CLI decodes without the
database stack."""

from __future__ import annotations

from datetime import datetime

import msgspec


class TensorView(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    dtype: str  # numpy's name: float32, int64, ...
    shape: tuple[int | str | None, ...]  # size, symbolic name ("batch"), or unknown


class ModelView(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    name: str
    sha256: str
    size_bytes: int
    opset: int
    inputs: tuple[TensorView, ...]
    outputs: tuple[TensorView, ...]
    created_at: datetime
    blob_url: str  # GET it for the file (Range requests supported)


class ModelList(msgspec.Struct, frozen=True, kw_only=True):
    items: tuple[ModelView, ...]
    count: int
    next_cursor: str | None
