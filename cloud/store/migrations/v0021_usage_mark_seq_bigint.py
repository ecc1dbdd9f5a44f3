"""Version 21: `usage_marks.seq`, the last telemetry sample of a node that usage
accounting counted, as a 64-bit integer on PostgreSQL (it was an int4).

A node's sequence numbers are its own, and one past 2**31 - 1 failed every later usage
flush as a whole, every node's usage with it. The wire bounds them at 2**53
(shared/messages.py `Telemetry.seq`); SQLite's INTEGER already holds 64 bits, so only
PostgreSQL changes. Widening keeps every value, and a replica of the previous release
reads and writes the column as before.
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection


def upgrade(connection: Connection) -> None:
    if connection.dialect.name == "postgresql":
        connection.execute(text("ALTER TABLE usage_marks ALTER COLUMN seq TYPE BIGINT"))
