"""Version 10: several bearer tokens per tenant (rotated with an overlap, revoked),
caps on a tenant's running and queued work, and the audit log of admin actions.

Each tenant's existing token moves into `tenant_tokens` (named "initial"), from where
authentication reads it; `tenants.token_id` and `token_hash` stay as they were (SQLite
cannot drop a unique column without rebuilding a table others reference).
"""

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
    text,
)
from sqlalchemy.engine import Connection

from cloud.store.jsontype import JsonDocument

_metadata = MetaData()

# Only for the foreign key below: the table as v0001 made it (nothing is created).
Table("tenants", _metadata, Column("id", Text, primary_key=True))

_tenant_tokens = Table(
    "tenant_tokens",
    _metadata,
    Column("id", Text, primary_key=True),
    Column("tenant_id", Text, ForeignKey("tenants.id"), nullable=False),
    Column("name", Text, nullable=False),
    Column("secret_hash", Text, nullable=False),
    Column("created_at", Double, nullable=False),
    Column("created_by", Text, nullable=True),
    Column("expires_at", Double, nullable=True),
    Column("rotated_at", Double, nullable=True),
    Column("replaced_by", Text, nullable=True),
    Column("revoked_at", Double, nullable=True),
    Column("last_used_at", Double, nullable=True),
    Index("ix_tenant_tokens_tenant", "tenant_id", "id"),
)

_audit_log = Table(
    "audit_log",
    _metadata,
    Column("seq", BigInteger().with_variant(Integer, "sqlite"), primary_key=True),
    Column("at", Double, nullable=False),
    Column("actor_id", Text, nullable=False),
    Column("actor", Text, nullable=False),
    Column("action", Text, nullable=False),
    Column("target", Text, nullable=False),
    Column("detail", JsonDocument, nullable=False),
    Index("ix_audit_log_at", "at"),
    Index("ix_audit_log_actor", "actor", "seq"),
    Index("ix_audit_log_action", "action", "seq"),
    sqlite_autoincrement=True,
)


def upgrade(connection: Connection) -> None:
    count = connection.dialect.type_compiler_instance.process(Integer())
    for column in ("max_running", "max_queued"):
        connection.execute(text(f"ALTER TABLE tenants ADD COLUMN {column} {count}"))
    _metadata.create_all(connection, tables=[_tenant_tokens, _audit_log], checkfirst=False)
    connection.execute(
        text(
            "INSERT INTO tenant_tokens (id, tenant_id, name, secret_hash, created_at) "
            "SELECT token_id, id, 'initial', token_hash, created_at FROM tenants"
        )
    )
