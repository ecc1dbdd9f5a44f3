"""Version 19: a tenant's lending limit (issue 29): per kind, how much of its unused
nominal quota the other members of its cohort may borrow (cloud/scheduler/
hierarchy.py); `{}`, every tenant's until now: all of it."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection


def upgrade(connection: Connection) -> None:
    json_type = "JSON" if connection.dialect.name == "postgresql" else "TEXT"
    connection.execute(
        text(f"ALTER TABLE tenants ADD COLUMN lending_limit {json_type} NOT NULL DEFAULT '{{}}'")
    )
