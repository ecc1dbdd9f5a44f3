"""Version 1: tenants, work, allocations, node generations, the event log."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Double,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.engine import Connection

from cloud.store.jsontype import JsonDocument

_metadata = MetaData()

_tenants = Table(
    "tenants",
    _metadata,
    Column("id", Text, primary_key=True),
    Column("name", Text, nullable=False, unique=True),
    Column("token_id", Text, nullable=False, unique=True),
    Column("token_hash", Text, nullable=False),
    Column("quotas", JsonDocument, nullable=False),
    Column("borrowing_limit", JsonDocument, nullable=False),
    Column("cohort", Text, nullable=True, index=True),
    Column("allowed_priorities", JsonDocument, nullable=False),
    Column("admin", Boolean, nullable=False),
    Column("created_at", Double, nullable=False),
)

_work = Table(
    "work",
    _metadata,
    Column("id", Text, primary_key=True),
    Column("tenant_id", Text, ForeignKey("tenants.id"), nullable=False),
    Column("kind", Text, nullable=False),
    Column("spec", JsonDocument, nullable=False),
    Column("priority", Text, nullable=False),
    Column("state", Text, nullable=False),
    Column("state_reason", Text, nullable=True),
    Column("attempts", Integer, nullable=False),
    Column("submitted_at", Double, nullable=False),
    Column("updated_at", Double, nullable=False),
    Column("idempotency_key", Text, nullable=True),
    Column("version", BigInteger, nullable=False),
    UniqueConstraint("tenant_id", "idempotency_key", name="uq_work_idempotency_key"),
    CheckConstraint("kind IN ('training', 'inference')", name="ck_work_kind"),
    CheckConstraint("priority IN ('p0', 'p1', 'p2')", name="ck_work_priority"),
    CheckConstraint(
        "state IN ('pending', 'scheduled', 'running', 'succeeded', 'failed', 'cancelled')",
        name="ck_work_state",
    ),
    CheckConstraint("attempts >= 0", name="ck_work_attempts"),
    CheckConstraint("json_valid(spec)", name="ck_work_spec_json").ddl_if(dialect="sqlite"),
    Index("ix_work_tenant", "tenant_id", "id"),
    Index("ix_work_state", "state", "priority", "id"),
)

_allocations = Table(
    "allocations",
    _metadata,
    Column("work_id", Text, ForeignKey("work.id", ondelete="CASCADE"), primary_key=True),
    Column("member_index", Integer, primary_key=True, autoincrement=False),
    Column("node_id", Text, nullable=False, index=True),
    Column("accelerator_kind", Text, nullable=False),
    Column("accelerators", Integer, nullable=False),
    Column("accelerator_ids", JsonDocument, nullable=False),
    Column("host_memory_bytes", BigInteger, nullable=False),
    Column("started_at", Double, nullable=False),
    Column("expected_end", Double, nullable=True),
    Column("borrowed", Boolean, nullable=False),
    Column("state", Text, nullable=False),
    CheckConstraint("accelerators >= 1", name="ck_allocations_accelerators"),
    CheckConstraint("state IN ('assigned', 'running')", name="ck_allocations_state"),
)

_node_generations = Table(
    "node_generations",
    _metadata,
    Column("node_id", Text, primary_key=True),
    Column("generation", BigInteger, nullable=False),
)

_events = Table(
    "events",
    _metadata,
    # SQLite: INTEGER PRIMARY KEY AUTOINCREMENT, so a sequence number is never reused.
    Column("seq", BigInteger().with_variant(Integer, "sqlite"), primary_key=True),
    Column("tenant_id", Text, nullable=True),
    Column("work_id", Text, nullable=True),
    Column("kind", Text, nullable=False),
    Column("payload", JsonDocument, nullable=False),
    Column("at", Double, nullable=False),
    Column("event_id", Text, nullable=True, unique=True),
    Index("ix_events_tenant", "tenant_id", "seq"),
    sqlite_autoincrement=True,
)


def upgrade(connection: Connection) -> None:
    _metadata.create_all(connection, checkfirst=False)
