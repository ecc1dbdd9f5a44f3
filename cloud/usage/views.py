"""What a user reads of usage: a work item's `usage` and the rows of `GET /v1/usage`.

Shared by the REST API, the `work.usage` event and the CLI (which decodes these
types; so nothing here imports the store at run time).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal

import msgspec

from shared.csv_cells import csv_text

if TYPE_CHECKING:
    from cloud.store import UsageHour

# cloud.green.energy.J_PER_KWH; not imported: the CLI decodes these types without numpy.
J_PER_KWH = 3.6e6
UsageGroup = Literal["tenant", "zone", "job", "day"]
USAGE_GROUPS: tuple[UsageGroup, ...] = ("tenant", "zone", "job", "day")


class MemberUsage(msgspec.Struct, frozen=True, kw_only=True):
    member_index: int
    node_id: str
    zone: str
    accelerator_kind: str
    energy_kwh: float
    gco2eq_g: float
    # In the one currency its hours were priced in; None (see `costs`) when they differ
    # (a zone's prices lost for a while, the static table's dollars instead).
    cost: float | None
    currency: str | None
    # Per currency; defaulted: a CLI of this version still reads a server that sent none.
    costs: dict[str, float] = msgspec.field(default_factory=dict)
    measured_share: float | None  # of the energy, from counters or power samples
    gap_filled_s: float


class WorkUsage(msgspec.Struct, frozen=True, kw_only=True):
    """A work item's energy, emissions, cost and emissions avoided so far."""

    energy_kwh: float
    gco2eq_g: float
    # In the one currency of its zones; None (see `costs`) when they differ.
    cost: float | None
    currency: str | None
    costs: dict[str, float]
    # The carbon-agnostic baseline's emissions minus these; None: no counterfactual.
    avoided_gco2eq_g: float | None
    measured_share: float | None
    gap_filled_s: float  # telemetry gaps the energy model filled
    fallback: bool  # some of it priced with a fallback grid value
    members: tuple[MemberUsage, ...]


def _share(part: float, whole: float) -> float | None:
    return part / whole if whole > 0 else None


def usage_summary(rows: Iterable[UsageHour]) -> WorkUsage:
    members: dict[tuple[int, str], list[UsageHour]] = {}
    for row in rows:
        members.setdefault((row.member_index, row.node_id), []).append(row)
    member_views = []
    for (member_index, node_id), mine in sorted(members.items()):
        energy_j = sum(r.energy_j for r in mine)
        costs = _costs(mine)
        cost, currency = _in_one_currency(costs)
        member_views.append(
            MemberUsage(
                member_index=member_index,
                node_id=node_id,
                zone=mine[0].zone,
                accelerator_kind=mine[0].accelerator_kind,
                energy_kwh=energy_j / J_PER_KWH,
                gco2eq_g=sum(r.gco2_g for r in mine),
                cost=cost,
                currency=currency,
                costs=costs,
                measured_share=_share(sum(r.measured_j for r in mine), energy_j),
                gap_filled_s=sum(r.gap_s for r in mine),
            )
        )
    every = [row for mine in members.values() for row in mine]
    return _totals(every, tuple(member_views))


def _costs(rows: Iterable[UsageHour]) -> dict[str, float]:
    """The rows' cost per currency (amounts in different currencies are never summed)."""
    costs: dict[str, float] = {}
    for row in rows:
        costs[row.currency] = costs.get(row.currency, 0.0) + row.cost
    return dict(sorted(costs.items()))


def _in_one_currency(costs: dict[str, float]) -> tuple[float | None, str | None]:
    """(cost, currency) where `costs` has one currency (0.0 and None where it has none);
    (None, None) where it has several: their amounts are in `costs`."""
    if len(costs) == 1:
        ((currency, cost),) = costs.items()
        return cost, currency
    return (0.0, None) if not costs else (None, None)


def _totals(rows: Sequence[UsageHour], members: tuple[MemberUsage, ...] = ()) -> WorkUsage:
    energy_j = sum(r.energy_j for r in rows)
    costs = _costs(rows)
    cost, currency = _in_one_currency(costs)
    with_baseline = [r for r in rows if r.counterfactual_gco2_g is not None]
    avoided = (
        sum((r.counterfactual_gco2_g or 0.0) - r.gco2_g for r in with_baseline)
        if with_baseline
        else None
    )
    return WorkUsage(
        energy_kwh=energy_j / J_PER_KWH,
        gco2eq_g=sum(r.gco2_g for r in rows),
        cost=cost,
        currency=currency,
        costs=costs,
        avoided_gco2eq_g=avoided,
        measured_share=_share(sum(r.measured_j for r in rows), energy_j),
        gap_filled_s=sum(r.gap_s for r in rows),
        fallback=any(r.fallback for r in rows),
        members=members,
    )


