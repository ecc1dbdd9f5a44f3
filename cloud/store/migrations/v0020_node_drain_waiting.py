"""Version 20: what each draining node's drain waits for (`drain_waiting`, issue 28),
as the scheduling leader's latest pass found: written with that pass's commit, so that
every replica of the control plane shows it with the node, not only the leader."""

from __future__ import annotations

from sqlalchemy import Column, MetaData, Table, Text
from sqlalchemy.engine import Connection

from cloud.store.jsontype import JsonDocument

_metadata = MetaData()

_node_drain_waiting = Table(
    "node_drain_waiting",
    _metadata,
    Column("node_id", Text, primary_key=True),
    Column("waiting", JsonDocument, nullable=False),  # why, a list of strings
)


def upgrade(connection: Connection) -> None:
    _node_drain_waiting.create(connection)
