"""Version 15: agents that upgrade themselves over the air (issue 27).

- `agent_packages`: one row per agent version the control plane serves: the wheel's
  bytes (a greenfed wheel is about a megabyte; every replica serves it from here) in
  base64 (backups carry rows as JSON), its sha256 and size, the control plane's
  signature, when and by whom it was published.
- `agent_rollouts`: one row per `greenfed nodes upgrade`: the version, the rules (canary
  share, failure share that stops it, bounds) and each node's wave and state (JSON:
  cloud/upgrades/views.py `RolloutState`).
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection


def upgrade(connection: Connection) -> None:
    if connection.dialect.name == "postgresql":
        real, document = "double precision", "json"
    else:
        real, document = "DOUBLE", "TEXT CHECK (json_valid(state))"
    connection.execute(
        text(
            "CREATE TABLE agent_packages ("
            "version TEXT NOT NULL PRIMARY KEY, "
            "sha256 TEXT NOT NULL, "
            "size_bytes BIGINT NOT NULL, "
            "signature TEXT NOT NULL, "
            f"published_at {real} NOT NULL, "
            "published_by TEXT NOT NULL, "
            "content_base64 TEXT NOT NULL)"
        )
    )
    connection.execute(
        text(
            "CREATE TABLE agent_rollouts ("
            "rollout_id TEXT NOT NULL PRIMARY KEY, "
            "version TEXT NOT NULL, "
            "phase TEXT NOT NULL, "
            f"created_at {real} NOT NULL, "
            "created_by TEXT NOT NULL, "
            f"state {document} NOT NULL)"
        )
    )
