"""Two control-plane replicas scraped side by side show what one shows: every panel of
the Grafana dashboards and every alert rule gives the same answer (docs/monitoring.md,
"Several replicas").

Every replica exports the whole fleet: it merges the telemetry the other replicas took
(cloud/fleet/digest.py), so each one has a `greenfed_node_up` per node, the per-GPU
`DCGM_FI_*` series, the fleet's counts and the power by zone. A panel that sums those
across scrape targets shows twice the fleet and its power with two replicas; the
queries take the maximum per node, accelerator or zone first. What a replica counts
itself (the MQTT messages it took, the leader's queue and usage) is summed, and is
exported here by one replica only, so that only the fleet's series are doubled.

The check runs on promtool's test engine: the fleet of a real scrape
(tests/support/exported_metrics.py) as one replica exports it for the first 75
minutes, then a second replica exporting the same fleet series; each expression
evaluated at the end must equal itself evaluated before the second replica came
(a subquery shifted back by `offset`), series for series.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.deploy.test_grafana_dashboards import substituted_expressions
from tests.deploy.test_prometheus_rules import alert_rules
from tests.support.exported_metrics import exported_scrape, exposed_families
from tests.support.promql import metric_names
from tests.support.system_tools import require_tool

# The families every replica exports alike: read from the node registry, which holds
# every node on every replica. Anything else is a replica's own (its ingestion, the
# leader's passes, queue, grid and usage).
REPLICATED_FAMILIES = frozenset(
    {
        "greenfed_node_up",
        "greenfed_nodes",
        "greenfed_nodes_with_accelerator",
        "greenfed_accelerators",
        "greenfed_agent_versions",
        "greenfed_zone_power_watts",
        # Each replica's figure is its registry's latest samples of the nodes serving
        # the deployment, so every replica reports the whole deployment.
        "greenfed_inference_requests_per_second",
        "greenfed_inference_latency_milliseconds",
    }
)
REPLICATED_PREFIXES = ("DCGM_FI_", "greenfed_accelerator_")

# Series that the scrape has no samples of (no deployment serves, no usage is metered
# yet), made up so that the panels reading them are checked too: (name, labels, value).
SUPPLEMENT = (
    ("greenfed_inference_requests_per_second", {"deployment": "d-1", "tenant": "acme"}, 12.5),
    *(
        (
            "greenfed_inference_latency_milliseconds",
            {"deployment": "d-1", "tenant": "acme", "quantile": quantile},
            latency_ms,
        )
        for quantile, latency_ms in (("0.5", 8.0), ("0.95", 21.0), ("0.99", 40.0))
    ),
    ("greenfed_inference_requests_total", {"deployment": "d-1", "tenant": "acme"}, 900.0),
    ("greenfed_inference_errors_total", {"deployment": "d-1", "tenant": "acme"}, 3.0),
    ("greenfed_inference_rejected_total", {"deployment": "d-1", "tenant": "acme"}, 1.0),
    ("greenfed_usage_energy_kwh_total", {"tenant": "acme", "zone": "DE"}, 2.5),
    ("greenfed_usage_emissions_grams_total", {"tenant": "acme", "zone": "DE"}, 900.0),
    (
        "greenfed_usage_counterfactual_emissions_grams_total",
        {"tenant": "acme", "zone": "DE"},
        800.0,
    ),
    (
        "greenfed_usage_emissions_with_counterfactual_grams_total",
        {"tenant": "acme", "zone": "DE"},
        700.0,
    ),
    (
        "greenfed_usage_cost_total",
        {"tenant": "acme", "zone": "DE", "currency": "EUR"},
        0.4,
    ),
    ("greenfed_zone_accelerators_allocated", {"zone": "DE", "kind": "gpu"}, 4.0),
    (
        "greenfed_accelerator_temperature_celsius",
        {
            "node": "npu-1",
            "accelerator": "npu0",
            "kind": "npu",
            "model": "Intel AI Boost NPU (Meteor Lake)",
            "site": "edge",
            "zone": "DE",
        },
        48.0,
    ),
)
COUNTER_SUFFIXES = ("_total", "_bucket", "_sum", "_count")

REPLICAS = ("replica-1:8700", "replica-2:8700")
JOB = "greenfed"
STEP_S = 15  # the shipped scrape interval (the dashboards' tests assume it too)
# One replica alone until the second starts; then both, as long again.
ALONE_S = 75 * 60
SECOND_STARTS_S = ALONE_S + 5 * 60  # past the instant lookback from ALONE_S
END_S = 2 * ALONE_S
TOLERANCE = 1e-6  # relative: sums may add the same numbers in another order


@dataclass(frozen=True)
class Series:
    name: str
    labels: Mapping[str, str]
    value: float
    counter: bool
    replicated: bool


def replicated(name: str) -> bool:
    return name in REPLICATED_FAMILIES or name.startswith(REPLICATED_PREFIXES)


def fleet_series(exposition: str) -> list[Series]:
    found: list[Series] = []
    for family in exposed_families(exposition):
        for sample in family.samples:
            # A histogram's or summary's buckets, sum and count are counters; a
            # summary's quantiles are not.
            counter = family.type == "counter" or (
                family.type in ("histogram", "summary") and sample.name != family.name
            )
            found.append(
                Series(
                    sample.name,
                    sample.labels,
                    float(sample.value),
                    counter,
                    replicated(family.name),
                )
            )
    present = {series.name for series in found}
    for name, labels, value in SUPPLEMENT:
        if name not in present:
            found.append(
                Series(name, labels, value, name.endswith(COUNTER_SUFFIXES), replicated(name))
            )
    return found


def _selector(name: str, labels: Mapping[str, str], instance: str) -> str:
    pairs = {**labels, "job": JOB, "instance": instance}
    return name + "{" + ", ".join(f"{k}={json.dumps(v)}" for k, v in pairs.items()) + "}"


def _values(series: Series, start_s: int) -> str:
    """promtool's expanding notation, from `start_s` to the end: a gauge stays put, a
    counter grows steadily (its value then is what it would be had it always been
    there, so both replicas' counters agree)."""
    missing = start_s // STEP_S
    steps = (END_S - start_s) // STEP_S
    growth = series.value + 1.0 if series.counter else 0.0
    first = series.value + growth * missing
    blank = f"_x{missing} " if missing else ""
    return f"{blank}{first!r}+{growth!r}x{steps}"


def input_series(fleet: list[Series]) -> Iterator[dict[str, str]]:
    first, second = REPLICAS
    up = Series("up", {}, 1.0, counter=False, replicated=True)  # Prometheus's, per target
    yield {"series": _selector("up", {}, first), "values": _values(up, 0)}
    yield {"series": _selector("up", {}, second), "values": _values(up, SECOND_STARTS_S)}
    for series in fleet:
        yield {"series": _selector(series.name, series.labels, first), "values": _values(series, 0)}
        if series.replicated:
            yield {
                "series": _selector(series.name, series.labels, second),
                "values": _values(series, SECOND_STARTS_S),
            }


def unchanged_by_a_second_replica(promql: str) -> str:
    """An expression that is empty when `promql` now (two replicas) equals `promql`
    before the second replica started (one), series for series."""
    now = f"({promql})"
    alone = f"last_over_time(({promql})[{STEP_S}s:{STEP_S}s] offset {END_S - ALONE_S}s)"
    return (
        f"(abs({now} - {alone}) > {TOLERANCE} * (abs({alone}) + 1))"
        f" or ({now} unless {alone}) or ({alone} unless {now})"
    )


def checked_expressions() -> list[tuple[str, str]]:
    """(where, PromQL) of every dashboard panel's expression and every alert rule. (A
    variable's query lists label values, which a second replica does not change.)"""
    found = [
        (expression.where, promql)
        for expression, promql in substituted_expressions()
        if ":variable_" not in expression.record
    ]
    found += [(f"alert {rule['alert']}", str(rule["expr"])) for rule in alert_rules()]
    return found


@pytest.mark.timeout(120)  # a control plane and fleet for the scrape, once a session
async def test_a_second_replica_changes_no_panel_and_no_alert(tmp_path: Path) -> None:
    promtool = require_tool("promtool", "prometheus")
    fleet = fleet_series(await exported_scrape())
    expressions = checked_expressions()
    # Every replicated family a query reads has series here, or the check proves nothing.
    read = set().union(*(metric_names(promql) for _, promql in expressions))
    shown = {series.name for series in fleet if series.replicated}
    assert {name for name in read if replicated(name)} <= shown, sorted(
        {name for name in read if replicated(name)} - shown
    )

    tests = [
        {
            "interval": f"{STEP_S}s",
            "input_series": list(input_series(fleet)),
            "promql_expr_test": [
                {
                    "expr": unchanged_by_a_second_replica(promql),
                    "eval_time": f"{END_S}s",
                    "exp_samples": [],
                }
                for _, promql in expressions
            ],
        }
    ]
    suite = tmp_path / "two_replicas_test.json"  # JSON is YAML: promtool reads it
    suite.write_text(json.dumps({"rule_files": [], "tests": tests}))
    process = await asyncio.create_subprocess_exec(
        promtool,
        "test",
        "rules",
        str(suite),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output = (await asyncio.wait_for(process.communicate(), 90))[0].decode()
    if process.returncode != 0:
        failing = [
            where
            for where, promql in expressions
            if f"expr: {json.dumps(unchanged_by_a_second_replica(promql))}" in output
        ]
        pytest.fail(
            "with a second replica these give another answer than with one:\n  "
            + "\n  ".join(failing or ["(see promtool's output)"])
            + "\n\n"
            + output[-6000:]
        )
