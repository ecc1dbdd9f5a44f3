"""Version 24: the attempts greenfed submitted to clusters (`cluster_submissions`).

A control plane knew which attempts it had submitted only in memory: restarted after a
job ended and aged out of a cluster that keeps no accounting, it found no trace of the
attempt and submitted it again (the job ran twice). One row per attempt, claimed before
the cluster is asked, says it was submitted to every control plane after.
"""

from __future__ import annotations

from sqlalchemy import Column, Double, ForeignKey, Integer, MetaData, Table, Text
from sqlalchemy.engine import Connection

_metadata = MetaData()

# Only for the foreign key: the work table as version 1 made it (its id).
_work = Table("work", _metadata, Column("id", Text, primary_key=True))

_cluster_submissions = Table(
    "cluster_submissions",
    _metadata,
    Column("work_id", Text, ForeignKey("work.id", ondelete="CASCADE"), primary_key=True),
    Column("attempt", Integer, primary_key=True, autoincrement=False),
    Column("cluster", Text, nullable=False),
    Column("claimed_at", Double, nullable=False),
)


def upgrade(connection: Connection) -> None:
    _cluster_submissions.create(connection)
