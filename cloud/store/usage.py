"""Live accounting's tables: usage per allocation and hour, how far each node's telemetry
has been counted, and each work item's counterfactual.

A flush adds to the hour rows (`INSERT ... ON CONFLICT DO UPDATE SET x = x + new`) and
moves the nodes' marks (deleting those of nodes that left the fleet) in the same
transaction, under the scheduling lease: what was
counted and the record of having counted it never part, and a replica that lost
leadership cannot add what the new leader counts again.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
from sqlalchemy import ColumnElement, Text, and_, case, delete, func, literal, select, true
from sqlalchemy.ext.asyncio import AsyncConnection

from cloud.store.engine import Backend
from cloud.store.records import NewEvent
from cloud.store.schema import events, usage_counterfactuals, usage_hours, usage_marks
from cloud.store.sql import chunks, dialect_insert

_COUNTERS = msgspec.json.Decoder(dict[str, float])
_FACTORS = msgspec.json.Decoder(dict[str, float])


@dataclass(frozen=True, slots=True)
class UsageHour:
    """One allocation's usage within one UTC hour (or what a flush adds to it)."""

    work_id: str
    member_index: int
    node_id: str
    hour_start: float
    tenant_id: str
    work_kind: str
    zone: str
    accelerator_kind: str
    energy_j: float  # PUE applied
    measured_j: float
    gap_s: float
    gco2_g: float
    cost: float
    currency: str
    counterfactual_gco2_g: float | None
    fallback: bool


@dataclass(frozen=True, slots=True)
class UsageMark:
    node_id: str
    instance_id: str
    seq: int
    sampled_at: float
    energy_j: Mapping[str, float]


@dataclass(frozen=True, slots=True)
class CounterfactualRecord:
    work_id: str
    tenant_id: str
    decided_at: float
    baseline: str
    # The baseline's kWh per zone for each kWh the work uses; None: it would not have
    # run the work then.
    zone_factors: Mapping[str, float] | None


@dataclass(frozen=True, slots=True)
class UsageWrite:
    rows: Sequence[UsageHour] = ()
    marks: Sequence[UsageMark] = ()
    counterfactuals: Sequence[CounterfactualRecord] = ()
    events: Sequence[NewEvent] = ()  # e.g. the final figures of work that ended
    # Nodes that left the fleet, their last usage in `rows` or written before: their
    # marks are deleted.
    departed: Sequence[str] = ()


def _upsert_usage(backend: Backend) -> Any:
    statement = dialect_insert(backend, usage_hours)
    excluded = statement.excluded
    current = usage_hours.c
    return statement.on_conflict_do_update(
        index_elements=["work_id", "member_index", "node_id", "hour_start"],
        set_={
            "energy_j": current.energy_j + excluded.energy_j,
            "measured_j": current.measured_j + excluded.measured_j,
            "gap_s": current.gap_s + excluded.gap_s,
            "gco2_g": current.gco2_g + excluded.gco2_g,
            # Amounts in two currencies are never summed: an hour priced in another
            # currency than its row's first (a zone's prices lost, the static table's
            # dollars instead) adds its energy and emissions, not its cost, and the row
            # is flagged as priced by fallback.
            "cost": case(
                (current.currency == excluded.currency, current.cost + excluded.cost),
                else_=current.cost,
            ),
            # NULL + x stays NULL: a row with no counterfactual keeps none.
            "counterfactual_gco2_g": current.counterfactual_gco2_g + excluded.counterfactual_gco2_g,
            "fallback": current.fallback
            | excluded.fallback
            | (current.currency != excluded.currency),
            "updated_at": excluded.updated_at,
        },
    )


UsageKey = tuple[str, int, str, float]  # work id, member index, node id, hour start


def usage_key(row: UsageHour) -> UsageKey:
    return (row.work_id, row.member_index, row.node_id, row.hour_start)


