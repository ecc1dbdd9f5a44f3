"""Green's capacity value (issue 30): clean capacity is worth keeping in usable shapes,
dirty capacity is not, and a zone the signals do not cover is worth nothing."""

from __future__ import annotations

import pytest

from cloud.green.latency import default_latency_estimator
from cloud.green.policies import GreenInputs, build_policy
from cloud.green.terms import CleanCapacity
from cloud.scheduler import Snapshot, TrainingJob, schedule

from .builders import T0, flat, gpu_server, grid, running_on, snapshot


def test_the_cleanest_node_is_worth_most_and_an_unknown_zone_nothing() -> None:
    signals = grid(flat("CLEAN", 50.0), flat("DIRTY", 500.0), flat("MID", 250.0))
    snap = snapshot(
        [
            gpu_server("clean", "CLEAN"),
            gpu_server("dirty", "DIRTY"),
            gpu_server("mid", "MID"),
            gpu_server("nowhere", "NO-SERIES"),
        ]
    )
    column = snap.nodes.kind_columns[0][0]
    values = dict(
        zip(snap.nodes.node_ids, CleanCapacity(signals).node_values(snap, column), strict=True)
    )
    assert values["dirty"] == 0.0
    assert values["clean"] == pytest.approx(0.9)
    assert values["mid"] == pytest.approx(0.5)
    assert values["nowhere"] == 0.0


def test_a_faster_node_in_the_same_zone_is_worth_more_per_unit_of_work() -> None:
    signals = grid(flat("Z", 200.0))
    snap = snapshot([gpu_server("slow", "Z", speed=0.5), gpu_server("fast", "Z", speed=2.0)])
    column = snap.nodes.kind_columns[0][0]
    values = dict(
        zip(snap.nodes.node_ids, CleanCapacity(signals).node_values(snap, column), strict=True)
    )
    assert values["slow"] == 0.0
    assert values["fast"] == pytest.approx(0.75)


def test_green_keeps_a_clean_4_gpu_node_whole_for_the_4_gpu_job_behind_a_pair() -> None:
    # One clean zone with a 4-GPU node and an 8-GPU node already running 2 GPUs, a
    # dirty zone with room for everything. Queue: a 2-GPU job, then two 4-GPU jobs.
    signals = grid(flat("CLEAN", 50.0), flat("DIRTY", 600.0))
    nodes = [
        gpu_server("a-clean-four", "CLEAN", count=4),
        gpu_server("b-clean-eight", "CLEAN", count=8),
        gpu_server("dirty-eight", "DIRTY", count=8),
    ]
    running = TrainingJob(work_id="r", tenant="t", accelerators_per_worker=2, submitted_at=T0)
    queue = [
        TrainingJob(work_id=f"q{n}", tenant="t", accelerators_per_worker=gpus, submitted_at=T0 + n)
        for n, gpus in enumerate((2, 4, 4))
    ]
    snap = Snapshot.build(
        now=T0, nodes=nodes, queue=queue, allocations=[running_on("b-clean-eight", running)]
    )
    inputs = GreenInputs(signals=signals, latency=default_latency_estimator())
    plan = schedule(snap, build_policy("green", inputs))
    placed = {p.work_id: p.node_id for p in plan.placements}
    assert placed["q0"] == "b-clean-eight"
    assert {placed["q1"], placed["q2"]} == {"a-clean-four", "b-clean-eight"}
