"""Version 3: the model registry (ONNX models uploaded by tenants, `/v1/models`) and
the control plane's shared secrets (the key that signs model download URLs)."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Double,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    Table,
    Text,
)
from sqlalchemy.engine import Connection

from cloud.store.jsontype import JsonDocument

_metadata = MetaData()

# Frozen copy of the referenced table's key only (for the foreign key).
Table("tenants", _metadata, Column("id", Text, primary_key=True))

_models = Table(
    "models",
    _metadata,
    Column("id", Text, primary_key=True),
    Column("tenant_id", Text, ForeignKey("tenants.id"), nullable=False),
    Column("name", Text, nullable=False),
    Column("sha256", Text, nullable=False, index=True),
    Column("size_bytes", BigInteger, nullable=False),
    Column("opset", Integer, nullable=False),
    Column("inputs", JsonDocument, nullable=False),
    Column("outputs", JsonDocument, nullable=False),
    Column("created_at", Double, nullable=False),
    Index("ix_models_tenant", "tenant_id", "id"),
)


_secrets = Table(
    "secrets",
    _metadata,
    Column("name", Text, primary_key=True),
    Column("value", Text, nullable=False),
    Column("created_at", Double, nullable=False),
)


def upgrade(connection: Connection) -> None:
    _models.create(connection, checkfirst=False)
    _secrets.create(connection, checkfirst=False)
