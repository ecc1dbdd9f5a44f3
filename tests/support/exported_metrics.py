"""What the control plane exports on GET /metrics, for tests of files that name its
metrics (deploy/prometheus alert rules, deploy/grafana dashboards).

`exported_metric_names()` starts a real control plane (SQLite store in a temporary
directory, scheduling loop on) with real agents on two simulated cloud GPU servers
and one simulated edge device over an embedded MQTT broker, waits until their
telemetry is on /metrics and the scheduling leader has passed, and reads one scrape
with the metrics scrape token, as the shipped Prometheus configuration does (so the
series that name tenants and deployments are in it).
Every family the text declares counts, with or without samples, so a metric with
no series yet (no dropped messages, no deployments) is still known. The scrape is
taken once per test session and shared.

Names are the ones a PromQL expression uses, i.e. sample names: a counter ends in
`_total` (but for dcgm-exporter's, named as its TYPE line names it: prometheus_client's
parser adds `_total` to those too), a histogram gives `_bucket`, `_sum` and `_count`, a
summary its name, `_sum` and `_count`; gauges and untyped families their name.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from greenfed.broker import EmbeddedBroker
from shared.token_files import metrics_token_path, read_token_file
from tests.store.databases import sqlite_database
from tests.support.control_plane import Fleet, fleet
from tests.support.waiting import eventually_async

# Simulated fleet: `a100-4x` cloud servers (4 GPUs each) and one Jetson.
CLOUD_NODES = 2
EDGE_NODES = 1
_SAMPLE_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "summary": ("", "_sum", "_count"),
    "info": ("_info",),
}

_scrape: str | None = None  # this session's scrape, once taken


_COUNTER_TYPE_LINE = re.compile(r"^# TYPE (\S+) counter$", re.MULTILINE)


def _bare_counters(exposition: str) -> set[str]:
    """Counters whose TYPE line names them without `_total`, as dcgm-exporter's do."""
    return {name for name in _COUNTER_TYPE_LINE.findall(exposition) if not name.endswith("_total")}


def exposed_families(exposition: str) -> list[Metric]:
    """The families of a Prometheus text exposition, as prometheus_client's parser reads
    them, but with each sample under the name the text gives it: the parser names the
    samples of a counter whose TYPE line lacks `_total` (dcgm-exporter's
    DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION) `..._total`, a series no query would find."""
    bare_counters = _bare_counters(exposition)
    families = list(text_string_to_metric_families(exposition))
    for family in families:
        if family.type == "counter" and family.name in bare_counters:
            parsed_name = family.name + "_total"
            family.samples = [
                s._replace(name=family.name) if s.name == parsed_name else s for s in family.samples
            ]
    return families


def metric_names(exposition: str) -> set[str]:
    """The sample names a Prometheus text exposition declares or contains."""
    bare_counters = _bare_counters(exposition)
    names: set[str] = set()
    for family in exposed_families(exposition):
        if family.type == "counter" and family.name in bare_counters:
            suffixes: tuple[str, ...] = ("",)
        else:
            suffixes = _SAMPLE_SUFFIXES.get(family.type, ("",))
        names |= {family.name + suffix for suffix in suffixes}
        names |= {sample.name for sample in family.samples}
    return names


def metric_label_names(exposition: str) -> dict[str, set[str]]:
    """Sample name -> the label names its samples carry (`le`, `quantile` included);
    only for names that have samples in this scrape."""
    labels: dict[str, set[str]] = {}
    for family in exposed_families(exposition):
        for sample in family.samples:
            labels.setdefault(sample.name, set()).update(sample.labels)
    return labels


async def _scrape_text(running: Fleet) -> str:
    token = read_token_file(metrics_token_path(running.api.database.settings))
    assert token is not None, "the control plane wrote no metrics-token file"
    response = await running.api.client.get(
        "/metrics", headers={"Authorization": f"Bearer {token}"}
    )
    assert response.status == 200, await response.text()
    return await response.text()


async def _fleet_scrape() -> str:
    with tempfile.TemporaryDirectory(prefix="greenfed-metrics-") as workdir:
        database = sqlite_database(Path(workdir))
        async with (
            EmbeddedBroker(port=0) as broker,
            fleet(
                database,
                (broker.url, "metrics"),
                cloud_nodes=CLOUD_NODES,
                edge_nodes=EDGE_NODES,
            ) as running,
        ):
            cloud_nodes = set(running.launchers)  # the GPU servers
            text = ""

            async def complete() -> bool:
                nonlocal text
                text = await _scrape_text(running)
                families = {f.name: f for f in exposed_families(text)}
                gpu_nodes = {s.labels["node"] for s in families["DCGM_FI_DEV_GPU_UTIL"].samples}
                passes = families["greenfed_scheduling_passes"].samples
                return cloud_nodes <= gpu_nodes and bool(passes) and passes[0].value >= 1

            await eventually_async(
                complete,
                timeout_s=20.0,
                interval_s=0.1,
                message="the fleet's GPUs and a scheduling pass never reached /metrics",
            )
            return text


async def exported_scrape() -> str:
    """One /metrics scrape of a control plane with a simulated fleet (taken once)."""
    global _scrape
    if _scrape is None:
        _scrape = await _fleet_scrape()
    return _scrape


async def exported_metric_names() -> set[str]:
    """Every sample name the control plane's /metrics declares (see the module doc)."""
    return metric_names(await exported_scrape())
