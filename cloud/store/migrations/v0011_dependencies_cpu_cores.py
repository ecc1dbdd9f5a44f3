"""Version 11: dependencies between work (a job or deployment waits for the tenant's
training jobs to end as each condition says), and the CPU cores a GPU or NPU training
member holds on its node beside its devices (`cpus_per_worker`)."""

from __future__ import annotations

from sqlalchemy import Column, ForeignKey, Index, Integer, MetaData, Table, Text, text
from sqlalchemy.engine import Connection

_metadata = MetaData()

# Only for the foreign key below: the table as v0001 made it (nothing is created).
Table("work", _metadata, Column("id", Text, primary_key=True))

_work_dependencies = Table(
    "work_dependencies",
    _metadata,
    Column("work_id", Text, ForeignKey("work.id", ondelete="CASCADE"), primary_key=True),
    Column("position", Integer, primary_key=True, autoincrement=False),
    # Not a foreign key: it would take a share lock on the job's row in the submitting
    # transaction, which the scheduling loop locks to update (jobs are never deleted).
    Column("job_id", Text, nullable=False),
    Column("condition", Text, nullable=False),
    Index("ix_work_dependencies_job", "job_id"),
)


def upgrade(connection: Connection) -> None:
    count = connection.dialect.type_compiler_instance.process(Integer())
    connection.execute(
        text(f"ALTER TABLE allocations ADD COLUMN cpu_cores {count} NOT NULL DEFAULT 0")
    )
    _work_dependencies.create(connection)
