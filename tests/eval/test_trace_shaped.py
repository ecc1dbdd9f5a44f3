"""The trace-shaped workload (cloud/eval/trace_shaped.py): it draws what its docstring
documents, scales its load to the fleet, and ``greenfed eval --generator trace`` runs it."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from pathlib import Path

import pytest

from cloud.eval.fleet import load_fleet_nodes
from cloud.eval.generate import HOUR_S, cloud_gpu_throughput
from cloud.eval.trace_shaped import (
    TRACE_GANGS,
    TraceShape,
    clipped_lognormal_mean_s,
    fits_multi_node_gang,
    generate_trace_shaped,
)
from cloud.eval.workload import Workload, load_workload
from cloud.scheduler import Node
from greenfed.cli import main

START = 1_685_577_600.0  # 2023-06-01T00:00:00Z
ROOT = Path(__file__).resolve().parents[2]
OTHER_ZONES = ROOT / "sim_devices/fleets/other-zones.toml"
# A long sample: a year of arrivals (several thousand jobs), so shares and medians
# are within a few points of what is drawn.
SAMPLE_DAYS = 365.0


@pytest.fixture(scope="module")
def nodes() -> tuple[Node, ...]:
    return tuple(load_fleet_nodes(None))


@pytest.fixture(scope="module")
def year(nodes: tuple[Node, ...]) -> Workload:
    return generate_trace_shaped(nodes, start_s=START, days=SAMPLE_DAYS, seed=7)


def offered_load(workload: Workload, nodes: tuple[Node, ...], days: float) -> float:
    """GPU-seconds of training on an A100 over the fleet's throughput over the period."""
    work_gpu_s = sum(
        job.duration_s * job.workers * job.gpus_per_worker for job in workload.training
    )
    return work_gpu_s / (cloud_gpu_throughput(nodes) * days * 24 * HOUR_S)


def test_gang_shares_are_the_documented_ones(year: Workload) -> None:
    counts = Counter((job.workers, job.gpus_per_worker) for job in year.training)
    total = sum(counts.values())
    assert total > 3000
    for probability, workers, gpus in TRACE_GANGS:
        assert counts[(workers, gpus)] / total == pytest.approx(probability, abs=0.025)
    assert set(counts) == {(workers, gpus) for _, workers, gpus in TRACE_GANGS}


def test_eight_gpu_gangs_take_most_of_the_gpu_time(year: Workload) -> None:
    gpu_s: dict[int, float] = {}
    for job in year.training:
        gpu_s[job.gpus_per_worker] = gpu_s.get(job.gpus_per_worker, 0.0) + (
            job.duration_s * job.workers * job.gpus_per_worker
        )
    assert gpu_s[8] / sum(gpu_s.values()) > 0.65  # 75 % drawn (Helios: large jobs dominate)


def test_run_times_are_long_and_heavy_tailed(year: Workload) -> None:
    shape = TraceShape()
    durations = sorted(job.duration_s for job in year.training)
    assert statistics.median(durations) / HOUR_S == pytest.approx(shape.median_duration_h, rel=0.1)
    assert min(durations) >= shape.min_duration_s
    assert max(durations) <= shape.max_duration_s
    # Heavy tail: about 10 % of the jobs run longer than 20 h (σ 1.5, median 3 h).
    long_share = sum(duration > 20 * HOUR_S for duration in durations) / len(durations)
    assert long_share == pytest.approx(0.103, abs=0.025)
    assert statistics.fmean(durations) == pytest.approx(clipped_lognormal_mean_s(shape), rel=0.1)


def test_few_jobs_can_wait(year: Workload) -> None:
    flexible = [
        job
        for job in year.training
        if job.deadline_offset_s is not None or job.max_delay_s is not None
    ]
    assert len(flexible) / len(year.training) == pytest.approx(
        TraceShape().flexible_share, abs=0.02
    )


def test_the_load_is_scaled_to_the_fleet(nodes: tuple[Node, ...], year: Workload) -> None:
    # The generator scales by the unclipped mean; trace_shaped corrects for the clip,
    # so the offered load is the target's, not ~15 % under it.
    assert offered_load(year, nodes, SAMPLE_DAYS) == pytest.approx(0.5, rel=0.1)
    heavier = generate_trace_shaped(nodes, start_s=START, days=SAMPLE_DAYS, seed=7, target_load=1.0)
    assert offered_load(heavier, nodes, SAMPLE_DAYS) == pytest.approx(1.0, rel=0.1)
    assert len(heavier.training) == pytest.approx(2 * len(year.training), rel=0.1)


def test_the_load_follows_the_fleet_size(nodes: tuple[Node, ...]) -> None:
    other = tuple(load_fleet_nodes(OTHER_ZONES))
    workload = generate_trace_shaped(other, start_s=START, days=SAMPLE_DAYS, seed=7)
    assert offered_load(workload, other, SAMPLE_DAYS) == pytest.approx(0.5, rel=0.1)


def test_the_same_seed_gives_the_same_workload(nodes: tuple[Node, ...]) -> None:
    first = generate_trace_shaped(nodes, start_s=START, days=14, seed=5)
    again = generate_trace_shaped(nodes, start_s=START, days=14, seed=5)
    other = generate_trace_shaped(nodes, start_s=START, days=14, seed=6)
    assert first == again
    assert first.training != other.training


def test_multi_node_gangs_only_where_a_region_holds_two_wide_nodes(
    nodes: tuple[Node, ...],
) -> None:
    assert fits_multi_node_gang(nodes)  # two H100 8x in us-west2, two V100 8x in europe-west3
    # Keep one node of 8 GPUs per region: a 2 x 8 gang could never run there.
    seen: set[str] = set()
    narrow: list[Node] = []
    for node in nodes:
        wide = any(pool.kind == "gpu" and pool.count >= 8 for pool in node.pools)
        if wide and node.region in seen:
            continue
        if wide:
            seen.add(node.region)
        narrow.append(node)
    assert not fits_multi_node_gang(narrow)
    workload = generate_trace_shaped(narrow, start_s=START, days=SAMPLE_DAYS, seed=7)
    counts = Counter((job.workers, job.gpus_per_worker) for job in workload.training)
    assert counts[(2, 8)] == 0
    assert counts[(1, 8)] / len(workload.training) == pytest.approx(0.33, abs=0.025)


def test_greenfed_eval_runs_the_trace_shaped_workload(
    tmp_path: Path, nodes: tuple[Node, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    dumped = tmp_path / "trace.json"
    code = main(
        [
            "eval",
            "--generator",
            "trace",
            "--days",
            "1",
            "--seed",
            "11",
            "--policies",
            "fifo-binpack,green",
            "--dump-workload",
            str(dumped),
            "--json",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    results = json.loads(out)
    assert [r["policy"] for r in results] == ["fifo-binpack", "green"]
    assert all(r["of_optimum_training"] is not None for r in results[1:])
    expected = generate_trace_shaped(nodes, start_s=START, days=1, seed=11)
    assert load_workload(dumped).training == expected.training


def test_an_unknown_generator_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["eval", "--generator", "philly", "--days", "1"])
    assert "invalid choice" in capsys.readouterr().err


def test_the_report_says_the_workload_is_trace_shaped(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["eval", "--generator", "trace", "--days", "0.5", "--policies", "fifo-binpack"])
    assert code == 0
    assert "workload generated (trace-shaped), seed" in capsys.readouterr().out
