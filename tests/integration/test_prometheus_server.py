"""A real Prometheus server (Debian's `prometheus`) scraping a control plane with real
agents on simulated GPU servers over the real Mosquitto, with the shipped
configuration (deploy/prometheus/prometheus.yml, at test speed) and the shipped alert
rules: the per-GPU series arrive with their node and dcgm-exporter's labels, the energy
series as the counter dcgm-exporter declares, an alert that holds on that data
fires, every shipped rule evaluates without error on it, and the conditions of the
alerts that concern a healthy fleet (down, leadership, errors, offline nodes, dropped
messages, stale grid signals) do not hold."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from cloud.app_keys import REGISTRY
from shared.token_files import metrics_token_path
from tests.store.databases import sqlite_database
from tests.support.brokers import free_port
from tests.support.control_plane import Fleet, fleet
from tests.support.system_tools import require_tool
from tests.support.waiting import eventually, eventually_async

# No type stubs for PyYAML here; greenfed/spec_files.py loads it the same way.
yaml: Any = importlib.import_module("yaml")

pytestmark = pytest.mark.timeout(90)

PROMETHEUS_DIR = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
TEST_ALERT = "GreenfedTestGpusPresent"
TEST_RULES = {
    "groups": [
        {
            "name": "greenfed-test",
            "rules": [
                {
                    "alert": TEST_ALERT,
                    "expr": "count by (node) (DCGM_FI_DEV_GPU_UTIL) > 0",
                    "for": "0s",
                    "labels": {"severity": "info"},
                    "annotations": {"summary": "{{ $labels.node }} has {{ $value }} GPUs"},
                }
            ],
        }
    ]
}

# Alerts whose condition must not hold on the healthy fleet under test.
QUIET_ON_A_HEALTHY_FLEET = (
    "GreenfedControlPlaneDown",
    "GreenfedNoSchedulingLeader",
    "GreenfedSeveralSchedulingLeaders",
    "GreenfedSchedulingPassErrors",
    "GreenfedCloudNodeOffline",
    "GreenfedManyNodesOffline",
    "GreenfedMqttMessagesDropped",
    "GreenfedGridSignalStale",
)


def prometheus_config(api_port: int, scrape_token_file: Path, workdir: Path) -> Path:
    """The shipped configuration, scraping `api_port` every second with the control
    plane's scrape token file (as docs/monitoring.md says: a copy beside the
    configuration), with the shipped rules (absolute paths) and the test's rule."""
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    [job] = config["scrape_configs"]
    job["scrape_timeout"] = "1s"
    shutil.copy(scrape_token_file, workdir / job["authorization"]["credentials_file"])
    job["static_configs"] = [{"targets": [f"127.0.0.1:{api_port}"]}]
    test_rules = workdir / "test-rules.yml"
    test_rules.write_text(yaml.safe_dump(TEST_RULES))
    config["rule_files"] = [
        *(str(PROMETHEUS_DIR / name) for name in config["rule_files"]),
        str(test_rules),
    ]
    path = workdir / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


@contextlib.asynccontextmanager
async def prometheus_server(binary: str, config: Path, workdir: Path) -> AsyncIterator[str]:
    """A Prometheus process on a free port until the block ends; its base URL."""
    port = free_port()
    log = workdir / "prometheus.log"
    with log.open("wb") as output:
        process = await asyncio.create_subprocess_exec(
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            stdout=output,
            stderr=asyncio.subprocess.STDOUT,
        )
    base_url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:

            async def ready() -> bool:
                assert process.returncode is None, log.read_text(errors="replace")
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(f"{base_url}/-/ready") as response:
                        return response.status == 200
                return False

            await eventually_async(
                ready, timeout_s=20.0, interval_s=0.1, message=lambda: log.read_text()
            )
        yield base_url
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 10.0)
            except TimeoutError:
                process.kill()
                await process.wait()


async def api(http: aiohttp.ClientSession, url: str, **params: str) -> Any:
    async with http.get(url, params=params) as response:
        body = await response.json()
        assert response.status == 200, body
        assert body["status"] == "success", body
        return body["data"]


def shipped_rules() -> list[dict[str, Any]]:
    alerts = yaml.safe_load((PROMETHEUS_DIR / "alerts.yml").read_text())
    return [rule for group in alerts["groups"] for rule in group["rules"]]


async def scraped(
    http: aiohttp.ClientSession, prometheus: str, promql: str, count: int
) -> list[dict[str, Any]]:
    """The result of an instant query once it has at least `count` series."""
    series: list[dict[str, Any]] = []

    async def enough() -> bool:
        nonlocal series
        series = (await api(http, f"{prometheus}/api/v1/query", query=promql))["result"]
        return len(series) >= count

    await eventually_async(
        enough, timeout_s=20.0, interval_s=0.2, message=lambda: f"{promql}: {series}"
    )
    return series


