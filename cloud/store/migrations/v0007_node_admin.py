"""Version 7: what an admin set on a node: cordoned, and taints and labels beside the
ones its agent declares (`/v1/nodes/{id}/cordon`, `PATCH /v1/nodes/{id}`)."""

from __future__ import annotations

from sqlalchemy import Boolean, Column, Double, MetaData, Table, Text
from sqlalchemy.engine import Connection

from cloud.store.jsontype import JsonDocument

_metadata = MetaData()

_node_admin = Table(
    "node_admin",
    _metadata,
    Column("node_id", Text, primary_key=True),
    Column("cordoned", Boolean, nullable=False),
    Column("draining", Boolean, nullable=False),
    Column("taints", JsonDocument, nullable=False),
    Column("labels", JsonDocument, nullable=False),
    Column("updated_at", Double, nullable=False),
)


def upgrade(connection: Connection) -> None:
    _metadata.create_all(connection, checkfirst=False)
