"""Named policies: their weights, what they choose, and per-job overrides."""

from __future__ import annotations

import dataclasses

import pytest

from cloud.green.latency import ServingLatency
from cloud.green.migration import trial_policy
from cloud.green.policies import POLICIES, POLICY_NAMES, GreenInputs, build_policy, policy_spec
from cloud.green.shifting import DEFAULT_MIN_SAVING, WindowShifter
from cloud.green.waiting import CapacityWaiter
from cloud.scheduler import Allocation, InferenceDeployment, Snapshot, TrainingJob, schedule
from shared.settings import SchedulingSettings

from .builders import HOUR, T0, flat, gpu_server, grid, series, snapshot

INPUTS = GreenInputs(
    signals=grid(flat("CLEAN", 30.0, price=90.0), flat("DIRTY", 600.0, price=20.0)),
    latency=ServingLatency(rtt_ms={("near", "far"): 80.0}),
)
NODES = [
    gpu_server("a-dirty", "DIRTY", region="near"),
    gpu_server("b-clean", "CLEAN", region="far"),
]


def job(work_id: str = "j", **kwargs: object) -> TrainingJob:
    return TrainingJob(work_id=work_id, tenant="t", submitted_at=T0, **kwargs)  # type: ignore[arg-type]


def placed_on(policy: str, work: object) -> str:
    plan = schedule(snapshot(NODES, [work]), build_policy(policy, INPUTS))  # type: ignore[list-item]
    return plan.placements[0].node_id


def test_every_documented_policy_exists_with_all_weights() -> None:
    assert set(POLICY_NAMES) >= {"green", "cost", "latency", "balanced", "fifo-binpack", "spread"}
    for spec in POLICIES.values():
        assert set(spec.weights) == {
            "packing",
            "load",
            "speed",
            "preference",
            "spread",
            "carbon",
            "price",
            "latency",
        }
        assert all(weight >= 0 for weight in spec.weights.values())
    assert policy_spec("fifo-binpack").queue_order == "fifo"
    assert policy_spec("green").shifting == "carbon"
    assert policy_spec("cost").shifting == "price"
    with pytest.raises(ValueError, match="unknown policy 'greeen'"):
        policy_spec("greeen")


def test_carbon_agnostic_baselines_carry_no_green_terms() -> None:
    for name in ("fifo-binpack", "spread"):
        weights = policy_spec(name).weights
        assert weights["carbon"] == weights["price"] == weights["latency"] == 0.0
        assert policy_spec(name).shifting is None


def test_green_goes_to_the_clean_zone_cost_to_the_cheap_one() -> None:
    assert placed_on("green", job()) == "b-clean"
    assert placed_on("cost", job()) == "a-dirty"
    # The baseline ignores the grid: node order decides between equal nodes.
    assert placed_on("fifo-binpack", job()) == "a-dirty"


def test_per_job_weights_override_the_policy() -> None:
    assert placed_on("green", job(score_weights={"carbon": 0.0})) == "a-dirty"
    assert placed_on("fifo-binpack", job(score_weights={"carbon": 3.0})) == "b-clean"


def test_latency_prefers_the_near_region_and_the_slo_filters_for_every_policy() -> None:
    deployment = InferenceDeployment(
        work_id="d",
        tenant="t",
        accepted_kinds=("gpu",),
        traffic_by_region={"near": 1.0},
        reference_ms_per_request=1.0,
        sites=("cloud",),
    )
    assert placed_on("latency", deployment) == "a-dirty"
    tight = InferenceDeployment(
        work_id="d",
        tenant="t",
        accepted_kinds=("gpu",),
        traffic_by_region={"far": 1.0},
        reference_ms_per_request=1.0,
        latency_slo_ms=20.0,
        sites=("cloud",),
    )
    for name in ("green", "fifo-binpack", "spread"):
        assert placed_on(name, tight) == "b-clean"  # the only node within the SLO


def test_binpack_packs_and_spread_spreads() -> None:
    busy = Allocation(
        allocation_id="r/0",
        work_id="r",
        work_kind="training",
        tenant="t",
        priority="p1",
        preemptible=False,
        node_id="b-clean",
        accelerator_kind="gpu",
        accelerators=2,
        started_at=T0,
        expected_end=T0 + HOUR,
    )
    nodes = [
        gpu_server("a-dirty", "DIRTY"),
        gpu_server("b-clean", "CLEAN", cpu=(100.0, 500.0)),
    ]
    from dataclasses import replace

    # Telemetry reports the busy node's utilisation.
    nodes[1] = replace(
        nodes[1],
        pools=tuple(replace(p, utilisation=0.4) if p.kind == "gpu" else p for p in nodes[1].pools),
    )
    snap = Snapshot.build(now=T0, nodes=nodes, allocations=[busy], queue=[job()])
    assert schedule(snap, build_policy("fifo-binpack", INPUTS)).placements[0].node_id == "b-clean"
    assert schedule(snap, build_policy("spread", INPUTS)).placements[0].node_id == "a-dirty"


