"""Version 6: events found by the work item they are about (a deployment's latest
scaling decision, shown with it)."""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Index, MetaData, Table, Text
from sqlalchemy.engine import Connection

# The two columns the index needs, as v0001 created them.
_events = Table("events", MetaData(), Column("seq", BigInteger), Column("work_id", Text))


def upgrade(connection: Connection) -> None:
    Index("ix_events_work", _events.c.work_id, _events.c.seq).create(connection)
