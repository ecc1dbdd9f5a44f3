"""The Prometheus files in deploy/prometheus: promtool accepts the configuration and the
alert rules, the rules pass their unit tests (each alert shown firing and quiet), each
alert carries what an operator needs, and every metric an alert reads is one the
control plane exports, with the labels the alert matches on."""

from __future__ import annotations

import importlib
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.exported_metrics import (
    exported_metric_names,
    exported_scrape,
    metric_label_names,
)
from tests.support.promql import matched_labels, metric_names
from tests.support.system_tools import require_tool

# No type stubs for PyYAML here; greenfed/spec_files.py loads it the same way.
yaml: Any = importlib.import_module("yaml")

PROMETHEUS = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
CONFIG = PROMETHEUS / "prometheus.yml"
ALERTS = PROMETHEUS / "alerts.yml"
RULE_TESTS = sorted(PROMETHEUS.glob("*_test.yml"))
SCRAPE_TOKEN_FILE = "greenfed-metrics-token"
SEVERITIES = frozenset({"critical", "warning", "info"})
# Series Prometheus writes itself, per scrape target and per alert.
PROMETHEUS_SERIES = frozenset(
    {
        "up",
        "scrape_duration_seconds",
        "scrape_samples_scraped",
        "scrape_samples_post_metric_relabeling",
        "scrape_series_added",
        "ALERTS",
        "ALERTS_FOR_STATE",
    }
)


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def alert_rules() -> Iterator[dict[str, Any]]:
    for group in load_yaml(ALERTS)["groups"]:
        for rule in group["rules"]:
            assert "alert" in rule, f"{group['name']}: only alerting rules here, got {rule}"
            yield rule


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require_tool("promtool", "prometheus"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def assert_succeeds(result: subprocess.CompletedProcess[str]) -> None:
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{' '.join(result.args)} failed:\n{output}"
    assert "SUCCESS" in output, output


def test_promtool_accepts_the_configuration_and_the_rule_files_it_names(tmp_path: Path) -> None:
    config = load_yaml(CONFIG)
    assert config["rule_files"] == [ALERTS.name]
    [job] = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    # The control plane's default API address (cloud.api_host, cloud.api_port).
    assert job["static_configs"] == [{"targets": ["127.0.0.1:8700"]}]
    # The tenant series need the scrape token, read from a file beside the configuration
    # (docs/monitoring.md says to copy it there); promtool checks that it exists.
    assert job["authorization"] == {"type": "Bearer", "credentials_file": SCRAPE_TOKEN_FILE}
    for path in (CONFIG, ALERTS):
        shutil.copy(path, tmp_path / path.name)
    (tmp_path / SCRAPE_TOKEN_FILE).write_text("gfm_example\n")
    assert_succeeds(promtool("check", "config", str(tmp_path / CONFIG.name)))


def test_promtool_accepts_the_alert_rules() -> None:
    result = promtool("check", "rules", str(ALERTS))
    assert_succeeds(result)
    assert f"SUCCESS: {len(list(alert_rules()))} rules found" in result.stdout


@pytest.mark.parametrize("tests_file", RULE_TESTS, ids=[p.name for p in RULE_TESTS])
def test_the_alert_rules_pass_their_unit_tests(tests_file: Path) -> None:
    assert_succeeds(promtool("test", "rules", str(tests_file)))


def test_every_alert_has_a_severity_a_summary_a_description_and_a_for() -> None:
    names = [rule["alert"] for rule in alert_rules()]
    assert len(names) == len(set(names)), f"duplicate alert names: {names}"
    for rule in alert_rules():
        name = rule["alert"]
        assert rule["labels"]["severity"] in SEVERITIES, name
        assert rule["annotations"]["summary"].strip(), name
        assert rule["annotations"]["description"].strip(), name
        assert re.fullmatch(r"\d+[smh]", rule["for"]), f"{name}: for {rule.get('for')!r}"


def test_every_alert_is_unit_tested_firing_and_not_firing() -> None:
    assert RULE_TESTS, "no *_test.yml next to the rules"
    firing: set[str] = set()
    quiet: set[str] = set()
    for path in RULE_TESTS:
        suite = load_yaml(path)
        assert suite["rule_files"] == [ALERTS.name], path.name
        for case in suite["tests"]:
            for check in case.get("alert_rule_test", []):
                (firing if check["exp_alerts"] else quiet).add(check["alertname"])
    names = {rule["alert"] for rule in alert_rules()}
    assert names - firing == set(), "never shown firing"
    assert names - quiet == set(), "never shown quiet"


def test_the_metric_name_reader_finds_selected_metrics_only() -> None:
    expression = (
        'histogram_quantile(0.9, sum by (priority, le) (rate(a_bucket{priority=~"p1|p2"}[1h])))'
        ' > 3600 and on () max(b_total offset 5m) == 1 or c{x="rate(d)"} > 1e3'
        " unless sum without (instance) (e) / ignoring (zone) group_left f"
    )
    assert metric_names(expression) == {"a_bucket", "b_total", "c", "e", "f"}
    assert matched_labels(expression) == {"a_bucket": {"priority"}, "c": {"x"}}


async def test_every_metric_an_alert_reads_is_exported_with_the_labels_it_matches() -> None:
    exported = await exported_metric_names()
    labels = metric_label_names(await exported_scrape())
    unknown: dict[str, set[str]] = {}
    unlabelled: dict[str, set[str]] = {}
    for rule in alert_rules():
        expression = rule["expr"]
        names = metric_names(expression)
        assert names, f"{rule['alert']} reads no metric"
        for name in names - PROMETHEUS_SERIES - exported:
            unknown.setdefault(name, set()).add(rule["alert"])
        for name, matched in matched_labels(expression).items():
            # Only where this scrape has samples to show the labels.
            missing = matched - labels[name] if name in labels else set()
            if missing:
                unlabelled.setdefault(f"{name} lacks {sorted(missing)}", set()).add(rule["alert"])
    assert not unknown, f"alerts read metrics the control plane does not export: {unknown}"
    assert not unlabelled, f"alerts match on labels the series do not have: {unlabelled}"