def fleet_gpus(running: Fleet) -> set[tuple[str, str]]:
    """(node, gpu index) of every GPU the control plane knows."""
    return {
        (record.status.node_id, str(accelerator.index))
        for record in running.api.app[REGISTRY]
        for accelerator in record.status.accelerators
        if accelerator.kind == "gpu"
    }


async def test_prometheus_scrapes_the_fleet_and_fires_an_alert_on_its_gpus(
    mosquitto_root: tuple[str, str], tmp_path: Path
) -> None:
    binary = require_tool("prometheus", "prometheus")
    async with fleet(sqlite_database(tmp_path), mosquitto_root, cloud_nodes=2) as running:
        # Two simulated a100-4x servers, once the control plane has their births.
        await eventually(lambda: len(fleet_gpus(running)) == 8, timeout_s=10.0)
        gpus = fleet_gpus(running)
        api_port = running.api.client.port
        assert api_port is not None
        config = prometheus_config(
            api_port, metrics_token_path(running.api.database.settings), tmp_path
        )
        async with (
            prometheus_server(binary, config, tmp_path) as prometheus,
            aiohttp.ClientSession() as http,
        ):
            series = await scraped(http, prometheus, "DCGM_FI_DEV_GPU_UTIL", len(gpus))
            labels = [s["metric"] for s in series]
            assert sorted((m["node"], m["gpu"]) for m in labels) == sorted(gpus)
            assert {m["job"] for m in labels} == {"greenfed"}
            assert all(0.0 <= float(s["value"][1]) <= 100.0 for s in series), series
            # dcgm-exporter's labels, and the one that tells greenfed's series from its.
            for metric in labels:
                assert metric["exporter"] == "greenfed", metric
                assert metric["device"] == f"nvidia{metric['gpu']}", metric
                assert metric["UUID"].startswith("GPU-"), metric
                assert metric["pci_bus_id"].startswith("00000000:"), metric
            # The energy series keeps dcgm-exporter's name and type: Prometheus stores it
            # under that name and knows it as a counter.
            energy = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
            await scraped(http, prometheus, f'{energy}{{exporter="greenfed"}}', len(gpus))
            metadata = await api(http, f"{prometheus}/api/v1/metadata", metric=energy)
            assert [entry["type"] for entry in metadata[energy]] == ["counter"], metadata
            [up] = await scraped(http, prometheus, 'up{job="greenfed"}', 1)
            assert up["value"][1] == "1"

            firing: dict[str, dict[str, Any]] = {}

            async def test_alert_firing_per_node() -> bool:
                alerts = (await api(http, f"{prometheus}/api/v1/alerts"))["alerts"]
                firing.clear()
                firing.update(
                    (alert["labels"]["node"], alert)
                    for alert in alerts
                    if alert["labels"]["alertname"] == TEST_ALERT and alert["state"] == "firing"
                )
                return len(firing) == 2

            await eventually_async(
                test_alert_firing_per_node,
                timeout_s=20.0,
                interval_s=0.2,
                message=lambda: f"firing: {firing}",
            )
            assert set(firing) == {node for node, _ in gpus}
            assert {a["annotations"]["summary"] for a in firing.values()} == {
                "a100-0 has 4 GPUs",
                "a100-1 has 4 GPUs",
            }

            # Every shipped rule has run against the real series, without an error.
            shipped = {rule["alert"] for rule in shipped_rules()}
            health: dict[str, tuple[str, str]] = {}

            async def every_shipped_rule_evaluated() -> bool:
                groups = (await api(http, f"{prometheus}/api/v1/rules"))["groups"]
                health.clear()
                health.update(
                    (rule["name"], (rule["health"], rule.get("lastError", "")))
                    for group in groups
                    for rule in group["rules"]
                    if rule["name"] in shipped
                )
                return set(health) == shipped and all(h != "unknown" for h, _ in health.values())

            await eventually_async(
                every_shipped_rule_evaluated,
                timeout_s=20.0,
                interval_s=0.2,
                message=lambda: f"{health}",
            )
            assert {name: h for name, h in health.items() if h[0] != "ok"} == {}

            # On this healthy fleet the conditions of these alerts do not hold (pending
            # would be the first step to firing); the others depend on time or load.
            [grid] = await scraped(http, prometheus, "greenfed_grid_signal_stale", 1)
            assert grid["metric"]["zone"] == "DE"  # the simulated servers' zone
            await scraped(http, prometheus, "greenfed_node_up == 1", len(running.agents))
            expressions = {rule["alert"]: rule["expr"] for rule in shipped_rules()}
            holding: dict[str, Any] = {}
            for name in QUIET_ON_A_HEALTHY_FLEET:
                query = f"{prometheus}/api/v1/query"
                result = (await api(http, query, query=expressions[name]))["result"]
                if result:
                    holding[name] = result
            assert holding == {}, "alert conditions that hold on a healthy fleet"
