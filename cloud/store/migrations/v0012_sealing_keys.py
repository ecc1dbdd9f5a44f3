"""Version 12: the sealing public key a node enrolled with (base64 of its X25519 key):
job secrets are sealed only to a node whose birth announces this key. NULL: none was
pinned (an agent older than schema 1.8, or a node enrolled before)."""

from __future__ import annotations

from sqlalchemy import Text, text
from sqlalchemy.engine import Connection


def upgrade(connection: Connection) -> None:
    key = connection.dialect.type_compiler_instance.process(Text())
    connection.execute(text(f"ALTER TABLE enrolled_nodes ADD COLUMN sealing_public_key {key}"))
