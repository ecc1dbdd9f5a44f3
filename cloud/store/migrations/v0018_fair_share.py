"""Version 18: fair share (issue 29). Per tenant, its decayed past usage: accelerator-
seconds per kind, each weighted by how long ago it was held (cloud/scheduler/
fair_share.py), as of `as_of`. The scheduling leader advances it every pass and writes
it now and then, so that a new leader and every API replica read the same history."""

from __future__ import annotations

from sqlalchemy import Column, Double, MetaData, Table, Text
from sqlalchemy.engine import Connection

from cloud.store.jsontype import JsonDocument

_metadata = MetaData()

_fair_share_usage = Table(
    "fair_share_usage",
    _metadata,
    Column("tenant", Text, primary_key=True),  # the tenant's name, as the scheduler knows it
    Column("accelerator_seconds", JsonDocument, nullable=False),  # kind -> decayed seconds
    Column("as_of", Double, nullable=False),
)


def upgrade(connection: Connection) -> None:
    _fair_share_usage.create(connection)