def as_added(row: UsageHour, held_currency: str, *, held_counterfactual: bool = True) -> UsageHour:
    """What `row` adds to its hour row, whose currency is `held_currency` (`_upsert_usage`'s
    rule): everything where the currencies agree; else its energy and emissions and no
    cost, under the hour row's currency, flagged as priced by fallback. Its counterfactual
    only where the hour row keeps one (`held_counterfactual`: NULL + x stays NULL)."""
    if not held_counterfactual and row.counterfactual_gco2_g is not None:
        row = dataclasses.replace(row, counterfactual_gco2_g=None)
    if row.currency == held_currency:
        return row
    return dataclasses.replace(row, cost=0.0, currency=held_currency, fallback=True)


def added_to(held: UsageHour, row: UsageHour) -> UsageHour:
    """The hour row `held` once `row` (of the same key) is added to it, by the rule the
    store adds by (`_upsert_usage`): for figures told before the write commits."""
    added = as_added(row, held.currency, held_counterfactual=held.counterfactual_gco2_g is not None)
    return dataclasses.replace(
        held,
        energy_j=held.energy_j + added.energy_j,
        measured_j=held.measured_j + added.measured_j,
        gap_s=held.gap_s + added.gap_s,
        gco2_g=held.gco2_g + added.gco2_g,
        cost=held.cost + added.cost,
        counterfactual_gco2_g=None
        if held.counterfactual_gco2_g is None or added.counterfactual_gco2_g is None
        else held.counterfactual_gco2_g + added.counterfactual_gco2_g,
        fallback=held.fallback or added.fallback,
    )


async def add_usage(
    connection: AsyncConnection, backend: Backend, rows: Sequence[UsageHour], at: float
) -> list[UsageHour]:
    """One statement, executed for every row (compiled once, whatever the batch). Returns
    the rows as added (`as_added`, in the order given): a row priced in another currency
    than its hour row's first adds no cost, and one whose hour row has no counterfactual
    adds none, which a count of what was added (the usage counters on /metrics) must not
    count either."""
    if not rows:
        return []
    ordered = sorted(rows, key=usage_key)
    c = usage_hours.c
    statement = _upsert_usage(backend).returning(
        c.work_id, c.member_index, c.node_id, c.hour_start, c.currency, c.counterfactual_gco2_g
    )
    result = await connection.execute(
        statement, [{**_usage_values(row), "updated_at": at} for row in ordered]
    )
    # The hour rows as they stand now: one without a counterfactual had none before
    # either, or the row added none.
    held = {
        (found.work_id, int(found.member_index), found.node_id, float(found.hour_start)): (
            found.currency,
            found.counterfactual_gco2_g is not None,
        )
        for found in result
    }
    added = []
    for row in rows:
        currency, counterfactual = held.get(
            usage_key(row), (row.currency, row.counterfactual_gco2_g is not None)
        )
        added.append(as_added(row, currency, held_counterfactual=counterfactual))
    return added


def _usage_values(row: UsageHour) -> dict[str, Any]:
    return {
        "work_id": row.work_id,
        "member_index": row.member_index,
        "node_id": row.node_id,
        "hour_start": row.hour_start,
        "tenant_id": row.tenant_id,
        "work_kind": row.work_kind,
        "zone": row.zone,
        "accelerator_kind": row.accelerator_kind,
        "energy_j": row.energy_j,
        "measured_j": row.measured_j,
        "gap_s": row.gap_s,
        "gco2_g": row.gco2_g,
        "cost": row.cost,
        "currency": row.currency,
        "counterfactual_gco2_g": row.counterfactual_gco2_g,
        "fallback": row.fallback,
    }