# ---- GET /v1/usage ---------------------------------------------------------------------


class UsageRow(msgspec.Struct, frozen=True, kw_only=True):
    """One group of `GET /v1/usage`: its key (the grouped-by fields) and its totals."""

    tenant: str | None = None
    zone: str | None = None
    job: str | None = None
    day: str | None = None  # YYYY-MM-DD, UTC
    energy_kwh: float
    gco2eq_g: float
    avoided_gco2eq_g: float | None
    cost: float
    currency: str
    measured_share: float | None
    fallback: bool


class UsageReport(msgspec.Struct, frozen=True, kw_only=True):
    from_: str | None = msgspec.field(default=None, name="from")
    until: str | None = None
    group_by: tuple[UsageGroup, ...]
    rows: tuple[UsageRow, ...]
    totals: tuple[UsageRow, ...]  # one per currency


def _day(hour_start: float) -> str:
    return datetime.fromtimestamp(hour_start, tz=UTC).strftime("%Y-%m-%d")


def usage_report(
    rows: Iterable[UsageHour],
    group_by: Sequence[UsageGroup],
    tenant_names: dict[str, str],
    *,
    from_: str | None = None,
    until: str | None = None,
) -> UsageReport:
    """Rows grouped by `group_by` (and always by currency: amounts never mix)."""
    groups: dict[tuple[str | None, ...], list[UsageHour]] = {}
    for row in rows:
        key = (
            tenant_names.get(row.tenant_id, row.tenant_id) if "tenant" in group_by else None,
            row.zone if "zone" in group_by else None,
            row.work_id if "job" in group_by else None,
            _day(row.hour_start) if "day" in group_by else None,
            row.currency,
        )
        groups.setdefault(key, []).append(row)
    result = [
        _row(members, tenant=k[0], zone=k[1], job=k[2], day=k[3])
        for k, members in sorted(groups.items(), key=lambda item: tuple(v or "" for v in item[0]))
    ]
    by_currency: dict[str, list[UsageHour]] = {}
    for members in groups.values():
        by_currency.setdefault(members[0].currency, []).extend(members)
    totals = tuple(_row(members) for _, members in sorted(by_currency.items()))
    return UsageReport(
        from_=from_, until=until, group_by=tuple(group_by), rows=tuple(result), totals=totals
    )


def _row(members: Sequence[UsageHour], **key: str | None) -> UsageRow:
    total = _totals(members)
    currency = members[0].currency
    return UsageRow(
        **key,
        energy_kwh=total.energy_kwh,
        gco2eq_g=total.gco2eq_g,
        avoided_gco2eq_g=total.avoided_gco2eq_g,
        cost=total.costs.get(currency, 0.0),
        currency=currency,
        measured_share=total.measured_share,
        fallback=total.fallback,
    )


CSV_COLUMNS = (
    "tenant",
    "zone",
    "job",
    "day",
    "energy_kwh",
    "gco2eq_g",
    "avoided_gco2eq_g",
    "cost",
    "currency",
    "measured_share",
    "fallback",
)


def usage_csv(report: UsageReport) -> str:
    """The report's rows as CSV, like `sacct --parsable`: the grouped-by columns, then
    the figures; totals are left to the reader (a spreadsheet sums). Every cell goes
    through `shared.csv_cells`, so text that reads as a formula is escaped."""
    columns = [c for c in CSV_COLUMNS if c not in USAGE_GROUPS or c in report.group_by]
    lines: list[list[str]] = [columns]
    for row in report.rows:
        values = []
        for column in columns:
            value = getattr(row, column)
            if isinstance(value, float):
                # The shortest text that reads back as the same number, as the JSON
                # answer writes it: sums of the CSV are the JSON's to the last digit.
                values.append(repr(value))
            elif value is None:
                values.append("")
            else:
                values.append(str(value).lower() if isinstance(value, bool) else str(value))
        lines.append(values)
    return csv_text(lines)
