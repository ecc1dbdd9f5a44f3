"""The counterfactual of work the control plane places (cloud/usage/counterfactual.py)
agrees with `greenfed eval`'s (cloud/green/accounting.py)."""

from __future__ import annotations

import dataclasses

import pytest

from cloud.green.energy import EnergyModel
from cloud.green.latency import ServingLatency
from cloud.green.policies import GreenInputs, build_policy, build_power_capper
from cloud.scheduler import Node, Plan, TrainingJob, schedule
from cloud.store import CounterfactualRecord
from cloud.usage.counterfactual import BASELINE, live_counterfactuals
from shared.accelerators import capped_throughput
from tests.green.builders import HOUR, T0, flat, gpu_server, grid, snapshot

RECORDED = grid(flat("CLEAN", 100.0, price=20.0), flat("DIRTY", 500.0, price=10.0))
INPUTS = GreenInputs(signals=RECORDED, latency=ServingLatency(rtt_ms={}))
JOB = TrainingJob(work_id="j", tenant="t", submitted_at=T0, duration_s=2 * HOUR)


def placed(nodes: list[Node]) -> tuple[Plan, list[CounterfactualRecord]]:
    fleet = dataclasses.replace(snapshot(nodes), queue=(JOB,))
    plan = schedule(fleet, build_policy("green", INPUTS))
    assert plan.placements_for("j")
    records = live_counterfactuals(
        fleet, [(JOB, "tenant-1")], plan, build_policy(BASELINE, INPUTS), EnergyModel()
    )
    return plan, records


def test_the_baseline_would_have_used_the_first_node_on_the_dirty_grid() -> None:
    plan, (record,) = placed([gpu_server("a", "DIRTY"), gpu_server("b", "CLEAN")])
    assert [p.node_id for p in plan.placements_for("j")] == ["b"]
    assert record.work_id == "j"
    assert record.tenant_id == "tenant-1"
    assert record.zone_factors == pytest.approx({"DIRTY": 1.0})  # the same hardware


def test_a_hungrier_baseline_node_needs_more_energy_for_the_same_work() -> None:
    _, (record,) = placed([gpu_server("a", "DIRTY", max_w=800.0), gpu_server("b", "CLEAN")])
    # At the model's 80 % training utilisation, plus a quarter of the host CPU's power.
    host_w = (100.0 + 400.0 * 0.8) / 4
    hungry_w, frugal_w = 50.0 + 750.0 * 0.8 + host_w, 50.0 + 350.0 * 0.8 + host_w
    assert record.zone_factors == pytest.approx({"DIRTY": hungry_w / frugal_w})


def test_when_the_baseline_chooses_the_same_node_nothing_is_avoided() -> None:
    _, (record,) = placed([gpu_server("b", "CLEAN")])
    assert record.zone_factors == pytest.approx({"CLEAN": 1.0})


def test_a_capped_run_counts_what_the_baseline_would_have_drawn_uncapped() -> None:
    """On the same node, the baseline (which never caps power) needs more energy for the
    same work than the capped run does: the difference is avoided."""
    fleet = dataclasses.replace(snapshot([gpu_server("b", "DIRTY")]), queue=(JOB,))
    plan = schedule(fleet, build_policy("green", INPUTS))
    capper = build_power_capper("green", INPUTS)
    assert capper is not None
    plan = capper.cap(fleet, plan)
    (placement,) = plan.placements_for("j")
    assert placement.power_limit_w is not None
    (record,) = live_counterfactuals(
        fleet, [(JOB, "tenant-1")], plan, build_policy(BASELINE, INPUTS), EnergyModel()
    )
    host_w = (100.0 + 400.0 * 0.8) / 4
    uncapped_w = 50.0 + 350.0 * 0.8 + host_w
    capped_w = min(50.0 + 350.0 * 0.8, placement.power_limit_w) + host_w
    share = placement.power_limit_w / 400.0
    factor = uncapped_w / (capped_w / capped_throughput(share))
    assert factor > 1.0
    assert record.zone_factors == pytest.approx({"DIRTY": factor})
