"""The Grafana dashboards in deploy/grafana: well-formed for Grafana, every PromQL
expression accepted by promtool once Grafana's variables are substituted, and every
metric they name one the control plane exports."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.exported_metrics import (
    exported_metric_names,
    exported_scrape,
    metric_label_names,
)
from tests.support.promql import grouping_labels, matched_labels, metric_names
from tests.support.system_tools import require_tool

# No type stubs for PyYAML here; greenfed/spec_files.py loads it the same way.
yaml: Any = importlib.import_module("yaml")

GRAFANA = Path(__file__).resolve().parents[2] / "deploy" / "grafana"
DASHBOARD_FILES = sorted((GRAFANA / "dashboards").glob("*.json"))
DATASOURCE_VARIABLE = "datasource"
DATASOURCE_REF = {"type": "prometheus", "uid": "${datasource}"}
GRID_WIDTH = 24

# What an operator needs on screen (the brief of the dashboards): each has a panel.
REQUIRED_METRICS = frozenset(
    {
        "greenfed_node_up",
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_FB_USED",
        "greenfed_accelerator_utilization_pct",
        "greenfed_queue_wait_seconds_bucket",
        "greenfed_submission_to_running_seconds_bucket",
        "greenfed_work_pending",
        "greenfed_grid_carbon_intensity_grams_per_kwh",
        "greenfed_grid_price_per_mwh",
        "greenfed_usage_emissions_grams_total",
        "greenfed_usage_counterfactual_emissions_grams_total",
        "greenfed_usage_emissions_with_counterfactual_grams_total",
        "greenfed_usage_energy_kwh_total",
        "greenfed_usage_cost_total",
        "greenfed_zone_accelerators_allocated",
        "greenfed_zone_power_watts",
        "greenfed_inference_requests_total",
        "greenfed_inference_latency_milliseconds",
        "greenfed_inference_errors_total",
        "greenfed_inference_rejected_total",
    }
)

# Grafana's built-in variables, as a query at a 1 h range on a 15 s scrape sees them.
BUILT_IN_VARIABLES: Mapping[str, str] = {
    "__rate_interval": "1m",
    "__interval": "15s",
    "__interval_ms": "15000",
    "__range": "1h",
    "__range_s": "3600",
    "__range_ms": "3600000",
}
# A multi-value variable with "All" becomes its allValue inside `=~"..."`.
ALL_VALUE = ".*"


# --- reading dashboards ----------------------------------------------------------------


@dataclass(frozen=True)
class Expression:
    where: str  # for messages: file, panel or variable
    record: str  # a recording-rule name promtool's messages name it by
    promql: str  # as written, Grafana variables and all


def load(path: Path) -> dict[str, Any]:
    dashboard = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(dashboard, dict), f"{path.name}: not a JSON object"
    return dashboard


def all_panels(dashboard: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside a collapsed row too."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def variables(dashboard: Mapping[str, Any]) -> list[dict[str, Any]]:
    listed = dashboard.get("templating", {}).get("list", [])
    assert isinstance(listed, list)
    return listed


_LABEL_VALUES = re.compile(r"^\s*label_values\((?P<selector>.*),\s*[A-Za-z_]\w*\s*\)\s*$", re.S)
_QUERY_RESULT = re.compile(r"^\s*query_result\((?P<query>.*)\)\s*$", re.S)
_NO_PROMQL = re.compile(r"^\s*(label_values\(\s*\w+\s*\)|label_names\(\s*\)|metrics\(.*\))\s*$")


def variable_promql(variable: Mapping[str, Any]) -> str | None:
    """The PromQL inside a Prometheus query variable (`label_values(selector, label)`,
    `query_result(expr)`), None when it has none."""
    if variable.get("type") != "query":
        return None
    query = variable.get("query")
    text = query.get("query", "") if isinstance(query, dict) else query
    assert isinstance(text, str), f"variable {variable.get('name')}: query is not text"
    if _NO_PROMQL.match(text):
        return None
    for form in (_LABEL_VALUES, _QUERY_RESULT):
        match = form.match(text)
        if match is not None:
            return match.group(1)
    return text  # anything else Grafana sends as a series selector (/api/v1/series)


def _record_name(*parts: str) -> str:
    return ":".join(re.sub(r"[^A-Za-z0-9_]", "_", part) for part in ("grafana", *parts))


def expressions(path: Path, dashboard: Mapping[str, Any]) -> list[Expression]:
    uid = str(dashboard.get("uid", path.stem))
    found: list[Expression] = []
    for variable in variables(dashboard):
        promql = variable_promql(variable)
        if promql is not None:
            name = str(variable["name"])
            found.append(
                Expression(
                    f"{path.name} variable ${name}", _record_name(uid, f"variable_{name}"), promql
                )
            )
    for panel in all_panels(dashboard):
        for target in panel.get("targets", []):
            expr = target.get("expr")
            if expr:
                ref_id = str(target.get("refId", ""))
                found.append(
                    Expression(
                        f"{path.name} panel {panel['id']} {panel.get('title')!r} {ref_id}",
                        _record_name(uid, f"panel_{panel['id']}", ref_id),
                        expr,
                    )
                )
    return found


# --- Grafana variables -----------------------------------------------------------------

_VARIABLE = re.compile(
    r"\$\{(?P<braced>\w+)(?::\w+)?\}|\[\[(?P<old>\w+)(?::\w+)?\]\]|\$(?P<plain>\w+)"
)


def variable_values(dashboard: Mapping[str, Any]) -> dict[str, str]:
    """A valid value for each variable the dashboard defines, built-ins included."""
    values = dict(BUILT_IN_VARIABLES)
    for variable in variables(dashboard):
        if variable.get("type") == "interval":
            values[str(variable["name"])] = "5m"
        elif variable.get("type") != "datasource":
            values[str(variable["name"])] = str(variable.get("allValue") or ALL_VALUE)
    return values


def substitute(promql: str, values: Mapping[str, str]) -> tuple[str, set[str]]:
    """`promql` with each Grafana variable replaced by its value, and the names of those
    it uses that `values` lacks."""
    unknown: set[str] = set()

    def replace(match: re.Match[str]) -> str:
        name = match.group("braced") or match.group("old") or match.group("plain")
        if name not in values:
            unknown.add(name)
            return match.group(0)
        return values[name]

    return _VARIABLE.sub(replace, promql), unknown


@pytest.mark.parametrize(
    ("promql", "expected"),
    [
        (
            'sum by (zone) (rate(a_total{zone=~"x(y)", q="sum"}[5m])) / on (zone) '
            "group_left (tenant) b",
            {"a_total", "b"},
        ),
        (
            "histogram_quantile(0.95, sum(rate(h_bucket[5m:1m] offset 1h)) by (le))",
            {"h_bucket"},
        ),
        ("count(max by (node) (up_gauge) == 0) or vector(0)", {"up_gauge"}),
        ("1e3 * max without (gpu) (DCGM_X) > bool 50 unless ignoring(a) c:d", {"DCGM_X", "c:d"}),
        ('{__name__="by_name", zone="sum"} and on() group_right x', {"by_name", "x"}),
        ("sort_desc(sum (increase(e_total[1h] @ end())))", {"e_total"}),
    ],
)
def test_metric_name_extraction(promql: str, expected: set[str]) -> None:
    assert metric_names(promql) == expected


def test_matched_label_extraction() -> None:
    promql = 'rate(a_total{zone=~"x,y=z", tenant!="t"}[5m]) / on (zone) b{node="n"} + c'
    assert matched_labels(promql) == {"a_total": {"zone", "tenant"}, "b": {"node"}}
    grouped = 'sum by (zone, le) (x{a="by (b)"}) * on() group_left (tenant) max without (c) (y)'
    assert grouping_labels(grouped) == {"zone", "le", "tenant"}


def test_substitution_replaces_grafana_variables_and_reports_unknown_ones() -> None:
    values = {"zone": ".*", "__rate_interval": "1m"}
    text, unknown = substitute(
        'rate(x{zone=~"$zone", t=~"${tenant:regex}"}[$__rate_interval])', values
    )
    assert text == 'rate(x{zone=~".*", t=~"${tenant:regex}"}[1m])'
    assert unknown == {"tenant"}


# --- the dashboards --------------------------------------------------------------------


def _ids() -> list[str]:
    return [path.name for path in DASHBOARD_FILES]


def substituted_expressions() -> Iterator[tuple[Expression, str]]:
    """Every expression of every dashboard, with its variables substituted."""
    for path in DASHBOARD_FILES:
        dashboard = load(path)
        values = variable_values(dashboard)
        for expression in expressions(path, dashboard):
            yield expression, substitute(expression.promql, values)[0]


def test_dashboards_cover_what_an_operator_watches() -> None:
    used: set[str] = set()
    for _, promql in substituted_expressions():
        used |= metric_names(promql)
    assert not REQUIRED_METRICS - used, f"no panel shows {sorted(REQUIRED_METRICS - used)}"


def test_dashboard_uids_and_titles_are_unique() -> None:
    dashboards = [load(path) for path in DASHBOARD_FILES]
    uids = [dashboard.get("uid") for dashboard in dashboards]
    titles = [dashboard.get("title") for dashboard in dashboards]
    assert all(uids), uids
    assert len(set(uids)) == len(uids), uids
    assert all(titles), titles
    assert len(set(titles)) == len(titles), titles


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=_ids())
def test_dashboard_is_well_formed(path: Path) -> None:
    dashboard = load(path)
    assert 36 <= dashboard.get("schemaVersion", 0) <= 41
    assert dashboard.get("id") is None, "a provisioned dashboard carries no database id"
    datasource = [v for v in variables(dashboard) if v.get("name") == DATASOURCE_VARIABLE]
    assert len(datasource) == 1, "no ${datasource} template variable"
    assert datasource[0].get("type") == "datasource"
    assert datasource[0].get("query") == "prometheus"
    for variable in variables(dashboard):
        if variable.get("type") == "query":
            assert variable.get("datasource") == DATASOURCE_REF, variable["name"]

    panels = list(all_panels(dashboard))
    ids = [panel.get("id") for panel in panels]
    assert all(isinstance(panel_id, int) for panel_id in ids), ids
    assert len(set(ids)) == len(ids), f"duplicate panel ids: {ids}"
    problems: list[str] = []
    for panel in panels:
        name = f"panel {panel.get('id')} {panel.get('title')!r}"
        if not panel.get("title"):
            problems.append(f"{name}: no title")
        if panel.get("type") == "row":
            continue
        if panel.get("datasource") != DATASOURCE_REF:
            problems.append(f"{name}: datasource {panel.get('datasource')}, not ${{datasource}}")
        if not panel.get("fieldConfig", {}).get("defaults", {}).get("unit"):
            problems.append(f"{name}: no unit")
        targets = panel.get("targets", [])
        if not targets or not all(target.get("expr") for target in targets):
            problems.append(f"{name}: a target without a PromQL expression")
        ref_ids = [target.get("refId") for target in targets]
        if len(set(ref_ids)) != len(ref_ids):
            problems.append(f"{name}: duplicate refIds {ref_ids}")
        if any(target.get("datasource", DATASOURCE_REF) != DATASOURCE_REF for target in targets):
            problems.append(f"{name}: a target on another datasource")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=_ids())
def test_panels_fit_the_grid_without_overlapping(path: Path) -> None:
    cells: dict[tuple[int, int], int] = {}
    for panel in load(path)["panels"]:
        grid = panel["gridPos"]
        assert grid["w"] > 0, panel
        assert grid["h"] > 0, panel
        assert grid["x"] + grid["w"] <= GRID_WIDTH, panel
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                other = cells.setdefault((x, y), panel["id"])
                assert other == panel["id"], f"panels {other} and {panel['id']} overlap"


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=_ids())
def test_expressions_use_only_defined_variables(path: Path) -> None:
    dashboard = load(path)
    values = variable_values(dashboard)
    undefined = {
        expression.where: sorted(unknown)
        for expression in expressions(path, dashboard)
        if (unknown := substitute(expression.promql, values)[1])
    }
    assert not undefined, undefined


def test_every_expression_parses(tmp_path: Path) -> None:
    promtool = require_tool("promtool", "prometheus")
    groups = []
    for path in DASHBOARD_FILES:
        dashboard = load(path)
        values = variable_values(dashboard)
        found = expressions(path, dashboard)
        assert found, f"{path.name} has no PromQL"
        rules = [{"record": e.record, "expr": substitute(e.promql, values)[0]} for e in found]
        groups.append({"name": path.stem, "rules": rules})
    rules_file = tmp_path / "dashboards.rules.json"  # JSON is YAML: promtool reads it
    rules_file.write_text(json.dumps({"groups": groups}, indent=1))
    checked = subprocess.run(
        [promtool, "check", "rules", str(rules_file)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {sum(len(g['rules']) for g in groups)} rules found" in checked.stdout


@pytest.mark.timeout(60)  # starts a control plane and a simulated fleet, once a session
async def test_every_metric_is_exported_with_the_labels_it_is_filtered_on() -> None:
    exported = await exported_metric_names()
    # Only names with samples in the scrape show their labels (no inference, no usage yet).
    labels_of = metric_label_names(await exported_scrape())
    unknown: dict[str, list[str]] = {}
    unlabelled: dict[str, list[str]] = {}
    for expression, promql in substituted_expressions():
        for name in metric_names(promql) - exported:
            unknown.setdefault(name, []).append(expression.where)
        for name, labels in matched_labels(promql).items():
            missing = labels - labels_of.get(name, labels)
            if missing:
                unlabelled.setdefault(f"{name} lacks {sorted(missing)}", []).append(
                    expression.where
                )
        names = metric_names(promql)
        if names <= labels_of.keys():
            carried = set().union(*(labels_of[name] for name in names))
            if missing := grouping_labels(promql) - carried:
                unlabelled.setdefault(f"{sorted(names)} lack {sorted(missing)}", []).append(
                    expression.where
                )
    assert not unknown, f"not exported by the control plane: {unknown}"
    assert not unlabelled, f"filtered on labels the metric does not carry: {unlabelled}"


# --- provisioning ----------------------------------------------------------------------


def test_provisioning_loads_the_dashboards_on_a_prometheus_datasource() -> None:
    provisioning = GRAFANA / "provisioning"
    sources = yaml.safe_load((provisioning / "datasources" / "greenfed.yaml").read_text())
    assert sources["apiVersion"] == 1
    [source] = sources["datasources"]
    assert source["type"] == "prometheus"
    assert source["uid"]
    assert source["url"]
    assert source.get("jsonData", {}).get("timeInterval"), "$__rate_interval needs it"
    providers = yaml.safe_load((provisioning / "dashboards" / "greenfed.yaml").read_text())
    assert providers["apiVersion"] == 1
    [provider] = providers["providers"]
    assert provider["type"] == "file"
    assert provider["options"]["path"]
    readme = (GRAFANA / "README.md").read_text()
    assert provider["options"]["path"] in readme, "the README says where to copy the files"
