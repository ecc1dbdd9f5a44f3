"""The offline optimum for inference (cloud/eval/inference_bound.py): never above what
any evaluated policy emitted, and the answer a person finds by hand on a tiny case."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import numpy as np
import pytest

from cloud.eval.fleet import load_fleet_nodes
from cloud.eval.inference_bound import eligible_rows
from cloud.eval.runner import EvalOptions, EvalReport, Scenario, run_eval, serving_latency
from cloud.eval.workload import parse_workload, requests_per_s
from cloud.green.energy import EnergyModel
from cloud.scheduler import Snapshot
from cloud.signals.grid import GridSignals, ZoneSeries
from cloud.signals.trace import TraceProvider

from .scenarios import write_scenario

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
START = date(2023, 6, 1)

TWO_ZONES = """
[[group]]
name = "t4-toronto"
profile = "t4-inference-server"
count = 1
site = "edge"
zone = "CA-ON"
region = "northamerica-northeast2"

[[group]]
name = "t4-frankfurt"
profile = "t4-inference-server"
count = 1
site = "edge"
zone = "DE"
region = "europe-west3"
"""

CLEAN_G_PER_KWH = {"CA-ON": 30.0, "DE": 400.0}


def _constant_grid(start_s: float) -> GridSignals:
    hours = 96
    return GridSignals(
        now_s=0.0,
        zones={
            zone: ZoneSeries(
                zone=zone,
                start_s=start_s - 24 * 3600.0,
                carbon_g_per_kwh=np.full(hours, intensity),
                price_per_mwh=np.full(hours, 50.0),
            )
            for zone, intensity in CLEAN_G_PER_KWH.items()
        },
    )


def _tiny(tmp_path: Path, deployment: dict[str, object]) -> EvalReport:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(TWO_ZONES, encoding="utf-8")
    options = EvalOptions(start=START, days=1, policies=("fifo-binpack", "green"), bound=True)
    workload = parse_workload({"inference": [deployment]}, "tiny")
    scenario = Scenario(
        tuple(load_fleet_nodes(fleet)),
        workload,
        TraceProvider(None),
        _constant_grid(options.start_s),
    )
    return run_eval(options, scenario=scenario)


def _replica_kw(report: EvalReport, zone: str, utilisation: float) -> float:
    """One T4 replica's draw in ``zone`` at ``utilisation``, host share included."""
    nodes = report.scenario.nodes
    snapshot = Snapshot.build(now=report.options.start_s, nodes=nodes)
    row = snapshot.nodes.index[next(node.node_id for node in nodes if node.zone == zone)]
    power_w = EnergyModel().member_power_w(snapshot, "gpu", np.array([row]), 1, utilisation)
    return float(power_w[0]) / 1000.0


def test_with_both_zones_allowed_the_bound_serves_from_the_cleaner_one(tmp_path: Path) -> None:
    report = _tiny(
        tmp_path,
        {
            "id": "steady",
            "tenant": "t",
            "replicas": 1,
            "accepted_kinds": ["gpu"],
            "latency_slo_ms": 1000.0,  # no traffic origins: no network term, both pass
            "reference_ms_per_request": 2.0,
            "peak_requests_per_s": 20.0,
        },
    )
    bound = report.inference_bound
    assert bound is not None
    speed = next(p for n in report.scenario.nodes for p in n.pools if p.kind == "gpu")
    utilisation = 20.0 * 2.0 / speed.relative_speed / 1000.0  # one replica, constant rate
    by_hand = 24.0 * _replica_kw(report, "CA-ON", utilisation) * CLEAN_G_PER_KWH["CA-ON"]
    assert bound.replica_hours == pytest.approx(24.0)
    assert bound.gco2 == pytest.approx(by_hand, rel=1e-6)
    assert bound.replica_hours_by_zone["CA-ON"] == pytest.approx(24.0)
    assert bound.replica_hours_by_zone.get("DE", 0.0) == pytest.approx(0.0, abs=1e-9)
    for result in report.results:
        assert bound.gco2 <= result.inference_gco2 * (1 + 1e-9)


def test_with_one_zone_within_the_slo_the_bound_is_that_zones_co2(tmp_path: Path) -> None:
    report = _tiny(
        tmp_path,
        {
            "id": "frankfurt-only",
            "tenant": "t",
            "replicas": 1,
            "accepted_kinds": ["gpu"],
            # Toronto is ~90 ms from Frankfurt's users: only the dirtier zone passes.
            "latency_slo_ms": 50.0,
            "reference_ms_per_request": 2.0,
            "peak_requests_per_s": 20.0,
            "traffic": [{"region": "europe-west3", "share": 1.0, "utc_offset_hours": 1.0}],
        },
    )
    bound = report.inference_bound
    assert bound is not None
    assert bound.replica_hours_by_zone == pytest.approx({"DE": 24.0})
    spec = report.scenario.workload.inference[0]
    speed = next(p for n in report.scenario.nodes for p in n.pools if p.kind == "gpu")
    by_hand = sum(
        _replica_kw(
            report,
            "DE",
            requests_per_s(spec, report.options.start_s + (hour + 0.5) * 3600.0)
            * 2.0
            / speed.relative_speed
            / 1000.0,
        )
        * CLEAN_G_PER_KWH["DE"]
        for hour in range(24)
    )
    assert bound.gco2 == pytest.approx(by_hand, rel=1e-6)
    for result in report.results:  # every policy had no choice either
        assert result.inference_gco2 == pytest.approx(by_hand, rel=1e-6)


