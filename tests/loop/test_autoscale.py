"""The HPA rule of autoscaled deployments (cloud/loop/autoscale.py)."""

from __future__ import annotations

import math
from typing import Any

import msgspec
import pytest

from cloud.loop.autoscale import RECOMMENDATION_CEILING, Autoscaler, ServingLoad, carbon_cap
from cloud.loop.scaling import serving_load
from cloud.work.specs import AutoscaleSpec, CarbonCapSpec, DeploymentSpec
from shared.errors import FieldError
from shared.messages import TELEMETRY_DECODER
from tests.loop.builders import allocation, node
from tests.loop.test_disruption_budget import ready_on


def rule(**fields: Any) -> AutoscaleSpec:
    return AutoscaleSpec(
        **{"min_replicas": 2, "max_replicas": 8, "target_requests_per_s": 100.0, **fields}
    )


def rps(total: float, ready: int = 2, p95: float | None = None) -> ServingLoad:
    return ServingLoad(ready_replicas=ready, requests_per_s=total, p95_latency_ms=p95)


def test_load_above_the_target_scales_up_at_once_by_the_hpa_formula() -> None:
    scaler = Autoscaler()
    decision = scaler.decide("d", rule(), 2, rps(500.0), now_s=0.0)
    assert decision is not None
    assert (decision.from_replicas, decision.to_replicas) == (2, 5)  # ceil(500 / 100)
    assert decision.recommendation == 5
    assert decision.observed == 250.0
    assert "250 requests/s per replica against a target of 100" in decision.reason


def test_within_the_tolerance_nothing_changes_and_without_figures_nothing_is_decided() -> None:
    scaler = Autoscaler()
    assert scaler.decide("d", rule(), 2, rps(218.0), now_s=0.0) is None  # 9 % over
    assert scaler.decide("d", rule(), 2, None, now_s=1.0) is None


def test_a_step_and_the_bounds_limit_each_decision() -> None:
    scaler = Autoscaler()
    up = scaler.decide("d", rule(max_step=2), 2, rps(2_000.0), now_s=0.0)
    assert up is not None
    assert up.to_replicas == 4  # 20 recommended, 2 per step
    capped = Autoscaler().decide("d", rule(max_step=100), 2, rps(2_000.0), now_s=0.0)
    assert capped is not None
    assert capped.to_replicas == 8  # max_replicas


def test_scaling_down_waits_for_the_window_and_takes_its_highest_recommendation() -> None:
    scaler = Autoscaler()
    spec = rule(scale_down_stabilization_s=60.0)
    assert scaler.decide("d", spec, 6, rps(600.0, ready=6), now_s=0.0) is None
    # The load halves: not yet, a minute of history is needed.
    assert scaler.decide("d", spec, 6, rps(300.0, ready=6), now_s=30.0) is None
    # After the window the highest recommendation in it (6 at t=0 has left it; 3 stays).
    decision = scaler.decide("d", spec, 6, rps(200.0, ready=6), now_s=75.0)
    assert decision is not None
    assert decision.to_replicas == 3
    # Never below min_replicas.
    later = scaler.decide("d", spec, 3, rps(0.0, ready=3), now_s=200.0)
    assert later is not None
    assert later.to_replicas == 2


def test_scaling_up_with_a_window_takes_its_lowest_recommendation() -> None:
    scaler = Autoscaler()
    spec = rule(scale_up_stabilization_s=30.0, max_step=10)
    first = scaler.decide("d", spec, 2, rps(400.0), now_s=0.0)
    assert first is not None
    assert first.to_replicas == 4
    # A spike to 800: the window still holds 4, so 4 it stays.
    assert scaler.decide("d", spec, 4, rps(800.0, ready=4), now_s=10.0) is None


def test_a_latency_target_scales_on_the_worst_replicas_p95() -> None:
    spec = rule(target_requests_per_s=None, target_p95_latency_ms=20.0)
    decision = Autoscaler().decide("d", spec, 2, rps(10.0, p95=45.0), now_s=0.0)
    assert decision is not None
    assert decision.to_replicas == 5  # ceil(2 × 45 / 20)
    assert decision.metric == "p95_latency_ms"


def test_the_carbon_ladder_caps_replicas_unless_latency_breaks_its_slo() -> None:
    spec = rule(
        max_step=10,
        max_replicas_by_carbon=(
            CarbonCapSpec(above_g_per_kwh=300.0, max_replicas=5),
            CarbonCapSpec(above_g_per_kwh=500.0, max_replicas=1),
        ),
    )
    assert carbon_cap(spec, 100.0) is None
    assert carbon_cap(spec, 350.0) == 5
    assert carbon_cap(spec, 600.0) == 2  # never below min_replicas
    capped = Autoscaler().decide("d", spec, 2, rps(800.0), now_s=0.0, intensity_g_per_kwh=350.0)
    assert capped is not None
    assert capped.to_replicas == 5
    assert "capped at 5 while the grid is at 350 gCO2/kWh" in capped.reason
    breaking = Autoscaler().decide(
        "d", spec, 2, rps(800.0, p95=90.0), now_s=0.0, intensity_g_per_kwh=350.0,
        latency_slo_ms=50.0,
    )  # fmt: skip
    assert breaking is not None
    assert breaking.to_replicas == 8


def test_the_rate_per_replica_is_over_the_replicas_that_serve() -> None:
    # Two replicas on "a", one of them still starting; "b" went offline with its last
    # sample and report kept. The rate "a" serves is its one ready replica's.
    members = tuple(
        allocation("detector", i, node_id, (f"gpu{i}",), kind="inference")
        for i, node_id in enumerate(("a", "a", "b"))
    )
    nodes = {
        "a": ready_on("a", members[:1]),
        "b": ready_on("b", members, state="offline"),
    }
    assert serving_load("detector", members, nodes) == ServingLoad(1, 1.0, None)
    assert serving_load("detector", members, {"a": node("a")}) is None  # nothing ready


