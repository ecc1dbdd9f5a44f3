"""Version 5: live accounting: energy, emissions and cost per allocation and hour, what
has been counted of each node's telemetry, and each work item's carbon-agnostic
counterfactual (cloud/usage/)."""

from __future__ import annotations

from sqlalchemy import Boolean, Column, Double, Index, Integer, MetaData, Table, Text
from sqlalchemy.engine import Connection

from cloud.store.jsontype import JsonDocument

_metadata = MetaData()

_usage_hours = Table(
    "usage_hours",
    _metadata,
    Column("work_id", Text, primary_key=True),
    Column("member_index", Integer, primary_key=True),
    Column("node_id", Text, primary_key=True),
    Column("hour_start", Double, primary_key=True),
    Column("tenant_id", Text, nullable=False),
    Column("work_kind", Text, nullable=False),
    Column("zone", Text, nullable=False),
    Column("accelerator_kind", Text, nullable=False),
    Column("energy_j", Double, nullable=False),
    Column("measured_j", Double, nullable=False),
    Column("gap_s", Double, nullable=False),
    Column("gco2_g", Double, nullable=False),
    Column("cost", Double, nullable=False),
    Column("currency", Text, nullable=False),
    Column("counterfactual_gco2_g", Double, nullable=True),
    Column("fallback", Boolean, nullable=False),
    Column("updated_at", Double, nullable=False),
    Index("ix_usage_hours_tenant_hour", "tenant_id", "hour_start"),
    Index("ix_usage_hours_hour", "hour_start"),
)

_usage_marks = Table(
    "usage_marks",
    _metadata,
    Column("node_id", Text, primary_key=True),
    Column("instance_id", Text, nullable=False),
    Column("seq", Integer, nullable=False),
    Column("sampled_at", Double, nullable=False),
    Column("energy_j", JsonDocument, nullable=False),
)

_usage_counterfactuals = Table(
    "usage_counterfactuals",
    _metadata,
    Column("work_id", Text, primary_key=True),
    Column("tenant_id", Text, nullable=False),
    Column("decided_at", Double, nullable=False),
    Column("baseline", Text, nullable=False),
    Column("zone_factors", JsonDocument, nullable=True),
)


def upgrade(connection: Connection) -> None:
    _metadata.create_all(connection, checkfirst=False)
