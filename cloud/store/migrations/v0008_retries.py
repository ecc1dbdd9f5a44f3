"""Version 8: a training job's own failures, retried by its `max_retries` policy:
how many it has had (apart from infrastructure losses, which `attempts` bounds) and
the earliest time its next attempt may be placed (the backoff)."""

from __future__ import annotations

from sqlalchemy import Double, Integer, text
from sqlalchemy.engine import Connection


def upgrade(connection: Connection) -> None:
    types = connection.dialect.type_compiler_instance
    count, seconds = types.process(Integer()), types.process(Double())
    connection.execute(text(f"ALTER TABLE work ADD COLUMN failures {count} NOT NULL DEFAULT 0"))
    connection.execute(text(f"ALTER TABLE work ADD COLUMN not_before {seconds}"))
