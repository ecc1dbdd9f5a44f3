"""Version 14: clusters with schedulers of their own as places to run (issue 26).

- `clusters`: one row per registered cluster: its name, kind (`slurm`), what the admin
  registered (cloud/clusters/views.py `ClusterSpec`, JSON), when and by whom.
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection


def upgrade(connection: Connection) -> None:
    # As version 2 does: PostgreSQL's json; SQLite's text, checked to be valid.
    if connection.dialect.name == "postgresql":
        real, document = "double precision", "json"
    else:
        real, document = "DOUBLE", "TEXT CHECK (json_valid(spec))"
    connection.execute(
        text(
            "CREATE TABLE clusters ("
            "name TEXT NOT NULL PRIMARY KEY, "
            "kind TEXT NOT NULL, "
            f"created_at {real} NOT NULL, "
            "created_by TEXT NOT NULL, "
            f"spec {document} NOT NULL)"
        )
    )
