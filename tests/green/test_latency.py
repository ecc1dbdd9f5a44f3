"""ServingLatency, the one latency estimator: the scheduler's SLO filter, the latency term
and the simulator all use it; default_latency_estimator builds it from the shipped matrix."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from cloud.green.latency import ServingLatency, default_latency_estimator
from cloud.scheduler import Candidates, InferenceDeployment, Policy, schedule
from cloud.signals.latency_matrix import shipped_latency_matrix

from .builders import gpu_server, snapshot

FLEET_REGIONS = ["us-west2", "northamerica-northeast2", "europe-west3", "africa-south1"]


def test_the_default_estimator_is_built_for_the_fleet() -> None:
    latency = default_latency_estimator([*FLEET_REGIONS, "mars-north1"], default_rtt_ms=250.0)
    matrix = shipped_latency_matrix()
    assert latency.default_rtt_ms == 250.0
    assert len(latency.rtt_ms) == 16  # 4 × 4, the unknown region left to the default
    for a, b in itertools.product(FLEET_REGIONS, repeat=2):
        assert latency.rtt(a, b) == matrix.rtt_ms(a, b)
    assert latency.rtt("africa-south1", "africa-south1") == 0.0
    assert latency.rtt("mars-north1", "us-west2") == 250.0
    assert latency.rtt("mars-north1", "mars-north1") == 0.0
    assert ("africa-south1", "asia-south1") in default_latency_estimator().rtt_ms


def test_the_estimate_is_weighted_rtt_plus_compute_per_kind() -> None:
    nodes = [
        gpu_server("a-home-slow", "X", region="r1", speed=0.5),
        gpu_server("b-near", "X", region="r2"),
        gpu_server("c-unknown", "X", region="r3"),
    ]  # the snapshot orders nodes by id
    # One ordering of a pair is enough; a pair not in the table costs the default.
    estimator = ServingLatency(rtt_ms={("r2", "r1"): 40.0}, default_rtt_ms=100.0)
    candidates = Candidates(np.arange(3), "gpu", 1, np.full(3, np.inf))
    with_traffic = InferenceDeployment(work_id="d", tenant="t", traffic_by_region={"r1": 1.0})
    estimate = estimator.estimate_ms(snapshot(nodes), with_traffic, candidates)
    # GPU compute without a reference_ms_per_request: 5 ms at relative speed 1.
    assert estimate.tolist() == pytest.approx([0.0 + 10.0, 40.0 + 5.0, 100.0 + 5.0])
    no_traffic = InferenceDeployment(work_id="d", tenant="t")
    assert estimator.estimate_ms(snapshot(nodes), no_traffic, candidates).tolist() == (
        pytest.approx([10.0, 5.0, 5.0])
    )


def test_a_slow_deployment_is_judged_on_its_own_latency_not_a_faster_twins() -> None:
    """The SLO filter's results are shared between deployments of one shape: the shape
    must hold everything the estimate depends on, or a slow model rides on a fast one's
    verdict."""
    nodes = [gpu_server("edge-1", "X", site="edge"), gpu_server("edge-2", "X", site="edge")]
    common = {"tenant": "t", "latency_slo_ms": 50.0, "traffic_by_region": {"r": 1.0}}
    fast = InferenceDeployment(work_id="a-fast", submitted_at=1.0, **common)  # type: ignore[arg-type]
    slow = InferenceDeployment(
        work_id="b-slow",
        submitted_at=2.0,
        reference_ms_per_request=500.0,
        **common,  # type: ignore[arg-type]
    )
    policy = Policy(latency_estimator=ServingLatency(rtt_ms={}, default_rtt_ms=0.0))
    together = schedule(snapshot(nodes, [fast, slow]), policy)
    alone = schedule(snapshot(nodes, [slow]), policy)
    assert [p.work_id for p in together.placements] == ["a-fast"]
    assert together.pending_for("b-slow") is not None
    assert alone.placements == ()


def test_with_its_daily_mixes_a_deployment_is_judged_at_its_worst_hour_per_node() -> None:
    """70 % of the traffic 220 ms from the node at its shares (154 ms), but at the near
    region's night 90 % of it (198 ms): an SLO must allow for the worst hour."""
    nodes = [gpu_server("a-here", "X", region="here"), gpu_server("b-far", "X", region="far")]
    mixes = ({"far": 0.7, "here": 0.3}, {"far": 0.9, "here": 0.1}, {"far": 0.2, "here": 0.8})
    rtt = {("far", "here"): 220.0}
    deployment = InferenceDeployment(
        work_id="d", tenant="t", traffic_by_region={"far": 0.7, "here": 0.3},
        reference_ms_per_request=1.0,
    )  # fmt: skip
    candidates = Candidates(np.arange(2), "gpu", 1, np.full(2, np.inf))
    at_shares = ServingLatency(rtt_ms=rtt).estimate_ms(snapshot(nodes), deployment, candidates)
    daily = ServingLatency(rtt_ms=rtt, daily_mixes={"d": mixes})
    worst = daily.estimate_ms(snapshot(nodes), deployment, candidates)
    assert at_shares.tolist() == pytest.approx([154.0 + 1.0, 66.0 + 1.0])
    assert worst.tolist() == pytest.approx([198.0 + 1.0, 176.0 + 1.0])
    other = InferenceDeployment(work_id="e", tenant="t", traffic_by_region={"far": 1.0})
    assert daily.worst_network_ms(("here",), other).tolist() == [220.0]  # no mixes: shares