async def put_marks(
    connection: AsyncConnection, backend: Backend, marks: Sequence[UsageMark]
) -> None:
    if not marks:
        return
    statement = dialect_insert(backend, usage_marks)
    excluded = statement.excluded
    statement = statement.on_conflict_do_update(
        index_elements=["node_id"],
        set_={
            "instance_id": excluded.instance_id,
            "seq": excluded.seq,
            "sampled_at": excluded.sampled_at,
            "energy_j": excluded.energy_j,
        },
    )
    # Every node with a new sample has a new mark: 10,000 rows a flush at 10,000 nodes.
    # Their parameters are made in a worker thread and sent a chunk at a time, so that no
    # step holds the event loop for all of them (SQLAlchemy processes each chunk's
    # parameters on the loop).
    rows = await asyncio.to_thread(_mark_rows, marks)
    for batch in chunks(rows):
        await connection.execute(statement, batch)


def _mark_rows(marks: Sequence[UsageMark]) -> list[dict[str, Any]]:
    return [
        {
            "node_id": mark.node_id,
            "instance_id": mark.instance_id,
            "seq": mark.seq,
            "sampled_at": mark.sampled_at,
            "energy_j": msgspec.json.encode({k: float(v) for k, v in mark.energy_j.items()}),
        }
        for mark in sorted(marks, key=lambda m: m.node_id)
    ]


async def delete_marks(connection: AsyncConnection, node_ids: Sequence[str]) -> None:
    """Forget the marks of nodes that left the fleet (revoked), their last usage counted."""
    for batch in chunks(sorted(set(node_ids))):
        await connection.execute(delete(usage_marks).where(usage_marks.c.node_id.in_(batch)))


async def select_marks(connection: AsyncConnection) -> dict[str, UsageMark]:
    rows = await connection.execute(select(usage_marks))
    return {
        row.node_id: UsageMark(
            node_id=row.node_id,
            instance_id=row.instance_id,
            seq=int(row.seq),
            sampled_at=float(row.sampled_at),
            energy_j=_COUNTERS.decode(row.energy_j),
        )
        for row in rows
    }


async def put_counterfactuals(
    connection: AsyncConnection, backend: Backend, records: Sequence[CounterfactualRecord]
) -> None:
    """The first decision for a work item stands: a later one is ignored."""
    for batch in chunks(sorted(records, key=lambda r: r.work_id)):
        statement = dialect_insert(backend, usage_counterfactuals).values(
            [
                {
                    "work_id": record.work_id,
                    "tenant_id": record.tenant_id,
                    "decided_at": record.decided_at,
                    "baseline": record.baseline,
                    "zone_factors": None
                    if record.zone_factors is None
                    else msgspec.json.encode(dict(record.zone_factors)),
                }
                for record in batch
            ]
        )
        await connection.execute(statement.on_conflict_do_nothing(index_elements=["work_id"]))


async def select_counterfactuals(
    connection: AsyncConnection, work_ids: Sequence[str]
) -> dict[str, CounterfactualRecord]:
    result: dict[str, CounterfactualRecord] = {}
    for batch in chunks(sorted(set(work_ids))):
        rows = await connection.execute(
            select(usage_counterfactuals).where(usage_counterfactuals.c.work_id.in_(batch))
        )
        for row in rows:
            result[row.work_id] = CounterfactualRecord(
                work_id=row.work_id,
                tenant_id=row.tenant_id,
                decided_at=float(row.decided_at),
                baseline=row.baseline,
                zone_factors=None
                if row.zone_factors is None
                else _FACTORS.decode(row.zone_factors),
            )
    return result


async def select_untold_work(
    connection: AsyncConnection, since_s: float, told_event_id_prefix: str
) -> dict[str, str]:
    """Work id -> tenant id of the work with usage in hours starting at or after
    `since_s` and no event `told_event_id_prefix + work id` (its final figures, not
    told yet): a range of the hour index, and a look-up of the events' unique ids."""
    c = usage_hours.c
    told = (
        select(events.c.seq)
        .where(events.c.event_id == literal(told_event_id_prefix, Text) + c.work_id)
        .exists()
    )
    rows = await connection.execute(
        select(c.work_id, c.tenant_id).where(c.hour_start >= since_s, ~told).distinct()
    )
    return {row.work_id: row.tenant_id for row in rows}


