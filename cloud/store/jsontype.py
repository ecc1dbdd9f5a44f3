"""A column type for JSON documents that the store passes through as text.

PostgreSQL stores them as `json` (validated by the server, queryable with psql, and
kept byte for byte, unlike `jsonb`, which reorders keys); SQLite as text. Either way
Python sees the JSON text exactly as it was written, encoded and decoded by msgspec at
the edges, never a `dict[str, Any]` in between.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Text
from sqlalchemy.dialects.postgresql import JSON
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator, TypeEngine


class _PassThroughJson(JSON):
    """`json` whose values are JSON text: SQLAlchemy's asyncpg dialect registers a json
    codec that takes text and returns what the engine's `json_deserializer` makes of
    the text (the store's engine keeps it as text), so no (de)serialiser runs here."""

    def bind_processor(self, dialect: Dialect) -> None:
        return None

    def result_processor(self, dialect: Dialect, coltype: object) -> None:
        return None


class JsonDocument(TypeDecorator[bytes]):
    impl = Text
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "postgresql":
            return dialect.type_descriptor(_PassThroughJson())
        return dialect.type_descriptor(Text())

    def process_bind_param(self, value: bytes | None, dialect: Dialect) -> str | None:
        return None if value is None else value.decode()

    def process_result_value(self, value: object, dialect: Dialect) -> bytes | None:
        if value is None:
            return None
        if isinstance(value, str):
            return value.encode()
        raise TypeError(f"a JSON column returned {type(value).__name__}, expected text")
