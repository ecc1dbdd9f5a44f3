"""`GET /v1/usage?format=csv` says the same figures as the JSON answer, to the last digit:
a charge-back made from the CSV sums to what the JSON says."""

from __future__ import annotations

import csv
import io

import msgspec

from cloud.store import UsageHour
from cloud.usage.views import usage_csv, usage_report

FIGURES = ("energy_kwh", "gco2eq_g", "avoided_gco2eq_g", "cost", "measured_share")


def hour(job: str, cost: float, kwh: float, baseline_g_per_kwh: float = 401.5) -> UsageHour:
    return UsageHour(
        work_id=job, member_index=0, node_id="n1", hour_start=1_800_000_000.0, tenant_id="t1",
        work_kind="training", zone="DE", accelerator_kind="gpu", energy_j=kwh * 3.6e6,
        measured_j=kwh * 3.6e6, gap_s=0.0, gco2_g=kwh * 400.0, cost=cost, currency="EUR",
        counterfactual_gco2_g=kwh * baseline_g_per_kwh, fallback=False,
    )  # fmt: skip


def test_the_csv_figures_are_the_jsons_to_the_last_digit() -> None:
    rows = [
        hour("job-a", 12_345.67, 61_728.35),
        hour("job-b", 1_234_567.89, 6_172_839.45),
        hour("job-c", 0.000_123_4, 0.000_001_5),
        hour("job-d", 98.76, 543.21, baseline_g_per_kwh=123.4),  # avoided < 0
    ]
    report = usage_report(rows, ("job",), {"t1": "acme"})
    told = msgspec.json.decode(msgspec.json.encode(report))["rows"]
    written = list(csv.DictReader(io.StringIO(usage_csv(report))))
    assert [line["job"] for line in written] == [row["job"] for row in told]
    for line, row in zip(written, told, strict=True):
        for figure in FIGURES:
            assert float(line[figure]) == row[figure], (row["job"], figure, line[figure])
    for figure in FIGURES:
        assert sum(float(line[figure]) for line in written) == sum(row[figure] for row in told)
    assert "12345.67" in usage_csv(report)
