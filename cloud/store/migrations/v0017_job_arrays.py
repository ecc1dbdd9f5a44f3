"""Version 17: job arrays (issue 29). Each task of an array is an ordinary training job
(a `work` row); `array_tasks` maps an array's id and a task's index to that job, so an
array is found by its id (`GET /v1/jobs/{array id}`) and a task by `ARRAYID_7`."""

from __future__ import annotations

from sqlalchemy import Column, ForeignKey, Index, Integer, MetaData, Table, Text
from sqlalchemy.engine import Connection

_metadata = MetaData()

# Only for the foreign key below: the table as v0001 made it (nothing is created).
Table("work", _metadata, Column("id", Text, primary_key=True))

_array_tasks = Table(
    "array_tasks",
    _metadata,
    Column("array_id", Text, primary_key=True),
    Column("task_index", Integer, primary_key=True, autoincrement=False),
    Column("work_id", Text, ForeignKey("work.id", ondelete="CASCADE"), nullable=False, unique=True),
    Column("tenant_id", Text, nullable=False),
    Index("ix_array_tasks_tenant", "tenant_id", "array_id"),
)


def upgrade(connection: Connection) -> None:
    _array_tasks.create(connection)