@dataclass(frozen=True, slots=True)
class UsageQuery:
    tenant_id: str | None = None  # None: every tenant (the admin)
    work_ids: Sequence[str] | None = None
    from_s: float | None = None  # hour rows starting at or after
    until_s: float | None = None  # hour rows starting before


def _where(query: UsageQuery) -> list[ColumnElement[bool]]:
    conditions: list[ColumnElement[bool]] = []
    if query.tenant_id is not None:
        conditions.append(usage_hours.c.tenant_id == query.tenant_id)
    if query.from_s is not None:
        conditions.append(usage_hours.c.hour_start >= query.from_s)
    if query.until_s is not None:
        conditions.append(usage_hours.c.hour_start < query.until_s)
    return conditions


async def select_usage(connection: AsyncConnection, query: UsageQuery) -> list[UsageHour]:
    conditions = _where(query)
    if query.work_ids is not None:
        result: list[UsageHour] = []
        for batch in chunks(sorted(set(query.work_ids))):
            rows = await connection.execute(
                select(usage_hours).where(and_(usage_hours.c.work_id.in_(batch), *conditions))
            )
            result.extend(_usage_hour(row) for row in rows)
        return sorted(result, key=_order)
    rows = await connection.execute(select(usage_hours).where(and_(true(), *conditions)))
    return sorted((_usage_hour(row) for row in rows), key=_order)


def _order(row: UsageHour) -> tuple[float, str, int, str]:
    return (row.hour_start, row.work_id, row.member_index, row.node_id)


def _usage_hour(row: Any) -> UsageHour:
    return UsageHour(
        work_id=row.work_id,
        member_index=int(row.member_index),
        node_id=row.node_id,
        hour_start=float(row.hour_start),
        tenant_id=row.tenant_id,
        work_kind=row.work_kind,
        zone=row.zone,
        accelerator_kind=row.accelerator_kind,
        energy_j=float(row.energy_j),
        measured_j=float(row.measured_j),
        gap_s=float(row.gap_s),
        gco2_g=float(row.gco2_g),
        cost=float(row.cost),
        currency=row.currency,
        counterfactual_gco2_g=None
        if row.counterfactual_gco2_g is None
        else float(row.counterfactual_gco2_g),
        fallback=bool(row.fallback),
    )


@dataclass(frozen=True, slots=True)
class UsageTotal:
    tenant_id: str
    zone: str
    currency: str
    energy_j: float
    gco2_g: float
    cost: float
    # Over the rows that have a counterfactual: the baseline's emissions, and the work's.
    counterfactual_gco2_g: float
    gco2_with_counterfactual_g: float

    @property
    def avoided_gco2_g(self) -> float:
        return self.counterfactual_gco2_g - self.gco2_with_counterfactual_g


async def select_totals(connection: AsyncConnection) -> list[UsageTotal]:
    """Everything ever counted, per tenant, zone and currency (the metrics' start)."""
    c = usage_hours.c
    compared = case((c.counterfactual_gco2_g.is_not(None), c.gco2_g), else_=0.0)
    rows = await connection.execute(
        select(
            c.tenant_id,
            c.zone,
            c.currency,
            func.sum(c.energy_j),
            func.sum(c.gco2_g),
            func.sum(c.cost),
            func.sum(c.counterfactual_gco2_g),
            func.sum(compared),
        ).group_by(c.tenant_id, c.zone, c.currency)
    )
    return [
        UsageTotal(
            tenant_id=row[0],
            zone=row[1],
            currency=row[2],
            energy_j=float(row[3] or 0.0),
            gco2_g=float(row[4] or 0.0),
            cost=float(row[5] or 0.0),
            counterfactual_gco2_g=float(row[6] or 0.0),
            gco2_with_counterfactual_g=float(row[7] or 0.0),
        )
        for row in rows
    ]
