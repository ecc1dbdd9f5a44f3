"""`greenfed usage` and the usage lines of `greenfed job`/`deployment`: energy, emissions,
cost and emissions avoided, read from `GET /v1/usage` and the work's `usage`."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TextIO

from rich.console import Console
from rich.table import Table

from cloud.usage.views import UsageReport, UsageRow, WorkUsage
from greenfed.api_client import ApiClient
from greenfed.arguments import EXIT_OK
from greenfed.output import WIDE_COLUMNS, Output, emit

_RELATIVE = re.compile(r"^(\d+)([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_when(text: str, *, now: datetime | None = None) -> datetime:
    """An ISO 8601 time (UTC when it names no offset) or a time ago: 30m, 24h, 7d, 2w."""
    now = now or datetime.now(UTC)
    relative = _RELATIVE.match(text.strip())
    if relative:
        try:
            return now - timedelta(seconds=int(relative[1]) * _UNIT_S[relative[2]])
        except OverflowError:  # before the year 1, or more seconds than a timedelta holds
            raise ValueError(f"{text!r} is further back than any date") from None
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"{text!r} is neither an ISO 8601 time nor a duration like 24h or 7d"
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _amount(value: float | None, unit: str) -> str:
    if value is None:
        return "–"
    if unit == "kWh":
        return f"{value:,.3f} kWh"
    if unit == "g":
        return f"{value / 1000:,.2f} kg" if abs(value) >= 10_000 else f"{value:,.1f} g"
    return f"{value:,.2f} {unit}"


def _share(value: float | None) -> str:
    return "–" if value is None else f"{value:.0%}"


def usage_line(usage: WorkUsage) -> str:
    """One line for `greenfed job`: energy, emissions, cost, avoided, measured share."""
    if usage.currency is not None:
        cost = _amount(usage.cost, usage.currency)
    elif usage.costs:
        cost = " + ".join(_amount(v, c) for c, v in usage.costs.items())
    else:  # nothing priced yet
        cost = _amount(None, "")
    parts = [
        _amount(usage.energy_kwh, "kWh"),
        f"{_amount(usage.gco2eq_g, 'g')}CO2eq",
        cost,
        f"avoided {_amount(usage.avoided_gco2eq_g, 'g')}CO2eq",
        f"{_share(usage.measured_share)} measured",
    ]
    flags = []
    if usage.gap_filled_s:
        flags.append(f"{usage.gap_filled_s:.0f} s modelled for lack of telemetry")
    if usage.fallback:
        flags.append("some priced on a fallback grid value")
    return "usage: " + " · ".join(parts) + (f"  ({'; '.join(flags)})" if flags else "")


def hour_floor(moment: datetime) -> datetime:
    """The start of `moment`'s UTC hour: usage is kept per hour, and the API keeps the
    hours that start at or after `from`, so `--since 30m` taken as it is would leave out
    the hour under way."""
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def period_note(since: datetime) -> str:
    """What `greenfed usage` says of the period it asked for (`since`: its hour)."""
    return f"usage since {since:%Y-%m-%d %H:%M} UTC (rounded down to the hour)"


def render_usage(
    report: UsageReport, out: TextIO, *, wide: bool = False, title: str = "usage"
) -> None:
    """`wide`: also whether a fallback grid value priced a row."""
    table = Table(title=title, title_justify="left")
    keys = list(report.group_by)
    for column in (*keys, "energy", "emissions", "avoided", "cost", "measured"):
        table.add_column(column, justify="left" if column in keys else "right")
    if wide:
        table.add_column("fallback")

    def add(row: UsageRow, label: list[str]) -> None:
        table.add_row(
            *label,
            _amount(row.energy_kwh, "kWh"),
            _amount(row.gco2eq_g, "g"),
            _amount(row.avoided_gco2eq_g, "g"),
            _amount(row.cost, row.currency),
            _share(row.measured_share),
            *(("yes" if row.fallback else "",) if wide else ()),
        )

    for row in report.rows:
        add(row, [getattr(row, key) or "" for key in keys])
    for number, row in enumerate(report.totals):
        if number == 0:
            table.add_section()
        add(row, ["total"] + [""] * (len(keys) - 1))
    width = WIDE_COLUMNS if wide else max(100, Console(file=out).width)
    Console(file=out, width=width, highlight=False).print(table)


@dataclass(frozen=True, slots=True)
class UsageRequest:
    since: datetime | None
    until: datetime | None
    by: str
    tenant: str | None


async def usage(client: ApiClient, request: UsageRequest, output: Output) -> int:
    """`-o csv`: the API's CSV as it came; else as `output` asks (`greenfed.output`)."""
    params = {"group_by": request.by}
    title = "usage"
    if request.since is not None:
        since = hour_floor(request.since)
        params["from"] = since.isoformat()
        if since != request.since:
            title = period_note(since)
            if output.format not in ("table", "wide"):  # the document itself stays the API's
                print(f"greenfed: {title}", file=sys.stderr)
    if request.until is not None:
        params["to"] = request.until.isoformat()
    if request.tenant is not None:
        params["tenant"] = request.tenant
    if output.format == "csv":
        params["format"] = "csv"
    if output.format == "csv":
        _, payload = await client.call("GET", "/v1/usage", params=params)
        output.out.write(payload.decode(errors="replace"))
        if not payload.endswith(b"\n"):
            output.out.write("\n")
        return EXIT_OK
    reply = await client.ask("GET", "/v1/usage", UsageReport, params=params)
    emit(
        output,
        reply.payload,
        lambda: render_usage(reply.value, output.out, wide=output.wide, title=title),
    )
    return EXIT_OK
