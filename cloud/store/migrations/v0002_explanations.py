"""Version 2: the scheduler's latest explanation of each work item (`GET .../explain`)."""

from __future__ import annotations

from sqlalchemy import Double, text
from sqlalchemy.engine import Connection


def upgrade(connection: Connection) -> None:
    dialect = connection.dialect
    seconds = dialect.type_compiler_instance.process(Double())
    if dialect.name == "postgresql":
        document = "json"
    else:
        # As version 1 does for specs: SQLite keeps JSON as text, checked to be valid.
        document = "TEXT CHECK (explanation IS NULL OR json_valid(explanation))"
    connection.execute(text(f"ALTER TABLE work ADD COLUMN explanation {document}"))
    connection.execute(text(f"ALTER TABLE work ADD COLUMN explained_at {seconds}"))
