"""Version 4: node enrolment: join tokens (stored as their SHA-256) and the node
identities enrolled with them (`/v1/nodes/join-tokens`, `/v1/nodes/enrol`)."""

from __future__ import annotations

from sqlalchemy import CheckConstraint, Column, Double, Integer, MetaData, Table, Text
from sqlalchemy.engine import Connection

from cloud.store.jsontype import JsonDocument

_metadata = MetaData()

_join_tokens = Table(
    "join_tokens",
    _metadata,
    Column("id", Text, primary_key=True),
    Column("token_sha256", Text, nullable=False, unique=True),
    Column("created_at", Double, nullable=False),
    Column("expires_at", Double, nullable=False),
    Column("max_uses", Integer, nullable=False),
    Column("uses", Integer, nullable=False),
    Column("revoked_at", Double, nullable=True),
    Column("site", Text, nullable=True),
    Column("zone", Text, nullable=True),
    Column("region", Text, nullable=True),
    Column("labels", JsonDocument, nullable=False),
    Column("created_by", Text, nullable=True),
    CheckConstraint("max_uses >= 1", name="ck_join_tokens_max_uses"),
    CheckConstraint("uses >= 0 AND uses <= max_uses", name="ck_join_tokens_uses"),
    CheckConstraint("json_valid(labels)", name="ck_join_tokens_labels_json").ddl_if(
        dialect="sqlite"
    ),
)

_enrolled_nodes = Table(
    "enrolled_nodes",
    _metadata,
    Column("node_id", Text, primary_key=True),
    Column("enrolled_at", Double, nullable=False),
    Column("join_token_id", Text, nullable=True),
    Column("revoked_at", Double, nullable=True),
    Column("username", Text, nullable=True),
)


def upgrade(connection: Connection) -> None:
    _metadata.create_all(connection, checkfirst=False)
