"""The emissions-avoided panels of deploy/grafana show what was avoided, also when it is
negative (the work emitted more than the carbon-agnostic baseline would have): fed the
series the control plane's usage collector exports, scrape after scrape, promtool's
engine gives each panel the figure the accountant counted. And no panel or alert takes
`increase()` or `rate()` of a series that is not a counter: those read every drop as a
restart of the process that counts."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from cloud.fleet.registry import NodeRegistry
from cloud.store import UsageHour
from cloud.usage.accountant import Accountant, TenantTotals
from cloud.usage.metrics import UsageCollector
from shared.settings import UsageSettings
from tests.deploy.test_grafana_dashboards import (
    GRAFANA,
    all_panels,
    load,
    substitute,
    substituted_expressions,
    variable_values,
)
from tests.deploy.test_prometheus_rules import alert_rules
from tests.support.exported_metrics import exported_scrape, exposed_families
from tests.support.system_tools import require_tool

DASHBOARD = GRAFANA / "dashboards" / "greenfed-green.json"
STEP_S = 15  # the shipped scrape interval, which the dashboards' tests assume
STEPS = 2 * 3600 // STEP_S  # two hours of scrapes; the panels read the last (`$__range`)
RANGE_STEPS = 3600 // STEP_S  # `$__range` as the dashboards' tests substitute it: 1 h
# Each flush between two scrapes: the work emits 10 g where the baseline would have
# emitted 9 g (it ran somewhere dirtier, say for its latency or its price).
EMITTED_G, BASELINE_G = 10.0, 9.0
TOLERANCE = 1e-6  # relative: increase() extrapolates to the range's ends


def flushed_row(step: int) -> UsageHour:
    return UsageHour(
        work_id="job-1", member_index=0, node_id="n1", hour_start=float(step // 240 * 3600),
        tenant_id="t1", work_kind="training", zone="DE", accelerator_kind="gpu",
        energy_j=36_000.0, measured_j=36_000.0, gap_s=0.0, gco2_g=EMITTED_G, cost=0.001,
        currency="EUR", counterfactual_gco2_g=BASELINE_G, fallback=False,
    )  # fmt: skip


def exported_series() -> dict[str, list[float]]:
    """Selector -> its value at each scrape, as the usage collector exports them while
    the accountant counts a flush between every two scrapes."""
    accountant = Accountant(None, NodeRegistry(), UsageSettings())  # type: ignore[arg-type]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(UsageCollector(accountant))
    totals = accountant.totals.setdefault(("t1", "DE", "EUR"), TenantTotals())
    series: dict[str, list[float]] = {}
    for step in range(STEPS + 1):
        totals.add(flushed_row(step))
        for family in exposed_families(generate_latest(registry).decode()):
            for sample in family.samples:
                labels = {**sample.labels, "job": "greenfed", "instance": "replica-1:8700"}
                selector = (
                    sample.name
                    + "{"
                    + ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(labels.items()))
                    + "}"
                )
                series.setdefault(selector, []).append(float(sample.value))
    return series


def panel_expression(title: str) -> str:
    dashboard = load(DASHBOARD)
    (panel,) = [p for p in all_panels(dashboard) if p.get("title") == title]
    (target,) = panel["targets"]
    return substitute(str(target["expr"]), variable_values(dashboard))[0]


def differs(promql: str, expected: float) -> str:
    """Empty when `promql` is one series (or more) of value `expected`."""
    return (
        f"(abs(({promql}) - {expected!r}) > {TOLERANCE} * {abs(expected) + 1.0!r})"
        f" or (vector(1) unless on() ({promql}))"
    )


def test_the_avoided_panels_show_negative_savings_as_they_were_counted(tmp_path: Path) -> None:
    promtool = require_tool("promtool", "prometheus")
    avoided_g = (BASELINE_G - EMITTED_G) * RANGE_STEPS  # over the last hour: -240 g
    expected = {
        "Avoided emissions": avoided_g,
        "Avoided emissions by tenant": avoided_g,
        "Avoided share": avoided_g / (BASELINE_G * RANGE_STEPS),
    }
    checks = [(title, differs(panel_expression(title), value)) for title, value in expected.items()]
    suite = {
        "rule_files": [],
        "tests": [
            {
                "interval": f"{STEP_S}s",
                "input_series": [
                    {"series": selector, "values": " ".join(repr(v) for v in values)}
                    for selector, values in exported_series().items()
                ],
                "promql_expr_test": [
                    {"expr": check, "eval_time": f"{STEPS * STEP_S}s", "exp_samples": []}
                    for _, check in checks
                ],
            }
        ],
    }
    path = tmp_path / "avoided_panels_test.json"  # JSON is YAML: promtool reads it
    path.write_text(json.dumps(suite))
    tested = subprocess.run(
        [promtool, "test", "rules", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=60,
        check=False,
    )
    if tested.returncode != 0:
        wrong = [title for title, check in checks if f"expr: {json.dumps(check)}" in tested.stdout]
        pytest.fail(f"panels off the counted figure: {wrong}\n{tested.stdout[-4000:]}")


_COUNTING = re.compile(r"\b(?:increase|rate|irate|resets)\s*\(\s*([A-Za-z_:][A-Za-z0-9_:]*)")


def counted_reads() -> Iterator[tuple[str, str]]:
    """(where, metric) for each series a panel or an alert reads as a counter."""
    for expression, promql in substituted_expressions():
        for name in _COUNTING.findall(promql):
            yield expression.where, name
    for rule in alert_rules():
        for name in _COUNTING.findall(str(rule["expr"])):
            yield f"alert {rule['alert']}", name


@pytest.mark.timeout(60)  # starts a control plane and a simulated fleet, once a session
async def test_only_counters_are_read_as_counters() -> None:
    # By the families' types: some have no samples yet in the scrape (no usage metered).
    monotonic: set[str] = set()
    for family in exposed_families(await exported_scrape()):
        if family.type == "counter":
            monotonic |= {family.name, f"{family.name}_total"}
        elif family.type in ("histogram", "summary"):
            monotonic |= {f"{family.name}{suffix}" for suffix in ("_bucket", "_sum", "_count")}
    read = set(counted_reads())
    assert {name for _, name in read} & {
        "greenfed_usage_counterfactual_emissions_grams_total",
        "greenfed_usage_emissions_with_counterfactual_grams_total",
    }
    not_counters = sorted((where, name) for where, name in read if name not in monotonic)
    assert not not_counters, f"increase()/rate() of series that are not counters: {not_counters}"
