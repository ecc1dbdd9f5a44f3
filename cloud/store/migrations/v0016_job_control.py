"""Version 16: job control (hold, release, suspend, resume, requeue by a person).

`hold` keeps pending work out of the scheduler's queue: "held" (hold, until
released) or "suspended" (suspend, until resumed); NULL: eligible. `requeues`
counts the placements that a person's requeue or suspend ended, so that they do
not use up the attempts that `store.max_attempts` gives to node losses and
preemptions."""

from __future__ import annotations

from sqlalchemy import Integer, Text, text
from sqlalchemy.engine import Connection


def upgrade(connection: Connection) -> None:
    types = connection.dialect.type_compiler_instance
    word, count = types.process(Text()), types.process(Integer())
    connection.execute(text(f"ALTER TABLE work ADD COLUMN hold {word}"))
    connection.execute(text(f"ALTER TABLE work ADD COLUMN requeues {count} NOT NULL DEFAULT 0"))
