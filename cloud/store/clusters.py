"""Registered clusters (cloud/clusters/): one row each, what the admin registered kept
as its JSON `ClusterSpec`; and the attempts submitted to them, one row each."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec
import structlog
from sqlalchemy import Row, delete, func, insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from cloud.clusters.views import SPEC_DECODER, ClusterSpec
from cloud.store.engine import Backend
from cloud.store.errors import ClusterExistsError, ClusterNotFoundError, StoreError
from cloud.store.schema import cluster_submissions, clusters
from cloud.store.sql import insert_ignoring


class TooManyClustersError(StoreError):
    """A registration past the cap on registered clusters; nothing was added."""

    def __init__(self, max_clusters: int) -> None:
        super().__init__(f"at most {max_clusters} clusters")
        self.max_clusters = max_clusters


@dataclass(frozen=True, slots=True)
class ClusterRecord:
    spec: ClusterSpec
    created_at: float
    created_by: str  # the admin tenant's id


_log = structlog.get_logger("greenfed.store")


def _record(row: Row[Any]) -> ClusterRecord:
    return ClusterRecord(
        spec=SPEC_DECODER.decode(row.spec),
        created_at=float(row.created_at),
        created_by=row.created_by,
    )


def _readable_records(rows: Any) -> tuple[ClusterRecord, ...]:
    """The registrations today's rules accept. One an earlier greenfed took and these
    refuse (a work_dir with a space, a rest_url with no port) is left out and logged,
    never the reason a control plane cannot start or list the others."""
    records = []
    for row in rows:
        try:
            records.append(_record(row))
        except msgspec.ValidationError as error:
            _log.error(
                "cluster registration no longer valid: not run",
                cluster=row.name,
                error=str(error),
                fix="remove it (greenfed clusters remove NAME) and register it again",
            )
    return tuple(records)


def _removed_record(row: Row[Any]) -> ClusterRecord:
    """What a removal answers: the registration, or where today's rules refuse it, its
    name, zone and region as far as they still pass."""
    try:
        return _record(row)
    except msgspec.ValidationError:
        stored = msgspec.json.decode(row.spec)
        where = (
            {key: stored.get(key) for key in ("zone", "region")} if isinstance(stored, dict) else {}
        )
        try:
            spec = msgspec.convert({"name": row.name, **where}, ClusterSpec)
        except msgspec.ValidationError:
            spec = ClusterSpec(name=row.name, zone="unknown", region="unknown")
        return ClusterRecord(spec, float(row.created_at), row.created_by)


async def insert_cluster(
    connection: AsyncConnection, record: ClusterRecord, *, max_clusters: int
) -> None:
    """Add a registration unless `max_clusters` are registered (`TooManyClustersError`)
    or one of its name is (`ClusterExistsError`). Call holding the clusters lock
    (`Store.add_cluster`): counted and added in one step, a burst of registrations
    cannot each count the same registrations below the cap."""
    count = (await connection.execute(select(func.count()).select_from(clusters))).scalar_one()
    if count >= max_clusters:
        raise TooManyClustersError(max_clusters)
    try:
        await connection.execute(
            insert(clusters).values(
                name=record.spec.name,
                kind=record.spec.kind,
                created_at=record.created_at,
                created_by=record.created_by,
                spec=msgspec.json.encode(record.spec),
            )
        )
    except IntegrityError:
        raise ClusterExistsError(record.spec.name) from None


async def select_clusters(connection: AsyncConnection) -> tuple[ClusterRecord, ...]:
    rows = await connection.execute(select(clusters).order_by(clusters.c.name))
    return _readable_records(rows)


async def delete_cluster(connection: AsyncConnection, name: str) -> ClusterRecord:
    row = (await connection.execute(select(clusters).where(clusters.c.name == name))).first()
    if row is None:
        raise ClusterNotFoundError(name)
    await connection.execute(delete(clusters).where(clusters.c.name == name))
    return _removed_record(row)


async def claim_submission(
    connection: AsyncConnection,
    backend: Backend,
    cluster: str,
    work_id: str,
    attempt: int,
    now: float,
) -> bool:
    """Record that an attempt is submitted to a cluster; False where it was before."""
    statement = insert_ignoring(backend, cluster_submissions, ["work_id", "attempt"]).values(
        work_id=work_id, attempt=attempt, cluster=cluster, claimed_at=now
    )
    result = await connection.execute(statement.returning(cluster_submissions.c.attempt))
    return result.first() is not None
