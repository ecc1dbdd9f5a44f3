"""The carbon, price and latency terms: raw values, direction, fallbacks; and the
scheduler's normalisation of them."""

from __future__ import annotations

import numpy as np
import pytest

from cloud.green.energy import EnergyModel
from cloud.green.latency import ServingLatency, default_latency_estimator
from cloud.green.terms import CarbonTerm, LatencyTerm, PriceTerm
from cloud.green.window import window_means
from cloud.scheduler import (
    Candidates,
    InferenceDeployment,
    Policy,
    TermValues,
    TrainingJob,
    schedule,
)
from cloud.scheduler.extensions import normalise

from .builders import HOUR, T0, flat, gpu_server, grid, series, snapshot

JOB = TrainingJob(work_id="j", tenant="t", duration_s=2 * HOUR, submitted_at=T0)


def all_candidates(count: int, runtime_s: float = 2 * HOUR) -> Candidates:
    return Candidates(np.arange(count), "gpu", 1, np.full(count, runtime_s))


def test_carbon_is_kwh_times_the_mean_intensity_over_the_run_window() -> None:
    # 100 g for the first hour, 300 g after: a 2 h run from now averages 200 g.
    signals = grid(series("X", [100.0, 300.0, 300.0, 300.0]), flat("Y", 50.0))
    snap = snapshot([gpu_server("x", "X"), gpu_server("y", "Y")])
    term = CarbonTerm(signals)
    raw = term.evaluate(snap, JOB, all_candidates(2))
    kwh = EnergyModel().training_kwh(snap, JOB, all_candidates(2))
    assert raw.raw[0] == pytest.approx(kwh[0] * 200.0)
    assert raw.raw[1] == pytest.approx(kwh[1] * 50.0)
    assert raw.higher_is_better is False
    assert raw.name == "carbon"


def test_the_window_starts_at_the_snapshot_time() -> None:
    signals = grid(series("X", [100.0, 300.0, 300.0, 300.0]))
    snap = snapshot([gpu_server("x", "X")], now=T0 + HOUR)
    raw = CarbonTerm(signals).grams(snap, JOB, all_candidates(1))
    kwh = EnergyModel().training_kwh(snap, JOB, all_candidates(1))
    assert raw[0] == pytest.approx(kwh[0] * 300.0)


def test_price_is_kwh_times_the_mean_price() -> None:
    signals = grid(series("X", [100.0] * 4, price=[40.0, 80.0, 80.0, 80.0]))
    snap = snapshot([gpu_server("x", "X")])
    cost = PriceTerm(signals).cost(snap, JOB, all_candidates(1))
    kwh = EnergyModel().training_kwh(snap, JOB, all_candidates(1))
    assert cost[0] == pytest.approx(kwh[0] * 60.0 / 1000)


def test_an_unknown_zone_gets_the_highest_known_intensity_and_is_flagged() -> None:
    signals = grid(flat("X", 100.0), flat("Y", 400.0))
    snap = snapshot([gpu_server("x", "X"), gpu_server("y", "Y"), gpu_server("z", "NOWHERE")])
    means = window_means(
        signals,
        snap,
        np.arange(3),
        np.full(3, T0),
        np.full(3, T0 + 2 * HOUR),
        "carbon",
        static_fallback={},
    )
    assert means.values.tolist() == [100.0, 400.0, 400.0]
    assert means.fallback.tolist() == [False, False, True]
    assert CarbonTerm(signals).fallback_zones(snap) == ("NOWHERE",)


def test_the_static_table_can_raise_the_fallback_but_never_lower_it() -> None:
    signals = grid(flat("X", 100.0))
    snap = snapshot([gpu_server("x", "X"), gpu_server("z", "Z")])
    start, end = np.full(2, T0), np.full(2, T0 + HOUR)
    higher = window_means(
        signals, snap, np.arange(2), start, end, "carbon", static_fallback={"Z": 900.0}
    )
    lower = window_means(
        signals, snap, np.arange(2), start, end, "carbon", static_fallback={"Z": 10.0}
    )
    assert higher.values[1] == 900.0
    assert lower.values[1] == 100.0


def test_with_no_data_at_all_the_value_is_nan_and_ranks_worst() -> None:
    snap = snapshot([gpu_server("z", "Z")])
    means = window_means(
        grid(),
        snap,
        np.arange(1),
        np.full(1, T0),
        np.full(1, T0 + HOUR),
        "carbon",
        static_fallback={},
    )
    assert np.isnan(means.values[0])


def test_unknown_zones_are_never_favoured_by_the_scheduler() -> None:
    # Only the clean zone has data; the node without any must not win.
    signals = grid(flat("CLEAN", 20.0), flat("DIRTY", 700.0))
    nodes = [
        gpu_server("a-unknown", "MYSTERY"),
        gpu_server("b-dirty", "DIRTY"),
        gpu_server("c-clean", "CLEAN"),
    ]
    policy = Policy(score_terms=(CarbonTerm(signals),), weights={"carbon": 5.0})
    plan = schedule(snapshot(nodes, [JOB]), policy)
    assert plan.placements[0].node_id == "c-clean"
    breakdowns = {b.node_id: b.term("carbon").value for b in plan.placements[0].runners_up}
    assert breakdowns["a-unknown"] <= breakdowns["b-dirty"]


