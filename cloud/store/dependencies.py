"""Dependency rows: what work waits for, written with the work and never changed.

The rule (when a dependency holds, when it never will) is `cloud.work.dependencies`;
the store only keeps the edges and reads them with the states of the jobs they name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Select, and_, select
from sqlalchemy.ext.asyncio import AsyncConnection

from cloud.store.records import DependencyRecord, NewDependency, WorkLinks, WorkRecord
from cloud.store.rows import work_from_row
from cloud.store.schema import WORK_RECORD_COLUMNS, work, work_dependencies
from cloud.store.sql import chunks
from cloud.store.states import parse_state
from shared.work_literals import DEPENDENCY_CONDITIONS, DependencyCondition


async def insert_dependencies(
    connection: AsyncConnection, work_id: str, dependencies: Sequence[NewDependency]
) -> None:
    await insert_dependencies_of(connection, [(work_id, dependencies)])


async def insert_dependencies_of(
    connection: AsyncConnection,
    dependencies_by_work: Sequence[tuple[str, Sequence[NewDependency]]],
) -> None:
    """The dependency rows of many work items (a job array's tasks) as one batched
    insert per chunk of rows, not one statement per item."""
    rows = [
        {
            "work_id": work_id,
            "position": position,
            "job_id": dependency.job_id,
            "condition": dependency.condition,
        }
        for work_id, dependencies in dependencies_by_work
        for position, dependency in enumerate(dependencies)
    ]
    for rows_part in chunks(rows):
        await connection.execute(work_dependencies.insert(), rows_part)


def _parse_condition(text: str) -> DependencyCondition:
    for condition in DEPENDENCY_CONDITIONS:
        if condition == text:
            return condition
    raise ValueError(f"unknown dependency condition {text!r}")


def _record(row: Any) -> DependencyRecord:
    return DependencyRecord(
        work_id=row.work_id,
        position=int(row.position),
        job_id=row.job_id,
        condition=_parse_condition(row.condition),
        job_state=parse_state(row.job_state),
        job_reason=row.job_reason,
    )


def _with_job_state() -> Select[Any]:
    """Dependency rows with the state of the job each names."""
    job = work.alias("job")
    return select(
        work_dependencies,
        job.c.state.label("job_state"),
        job.c.state_reason.label("job_reason"),
    ).join(job, job.c.id == work_dependencies.c.job_id)


async def select_waiting(connection: AsyncConnection) -> tuple[DependencyRecord, ...]:
    """The dependencies of every pending work item, with its jobs' states (for the
    scheduling loop's snapshot, in the snapshot's transaction)."""
    query = (
        _with_job_state()
        .join(work, work.c.id == work_dependencies.c.work_id)
        .where(work.c.state == "pending")
        .order_by(work_dependencies.c.work_id, work_dependencies.c.position)
    )
    return tuple(_record(row) for row in await connection.execute(query))


async def select_links(connection: AsyncConnection, tenant_id: str, work_id: str) -> WorkLinks:
    """What the tenant's work waits for and what waits for it, with the other side's
    records (jobs it needs in its depends_on order, dependents oldest first)."""
    needs_query = (
        _with_job_state()
        .where(work_dependencies.c.work_id == work_id)
        .order_by(work_dependencies.c.position)
    )
    needs = [_record(row) for row in await connection.execute(needs_query)]
    by_query = (
        _with_job_state()
        .where(work_dependencies.c.job_id == work_id)
        .order_by(work_dependencies.c.work_id)
    )
    needed_by = [_record(row) for row in await connection.execute(by_query)]
    others = await _records(
        connection, tenant_id, [d.job_id for d in needs] + [d.work_id for d in needed_by]
    )
    return WorkLinks(
        needs=tuple((d, others[d.job_id]) for d in needs if d.job_id in others),
        needed_by=tuple((d, others[d.work_id]) for d in needed_by if d.work_id in others),
    )


async def select_edges(
    connection: AsyncConnection, tenant_id: str, work_ids: Sequence[str]
) -> dict[str, tuple[str, ...]]:
    """Per work id given (the tenant's only): the job ids it waits for, in order."""
    edges: dict[str, list[str]] = {}
    for batch in chunks(sorted(set(work_ids))):
        query = (
            select(work_dependencies.c.work_id, work_dependencies.c.job_id)
            .join(work, work.c.id == work_dependencies.c.work_id)
            .where(and_(work.c.tenant_id == tenant_id, work_dependencies.c.work_id.in_(batch)))
            .order_by(work_dependencies.c.work_id, work_dependencies.c.position)
        )
        for dependent, job_id in await connection.execute(query):
            edges.setdefault(dependent, []).append(job_id)
    return {dependent: tuple(jobs) for dependent, jobs in edges.items()}


async def select_tenant_work(
    connection: AsyncConnection, tenant_id: str, work_ids: Sequence[str]
) -> Mapping[str, WorkRecord]:
    """The tenant's work among `work_ids`, by id (another tenant's ids are not there)."""
    return await _records(connection, tenant_id, work_ids)


async def _records(
    connection: AsyncConnection, tenant_id: str, work_ids: Sequence[str]
) -> dict[str, WorkRecord]:
    found: dict[str, WorkRecord] = {}
    for batch in chunks(sorted(set(work_ids))):
        query = select(*WORK_RECORD_COLUMNS).where(
            work.c.tenant_id == tenant_id, work.c.id.in_(batch)
        )
        for row in await connection.execute(query):
            record = work_from_row(row)
            found[record.work_id] = record
    return found
