"""On Kubernetes the alert rules see the control plane under the job they select: the
Prometheus Operator labels the ServiceMonitor's targets `job=<the Service's label named
by spec.jobLabel>`, or `job=<the Service's name>` without one, and
deploy/prometheus/alerts.yml selects `job="greenfed"` (GreenfedControlPlaneDown, the
critical alert for a replica that is down). No operator runs where greenfed is tested:
its labelling is applied here as its documentation states it, and promtool evaluates
the rules on a replica that is down, labelled so."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

from tests.deploy.deploy_files import KUBERNETES, REPO, yaml_documents
from tests.support.system_tools import require_tool

PROMETHEUS = REPO / "deploy" / "prometheus"
NAMESPACE = "greenfed"
POD = "greenfed-cloud-5d9c7b8f6-x2x7q"
POD_IP_PORT = "10.0.0.7:8700"


def the(kind: str) -> dict[str, Any]:
    (found,) = [
        document
        for path in sorted(KUBERNETES.glob("*.yaml"))
        for document in yaml_documents(path)
        if document.get("kind") == kind
    ]
    return found


def operator_target_labels() -> dict[str, str]:
    """The labels the Prometheus Operator gives a pod behind the ServiceMonitor's
    Service (its API reference, ServiceMonitorSpec.jobLabel: "If the value of this
    field is empty or if the label doesn't exist for the given Service, the job label
    of the metrics defaults to the name of the associated Kubernetes Service")."""
    monitor, service = the("ServiceMonitor"), the("Service")
    [endpoint] = monitor["spec"]["endpoints"]
    service_labels = service["metadata"].get("labels", {})
    job_label = monitor["spec"].get("jobLabel", "")
    job = service_labels.get(job_label) or service["metadata"]["name"]
    return {
        "job": job,
        "namespace": service["metadata"]["namespace"],
        "service": service["metadata"]["name"],
        "endpoint": endpoint["port"],
        "pod": POD,
        "container": "cloud",
        "instance": POD_IP_PORT,
    }


def rendered_annotations(alert: str, labels: dict[str, str]) -> dict[str, str]:
    """The alert's annotations with `{{ $labels.NAME }}` filled in (all they use)."""
    [rule] = [
        rule
        for group in yaml_documents(PROMETHEUS / "alerts.yml")[0]["groups"]
        for rule in group["rules"]
        if rule.get("alert") == alert
    ]
    return {
        name: re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], text)
        for name, text in rule["annotations"].items()
    }


def test_the_operator_gives_the_targets_the_job_of_the_shipped_configuration() -> None:
    job = operator_target_labels()["job"]
    config = yaml_documents(PROMETHEUS / "prometheus.yml")[0]
    assert [scrape["job_name"] for scrape in config["scrape_configs"]] == [job]
    selected = set(re.findall(r'\bjob="([^"]*)"', (PROMETHEUS / "alerts.yml").read_text()))
    assert selected == {job}, f"the rules select job {selected}, the targets are job={job!r}"


def test_a_replica_that_is_down_on_kubernetes_fires_the_control_plane_alert(
    tmp_path: Path,
) -> None:
    promtool = require_tool("promtool", "prometheus")
    labels = operator_target_labels()
    selector = "up{" + ", ".join(f"{k}={json.dumps(v)}" for k, v in labels.items()) + "}"
    suite = {
        "rule_files": [str(PROMETHEUS / "alerts.yml")],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": selector, "values": "1 1 0x10"}],
                "alert_rule_test": [
                    {
                        "eval_time": "10m",
                        "alertname": "GreenfedControlPlaneDown",
                        "exp_alerts": [
                            {
                                "exp_labels": {**labels, "severity": "critical"},
                                "exp_annotations": rendered_annotations(
                                    "GreenfedControlPlaneDown", labels
                                ),
                            }
                        ],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "kubernetes_test.json"  # JSON is YAML: promtool reads it
    path.write_text(json.dumps(suite))
    result = subprocess.run(
        [promtool, "test", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