DIRTY_GRID_CAP = (CarbonCapSpec(above_g_per_kwh=400.0, max_replicas=2),)


def test_a_carbon_cap_scales_down_a_step_at_a_time_after_the_window() -> None:
    # Ten replicas on target when the grid turns dirty: the cap scales them down as a
    # fall in load would, not to 2 at once (nor on a new leader's first look).
    spec = rule(
        min_replicas=1, max_replicas=10, max_step=2, scale_down_stabilization_s=300.0,
        max_replicas_by_carbon=DIRTY_GRID_CAP,
    )  # fmt: skip
    scaler = Autoscaler()
    on_target = rps(1_000.0, ready=10)
    assert scaler.decide("d", spec, 10, on_target, now_s=0.0, intensity_g_per_kwh=500.0) is None
    assert scaler.decide("d", spec, 10, on_target, now_s=150.0, intensity_g_per_kwh=500.0) is None
    replicas, steps = 10, []
    for now_s in (300.0, 305.0, 310.0, 315.0, 320.0):
        decision = scaler.decide(
            "d", spec, replicas, rps(100.0 * replicas, ready=replicas), now_s=now_s,
            intensity_g_per_kwh=500.0,
        )  # fmt: skip
        if decision is not None:
            assert "capped at 2 while the grid is at 500 gCO2/kWh" in decision.reason
            replicas = decision.to_replicas
        steps.append(replicas)
    assert steps == [8, 6, 4, 2, 2]


def test_a_latency_breach_that_lifted_the_cap_holds_the_replicas_through_the_window() -> None:
    # 400 requests/s: 2 replicas break the 50 ms SLO (which lifts the cap of 2), 4 meet
    # it. The replicas go up once and stay for the scale-down window, not flap each pass.
    spec = rule(
        min_replicas=1, max_replicas=10, max_step=2, scale_down_stabilization_s=300.0,
        max_replicas_by_carbon=DIRTY_GRID_CAP,
    )  # fmt: skip
    scaler = Autoscaler()
    replicas, history = 2, []
    for now_s in range(0, 300, 5):
        p95_ms = 80.0 if replicas <= 2 else 30.0
        decision = scaler.decide(
            "d", spec, replicas, rps(400.0, ready=replicas, p95=p95_ms), now_s=float(now_s),
            intensity_g_per_kwh=500.0, latency_slo_ms=50.0,
        )  # fmt: skip
        if decision is not None:
            replicas = decision.to_replicas
        history.append(replicas)
    assert history == [4] * len(history)


def test_the_spec_names_the_field_at_fault() -> None:
    with pytest.raises(FieldError, match="max_replicas"):
        rule(min_replicas=5, max_replicas=3)
    with pytest.raises(FieldError, match="exactly one"):
        rule(target_p95_latency_ms=20.0)
    with pytest.raises(msgspec.ValidationError, match="replicas"):
        msgspec.convert(
            {"name": "d", "model_id": "m", "replicas": 1, "autoscale": {"min_replicas": 2,
             "max_replicas": 4, "target_requests_per_s": 10}},
            DeploymentSpec,
        )  # fmt: skip


@pytest.mark.parametrize(
    "load",
    [
        rps(1e308),  # per replica over the target overflows to inf
        rps(math.inf),  # nodes' figures that added up past the largest float
        rps(1e300, ready=1),  # finite, but a recommendation of hundreds of digits
        rps(10.0, p95=math.inf),
    ],
)
def test_absurd_figures_scale_up_within_the_bounds_and_never_raise(load: ServingLoad) -> None:
    def spec(max_step: int) -> AutoscaleSpec:
        if load.p95_latency_ms is None:
            return rule(max_step=max_step)
        return rule(max_step=max_step, target_requests_per_s=None, target_p95_latency_ms=20.0)

    decision = Autoscaler().decide("d", spec(100), 2, load, now_s=0.0)
    assert decision is not None
    assert decision.to_replicas == 8  # max_replicas: what a real surge gets
    assert decision.recommendation == RECOMMENDATION_CEILING
    # As for any surge, max_step paces it.
    stepped = Autoscaler().decide("d", spec(2), 2, load, now_s=0.0)
    assert stepped is not None
    assert stepped.to_replicas == 4


def test_a_figure_that_is_not_a_number_decides_nothing() -> None:
    assert Autoscaler().decide("d", rule(), 2, rps(math.nan), now_s=0.0) is None


def test_telemetry_with_absurd_serving_figures_is_refused() -> None:
    def wire(**figures: float) -> bytes:
        sample = {"deployment_id": "d", "requests": 1, "errors": 0, "rejected": 0}
        return msgspec.json.encode({
            "node_id": "n1", "instance_id": "i1", "seq": 1, "sampled_at": 1.0,
            "interval_s": 1.0, "cpu_utilization_pct": 1.0, "memory_used_bytes": 1,
            "memory_total_bytes": 2, "deployments": [sample | figures],
        })  # fmt: skip

    TELEMETRY_DECODER.decode(wire(requests_per_s=1e6, latency_p95_ms=3_600_000.0))
    for absurd in (
        {"requests_per_s": 1e308},
        {"requests_per_s": 1.0, "latency_p95_ms": 1e308},
        {"requests_per_s": 1.0, "latency_p50_ms": 1e12},
        {"requests_per_s": 1.0, "latency_p99_ms": 1e12},
        {"requests_per_s": 1.0, "mean_batch_size": 1e12},
    ):
        with pytest.raises(msgspec.ValidationError, match=r"<="):
            TELEMETRY_DECODER.decode(wire(**absurd))
