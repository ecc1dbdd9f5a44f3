"""The scheduler benchmark runs end to end and reports what the CLI prints."""

from __future__ import annotations

import json

import pytest

from cloud.scheduler import bench

KEYS = {"placements_per_s", "decision_p50_us", "decision_p99_us", "nodes", "jobs", "placed"}


def test_run_benchmark_reports_the_required_fields() -> None:
    result = bench.run_benchmark(300, 400, seed=3)
    assert set(result) >= KEYS
    assert (result["nodes"], result["jobs"]) == (300, 400)
    assert result["placed"] > 0
    assert result["decision_p50_us"] <= result["decision_p99_us"]


def test_same_seed_same_outcome() -> None:
    first, second = bench.run_benchmark(200, 200, seed=1), bench.run_benchmark(200, 200, seed=1)
    assert (first["placed"], first["pending"], first["preemptions"]) == (
        second["placed"],
        second["pending"],
        second["preemptions"],
    )


def test_main_prints_one_json_object(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--nodes", "200", "--jobs", "100", "--seed", "2", "--json"]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert len(printed) == 1
    assert set(json.loads(printed[0])) >= KEYS