def test_a_node_holds_no_more_of_a_deployments_replicas_than_its_limit_over_all_kinds(
    tmp_path: Path,
) -> None:
    """Each T4 server's GPU and CPU may both serve the deployment, but the scheduler
    counts one node's replicas over all its kinds: one replica in each zone."""
    report = _tiny(
        tmp_path,
        {
            "id": "two",
            "tenant": "t",
            "replicas": 2,
            "accepted_kinds": ["gpu", "cpu"],
            "latency_slo_ms": 1000.0,
            "reference_ms_per_request": 2.0,
            "peak_requests_per_s": 5.0,
        },
    )
    bound = report.inference_bound
    assert bound is not None
    nodes = report.scenario.nodes
    snapshot = Snapshot.build(now=report.options.start_s, nodes=nodes)
    row = np.array([snapshot.nodes.index[nodes[0].node_id]])
    utilisation = {
        pool.kind: 5.0 / 2 * 2.0 / pool.relative_speed / 1000.0 for pool in nodes[0].pools
    }
    least_w = min(
        float(EnergyModel().member_power_w(snapshot, kind, row, 1, busy)[0])
        for kind, busy in utilisation.items()
    )
    by_hand = 24.0 * least_w / 1000.0 * (CLEAN_G_PER_KWH["CA-ON"] + CLEAN_G_PER_KWH["DE"])
    assert bound.gco2 == pytest.approx(by_hand, rel=1e-6)
    assert bound.replica_hours_by_zone["DE"] == pytest.approx(24.0)
    for result in report.results:
        assert bound.gco2 <= result.inference_gco2 * (1 + 1e-9)


def _small(tmp_path: Path) -> EvalOptions:
    fleet, workload = write_scenario(tmp_path)
    return EvalOptions(
        days=2,
        fleet=fleet,
        workload=workload,
        policies=("fifo-binpack", "spread", "green", "balanced"),
        bound=True,
    )


def _default_june(_: Path) -> EvalOptions:
    return EvalOptions(start=START, days=1, policies=("fifo-binpack", "green"), bound=True)


def _other_zones_january(_: Path) -> EvalOptions:
    return EvalOptions(
        start=date(2023, 1, 9),
        days=1,
        fleet=ROOT / "sim_devices/fleets/other-zones.toml",
        policies=("fifo-binpack", "green", "latency"),
        bound=True,
    )


SCENARIOS = {
    "small fleet, four policies": _small,
    "default fleet, June": _default_june,
    "other zones, January": _other_zones_january,
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_no_evaluated_policy_emits_less_inference_co2_than_the_bound(
    tmp_path: Path, name: str
) -> None:
    report = run_eval(SCENARIOS[name](tmp_path))
    bound = report.inference_bound
    assert bound is not None
    assert bound.deployments == len(report.scenario.workload.inference) > 0
    assert bound.replica_hours > 0
    assert bound.gco2 > 0
    for result in report.results:
        assert bound.gco2 <= result.inference_gco2 * (1 + 1e-9), result.policy
        assert bound.kwh > 0
    # The scheduler's static filters alone admit every node a policy ran a replica on:
    # the bound adds those nodes only as a safety net, it does not need them.
    snapshot = Snapshot.build(now=report.options.start_s, nodes=report.scenario.nodes)
    latency = serving_latency(report.scenario, report.options.start_s)
    for outcome in report.outcomes:
        for run in outcome.replicas:
            allowed = eligible_rows(
                snapshot, run.spec, run.accelerator_kind, latency, report.options.start_s
            )
            assert snapshot.nodes.index[run.node_id] in allowed, (run.spec.id, run.node_id)


AUTOSCALED = """
[[inference]]
id = "tidal"
tenant = "t"
accepted_kinds = ["gpu"]
latency_slo_ms = 1000.0
reference_ms_per_request = 1.0
peak_requests_per_s = 25.0
traffic = [{ region = "europe-west3", share = 1.0, utc_offset_hours = 1.0 }]
autoscale = { min_replicas = 1, max_replicas = 3, target_requests_per_s = 10.0 }
"""


def test_an_autoscaled_deployment_gets_no_more_replica_hours_than_any_policy_ran(
    tmp_path: Path,
) -> None:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(TWO_ZONES.replace("count = 1", "count = 3"), encoding="utf-8")
    workload = tmp_path / "workload.toml"
    workload.write_text(AUTOSCALED, encoding="utf-8")
    options = EvalOptions(
        start=START,
        days=1,
        fleet=fleet,
        workload=workload,
        policies=("fifo-binpack", "green"),
        bound=True,
    )
    report = run_eval(options)
    bound = report.inference_bound
    assert bound is not None
    held = [
        sum(
            min(run.end_s or options.start_s + 86400.0, options.start_s + 86400.0) - run.start_s
            for run in outcome.replicas
        )
        / 3600.0
        for outcome in report.outcomes
    ]
    assert bound.replica_hours <= min(held) * (1 + 1e-9)
    assert bound.replica_hours > 24.0  # it scaled out by day
    for result in report.results:
        assert result.slo_violations == 0
        assert bound.gco2 <= result.inference_gco2 * (1 + 1e-9), result.policy
