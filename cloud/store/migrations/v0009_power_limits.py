"""Version 9: carbon-aware power capping. An allocation may hold its devices to a
power limit (watts per device) for its run; NULL: the devices' default limit."""

from __future__ import annotations

from sqlalchemy import Double, text
from sqlalchemy.engine import Connection


def upgrade(connection: Connection) -> None:
    watts = connection.dialect.type_compiler_instance.process(Double())
    connection.execute(text(f"ALTER TABLE allocations ADD COLUMN power_limit_w {watts}"))
