"""The short form of the green robustness matrix (benchmarks/green_matrix.py --short):
both fleets, two periods, three days each, green against fifo-binpack and the optimum,
with the default generated workload and with trace-shaped work (long jobs, most GPU
time in 8-GPU and 2 x 8 gangs: cloud/eval/trace_shaped.py), the closest this project
has to a real cluster's trace."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(600)


@pytest.mark.parametrize("generator", ["default", "trace"])
def test_the_short_matrix_holds_the_bound_the_slos_and_the_deadlines(
    tmp_path: Path, generator: str
) -> None:
    out = tmp_path / "matrix.json"
    command = [sys.executable, "benchmarks/green_matrix.py", "--short", "--jobs", "2"]
    command += ["--generator", generator]
    done = subprocess.run(
        [*command, "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    document = json.loads(out.read_text(encoding="utf-8"))
    rows, summary = document["rows"], document["summary"]
    assert {row["scenario"]["fleet"] for row in rows} == {"default", "other-zones"}
    assert summary["scenarios"] == len(rows) == 4
    assert {row["scenario"]["generator"] for row in rows} == {generator}
    for row in rows:
        # No policy can beat the optimum: a share above 1 would mean a broken bound.
        assert row["of_optimum"] is None or row["of_optimum"] <= 1.0 + 1e-9, row
        assert row["co2_cut"] > 0, row  # green emits less than the carbon-blind baseline
        assert row["slo_violations"] == 0, row
        assert row["unfinished"] == 0, row
        # Inference too: replicas with latency headroom go to cleaner zones (its SLO held).
        assert row["inference_cut"] is not None, row
        assert row["inference_cut"] >= 0, row
        # Every job finishes, so each policy has a turnaround (submission to finish).
        assert row["baseline_turnaround_s"] > 0, row
        assert row["green_turnaround_s"] > 0, row
    assert summary["new_deadline_misses"] == 0
    assert summary["worst_turnaround_ratio"] >= summary["median_turnaround_ratio"] > 0
    assert "| fleet | start |" in done.stdout
    assert "median_co2_cut" in done.stdout


@pytest.mark.parametrize("where", ["no/such/dir/matrix.json", "."])
def test_a_json_path_it_cannot_write_is_refused_before_any_scenario_runs(
    tmp_path: Path, where: str
) -> None:
    target = tmp_path / where
    done = subprocess.run(
        [sys.executable, "benchmarks/green_matrix.py", "--short", "--json", str(target)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,  # before: every scenario ran first, then the write failed
        check=False,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "--json" in done.stderr
    assert str(target) in done.stderr
    assert "| fleet | start |" not in done.stdout  # no scenario ran
