"""`greenfed usage`: time arguments, and the table a person reads."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta

import pytest

from cloud.usage.views import UsageReport, UsageRow, WorkUsage
from greenfed.usage_commands import parse_when, render_usage, usage_line

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def test_times_are_iso_8601_or_a_time_ago() -> None:
    assert parse_when("24h", now=NOW) == NOW - timedelta(hours=24)
    assert parse_when("7d", now=NOW) == NOW - timedelta(days=7)
    assert parse_when("2026-11-30T08:00:00+01:00") == datetime(2026, 11, 30, 7, tzinfo=UTC)
    assert parse_when("2026-11-30") == datetime(2026, 11, 30, tzinfo=UTC)  # UTC when unsaid
    with pytest.raises(ValueError, match="neither an ISO 8601 time nor a duration"):
        parse_when("last tuesday")


def row(**key: str) -> UsageRow:
    return UsageRow(
        **key, energy_kwh=12.5, gco2eq_g=4_200.0, avoided_gco2eq_g=900.0, cost=1.75,
        currency="EUR", measured_share=1.0, fallback=False,
    )  # fmt: skip


def test_the_table_has_one_row_per_group_and_a_total_per_currency() -> None:
    report = UsageReport(
        group_by=("tenant", "zone"),
        rows=(row(tenant="acme", zone="DE"), row(tenant="acme", zone="FR")),
        totals=(row(),),
    )
    out = io.StringIO()
    render_usage(report, out)
    text = out.getvalue()
    assert text.count("acme") == 2
    assert "total" in text
    assert "12.500 kWh" in text
    assert "4,200.0 g" in text
    assert "1.75 EUR" in text


def test_a_jobs_line_says_what_was_modelled_and_where_a_fallback_priced_it() -> None:
    usage = WorkUsage(
        energy_kwh=0.5, gco2eq_g=150.0, cost=None, currency=None,
        costs={"EUR": 0.05, "USD": 0.02}, avoided_gco2eq_g=None, measured_share=0.8,
        gap_filled_s=120.0, fallback=True, members=(),
    )  # fmt: skip
    line = usage_line(usage)
    assert line.startswith("usage: 0.500 kWh · 150.0 gCO2eq · 0.05 EUR + 0.02 USD")
    assert "avoided –" in line
    assert "80% measured" in line
    assert "120 s modelled" in line
    assert "fallback" in line
