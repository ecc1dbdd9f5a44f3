"""The scheduler benchmark runs end to end, reports what the CLI prints, uses the shared GPUs."""

from __future__ import annotations

import json

import pytest

from cloud.eval import scheduler_bench
from cloud.scheduler import Plan, schedule
from shared.accelerators import ACCELERATORS

KEYS = {"placements_per_s", "decision_p50_us", "decision_p99_us", "nodes", "jobs", "placed"}


def test_run_benchmark_reports_the_required_fields() -> None:
    result = scheduler_bench.run_benchmark(300, 400, seed=3)
    assert set(result) >= KEYS
    assert (result["nodes"], result["jobs"]) == (300, 400)
    assert result["placed"] > 0
    assert result["decision_p50_us"] <= result["decision_p99_us"]


def test_run_benchmark_reports_the_snapshot_build_time() -> None:
    result = scheduler_bench.run_benchmark(300, 400, seed=3)
    assert result["snapshot_build_ms"] > 0
    assert result["placements_per_s"] >= result["jobs_placed_per_s"] > 0


def _outcome(plan: Plan) -> tuple[object, ...]:
    return (
        [(p.allocation_id, p.node_id, p.accelerator_kind, p.provider) for p in plan.placements],
        [(p.allocation_id, p.reason, p.preempted_by) for p in plan.preemptions],
        [(p.work_id, p.code, p.message) for p in plan.pending],
        plan.reservations,
    )


def test_same_seed_same_outcome() -> None:
    first = schedule(scheduler_bench.build_snapshot(300, 400, seed=1))
    second = schedule(scheduler_bench.build_snapshot(300, 400, seed=1))
    assert first.placements
    assert first.preemptions
    assert first.pending
    assert _outcome(first) == _outcome(second)
    assert first == second
    other = schedule(scheduler_bench.build_snapshot(300, 400, seed=2))
    assert _outcome(other) != _outcome(first)


def test_main_prints_one_json_object(capsys: pytest.CaptureFixture[str]) -> None:
    assert scheduler_bench.main(["--nodes", "200", "--jobs", "100", "--seed", "2", "--json"]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert len(printed) == 1
    assert set(json.loads(printed[0])) >= KEYS


def test_the_cluster_gpus_carry_the_shared_accelerator_facts() -> None:
    gpu_pools = {
        pool.model: pool
        for node in scheduler_bench.build_cluster(300, seed=3)
        for pool in node.pools
        if pool.kind == "gpu" and pool.model in ACCELERATORS
    }
    assert set(gpu_pools) == {
        "NVIDIA H100 80GB HBM3",
        "NVIDIA A100-SXM4-40GB",
        "Tesla V100-SXM2-32GB",
        "Tesla T4",
    }
    for model, pool in gpu_pools.items():
        facts = ACCELERATORS[model]
        figures = (pool.memory_bytes, pool.relative_speed, pool.idle_power_w, pool.max_power_w)
        assert figures == (
            facts.memory_bytes,
            facts.relative_speed,
            facts.idle_power_w,
            facts.max_power_w,
        ), model