def test_fifo_order_ignores_fair_share() -> None:
    # Tenant "big" already runs work; "small" does not. Fair share puts small first.
    running = Allocation(
        allocation_id="x/0",
        work_id="x",
        work_kind="training",
        tenant="big",
        priority="p1",
        preemptible=False,
        node_id="a-dirty",
        accelerator_kind="gpu",
        accelerators=3,
        started_at=T0,
        expected_end=T0 + HOUR,
    )
    queue = [
        TrainingJob(work_id="first", tenant="big", submitted_at=T0 - 10),
        TrainingJob(work_id="second", tenant="small", submitted_at=T0 - 5),
    ]
    snap = Snapshot.build(now=T0, nodes=NODES, allocations=[running], queue=queue)
    assert schedule(snap, build_policy("fifo-binpack", INPUTS)).order == ("first", "second")
    assert schedule(snap, build_policy("green", INPUTS)).order == ("second", "first")


def test_shifting_policies_get_an_advisor_and_a_deadline_guard() -> None:
    green = build_policy("green", INPUTS)
    # Waiting for cleaner capacity; no temporal shifting unless a minimum saving is set.
    assert isinstance(green.start_advisor, CapacityWaiter)
    assert green.start_advisor.then is None
    shifting = build_policy("green", dataclasses.replace(INPUTS, min_saving=0.3))
    # Then waiting for cleaner capacity wraps temporal shifting for flexible jobs.
    assert isinstance(shifting.start_advisor, CapacityWaiter)
    assert isinstance(shifting.start_advisor.then, WindowShifter)
    assert shifting.start_advisor.then.min_saving == 0.3
    assert green.patience_s == INPUTS.patience_s
    assert green.deadline_guard_s is not None
    assert build_policy("green-spatial", INPUTS).start_advisor is None
    temporal = build_policy("green-temporal", INPUTS)
    assert temporal.weights["carbon"] == 0.0
    assert isinstance(temporal.start_advisor, CapacityWaiter)
    assert isinstance(temporal.start_advisor.then, WindowShifter)  # the ablation shifts
    assert build_policy("fifo-binpack", INPUTS).start_advisor is None


def test_green_defers_flexible_work_the_baseline_runs_at_once() -> None:
    signals = grid(series("CLEAN", [400.0] * 5 + [20.0] * 67), flat("DIRTY", 600.0))
    inputs = GreenInputs(signals=signals, latency=INPUTS.latency, min_saving=0.5)
    flexible = job(deadline=T0 + 24 * HOUR, duration_s=2 * HOUR)
    green = schedule(snapshot(NODES, [flexible]), build_policy("green", inputs))
    assert green.pending[0].code == "deferred"
    # Without a minimum saving set, green does not shift in time: it runs now.
    unset = dataclasses.replace(inputs, min_saving=None)
    assert schedule(snapshot(NODES, [flexible]), build_policy("green", unset)).placements
    baseline = schedule(snapshot(NODES, [flexible]), build_policy("fifo-binpack", inputs))
    assert baseline.placements


def test_temporal_shifting_is_off_unless_a_minimum_saving_is_set() -> None:
    # Live and in the evaluation alike: no minimum saving, no temporal shifting
    # (green waits for capacity and migrates); the ablation that measures shifting
    # uses the shifter's own default.
    assert SchedulingSettings().shifting_min_saving is None
    assert GreenInputs.__dataclass_fields__["min_saving"].default is None
    assert policy_spec("green").shifting_min_saving is None
    assert policy_spec("green-temporal").shifting_min_saving == DEFAULT_MIN_SAVING


def test_policies_that_wait_for_the_grid_rescue_deadlines() -> None:
    # Waiting, capping and moving for the grid must never be why a deadline is missed:
    # the policies that do them may evict checkpointing work for a job that would.
    rescuing = {name for name in POLICY_NAMES if build_policy(name, INPUTS).deadline_preemption}
    assert rescuing == {name for name, spec in POLICIES.items() if spec.shifting is not None}
    assert {"green", "cost", "balanced"} <= rescuing
    assert not rescuing & {"fifo-binpack", "spread", "latency"}


def test_what_if_placements_of_moves_evict_nothing() -> None:
    # The migrator's and room maker's trials place work on free capacity only: a trial
    # that rescued a deadline by eviction would call a move possible that is not.
    trial = trial_policy(build_policy("green", INPUTS))
    assert not trial.preemption
    assert not trial.deadline_preemption