def test_price_in_another_currency_is_not_compared() -> None:
    signals = grid(
        flat("X", 100.0, price=10.0), series("Y", [100.0] * 72, price=[1.0] * 72, currency="EUR")
    )
    snap = snapshot([gpu_server("x", "X"), gpu_server("y", "Y")])
    means = window_means(
        signals,
        snap,
        np.arange(2),
        np.full(2, T0),
        np.full(2, T0 + HOUR),
        "price",
        static_fallback={},
    )
    assert means.values.tolist() == [10.0, 10.0]
    assert means.fallback.tolist() == [False, True]


def test_carbon_normalisation_is_relative_to_the_largest() -> None:
    signals = grid(flat("X", 100.0), flat("Y", 400.0))
    snap = snapshot([gpu_server("x", "X"), gpu_server("y", "Y")])
    values = CarbonTerm(signals).evaluate(snap, JOB, all_candidates(2))
    assert normalise(values, 2).tolist() == pytest.approx([0.75, 0.0])


def test_latency_is_traffic_weighted_rtt_plus_compute() -> None:
    nodes = [
        gpu_server("near", "X", region="r1", site="edge", speed=0.5),
        gpu_server("far", "X", region="r2", site="edge", speed=0.5),
    ]
    estimator = ServingLatency(rtt_ms={("r1", "r2"): 40.0})
    deployment = InferenceDeployment(
        work_id="d",
        tenant="t",
        traffic_by_region={"r1": 3.0, "r2": 1.0},
        reference_ms_per_request=2.0,
    )
    raw = LatencyTerm(estimator).evaluate(
        snapshot(nodes), deployment, Candidates(np.arange(2), "gpu", 1, np.full(2, np.inf))
    )
    # near: 1/4 of the traffic is 40 ms away; far: 3/4 is. Compute: 2 ms / 0.5 = 4 ms.
    assert raw.raw.tolist() == pytest.approx([30.0 + 4.0, 10.0 + 4.0])  # far, near
    assert raw.higher_is_better is False


def test_latency_includes_queueing_and_an_overloaded_replica_is_infinite() -> None:
    estimator = ServingLatency(rtt_ms={})
    deployment = InferenceDeployment(
        work_id="d", tenant="t", replicas=1, requests_per_s=100.0, reference_ms_per_request=5.0
    )
    speeds = np.array([1.0, 0.5, 0.4])
    # rho = 100 x 5 ms = 0.5: 5 / 0.5 = 10 ms; at half speed rho = 1: cannot keep up.
    response = estimator.response_ms(deployment, "gpu", speeds)
    assert response[0] == pytest.approx(10.0)
    assert np.isinf(response[1:]).all()


def test_latency_carries_no_preference_for_training() -> None:
    snap = snapshot([gpu_server("x", "X"), gpu_server("y", "Y")])
    values = LatencyTerm(ServingLatency(rtt_ms={})).evaluate(snap, JOB, all_candidates(2))
    assert normalise(values, 2).tolist() == [1.0, 1.0]


def test_the_default_estimator_comes_from_the_shipped_matrix() -> None:
    estimator = default_latency_estimator(["us-west2", "africa-south1"])
    assert estimator.rtt("us-west2", "us-west2") == 0.0
    assert 200 < estimator.rtt("us-west2", "africa-south1") < 320  # estimated


# -- the scheduler's normalisation (extensions.normalise) ------------------------------


def test_nan_is_the_worst_score_in_both_directions() -> None:
    raw = np.array([1.0, np.nan, 3.0])
    lower = normalise(TermValues("t", raw, higher_is_better=False))
    higher = normalise(TermValues("t", raw, higher_is_better=True))
    assert lower.tolist() == [1.0, 0.0, 0.0]
    assert higher.tolist() == [0.0, 0.0, 1.0]
    bounded = normalise(TermValues("t", raw, higher_is_better=False, bounds=(0.0, 10.0)))
    assert bounded[1] == 0.0


def test_equal_values_carry_no_preference_in_both_directions() -> None:
    raw = np.array([5.0, 5.0])
    assert normalise(TermValues("t", raw, higher_is_better=False)).tolist() == [1.0, 1.0]
    assert normalise(TermValues("t", raw, higher_is_better=True)).tolist() == [1.0, 1.0]
    nan_too = normalise(TermValues("t", np.array([5.0, np.nan]), higher_is_better=False))
    assert nan_too.tolist() == [1.0, 0.0]


def test_a_term_must_return_one_value_per_candidate() -> None:
    with pytest.raises(ValueError, match="'t' returned 2 raw values for 3 candidates"):
        normalise(TermValues("t", np.array([1.0, 2.0]), higher_is_better=False), 3)
