"""Flexible shapes in the evaluation: workload files declare alternative shapes, the
generator marks data-parallel jobs without disturbing the rest of a seed, and the
report counts the jobs that ran reshaped."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import msgspec
import pytest

from cloud.eval.fleet import load_fleet_nodes
from cloud.eval.generate import DATA_PARALLEL_SHAPES, WorkloadParams, generate_workload
from cloud.eval.report import table
from cloud.eval.runner import EvalOptions, run_eval
from cloud.eval.workload import ShapeSpec, load_workload, training_job
from cloud.scheduler import GangShape
from shared.settings import ConfigError

START = 1_685_577_600.0  # 2023-06-01T00:00:00Z

# Two 4-GPU A100 servers in clean Ontario and one 8-GPU H100 server in Frankfurt: a
# 1×8 job fits only the fast but dirty H100s, the same job as 2×4 the clean A100s.
FLEET = """
[[group]]
name = "a100-toronto"
profile = "a100-4x"
count = 2
site = "cloud"
zone = "CA-ON"
region = "northamerica-northeast2"

[[group]]
name = "h100-fra"
profile = "h100-8x"
count = 1
site = "cloud"
zone = "DE"
region = "europe-west3"
"""

WORKLOAD = """
[[training]]
id = "flexible"
tenant = "a"
submit_offset_s = 0
duration_s = 7200
gpus_per_worker = 8
alternative_shapes = [{ workers = 2, gpus_per_worker = 4 }]

[[training]]
id = "rigid"
tenant = "b"
submit_offset_s = 14400
duration_s = 7200
gpus_per_worker = 8
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_green_runs_the_data_parallel_job_reshaped_on_clean_capacity(tmp_path: Path) -> None:
    report = run_eval(
        EvalOptions(
            start=date(2023, 6, 1),
            days=1.0,
            policies=("fifo-binpack", "green"),
            fleet=write(tmp_path, "fleet.toml", FLEET),
            workload=write(tmp_path, "workload.toml", WORKLOAD),
            bound=True,
        )
    )
    baseline, green = report.results
    # The optimum may use the pools of every shape a job declares: it stays below what
    # green achieved by reshaping (on the declared shape's pools alone it would not).
    assert report.bound is not None
    assert "CA-ON" in report.bound.gpu_hours_by_zone
    assert report.bound.gco2 <= green.training_gco2 * (1 + 1e-6)
    assert (baseline.reshaped_jobs, green.reshaped_jobs) == (0, 1)
    # The carbon-blind baseline keeps the declared shape on the fast H100s.
    assert report.outcomes[0].jobs["flexible"].nodes == ("h100-fra-1",)
    jobs = report.outcomes[1].jobs
    assert jobs["flexible"].reshaped
    assert not jobs["rigid"].reshaped
    assert all(node.startswith("a100-toronto") for node in jobs["flexible"].nodes)
    assert len(jobs["flexible"].nodes) == 2
    # The same GPU work in either shape: both finish in the period.
    assert baseline.unfinished_jobs == green.unfinished_jobs == 0
    header, _, base_row, green_row = table(report.results).splitlines()
    assert "reshaped" in header.split()
    end = header.index(" reshaped ") + len(" reshaped")
    assert base_row[:end].split()[-1] == "0"
    assert green_row[:end].split()[-1] == "1"


def test_workload_files_declare_alternative_shapes(tmp_path: Path) -> None:
    workload = load_workload(write(tmp_path, "w.toml", WORKLOAD))
    spec = workload.training[0]
    assert spec.alternative_shapes == (ShapeSpec(workers=2, gpus_per_worker=4),)
    assert training_job(spec, 0.0).alternative_shapes == (GangShape(2, 4),)
    typo = WORKLOAD.replace("{ workers = 2,", "{ worker = 2,")
    with pytest.raises(ConfigError, match=r"unknown field `worker`.*alternative_shapes\[0\]"):
        load_workload(write(tmp_path, "typo.toml", typo))
    other_total = WORKLOAD.replace(
        "{ workers = 2, gpus_per_worker = 4 }", "{ workers = 2, gpus_per_worker = 2 }"
    )
    with pytest.raises(ConfigError, match=r"training\[0\].*same total"):
        load_workload(write(tmp_path, "total.toml", other_total))


def test_the_generator_marks_data_parallel_jobs_and_leaves_the_rest_of_the_seed() -> None:
    nodes = load_fleet_nodes()
    marked = generate_workload(nodes, start_s=START, days=7, seed=5)
    plain = generate_workload(
        nodes, start_s=START, days=7, seed=5, params=WorkloadParams(data_parallel_share=0.0)
    )
    # Apart from the mark, every job of the seed is the same.
    assert [msgspec.structs.replace(s, alternative_shapes=()) for s in marked.training] == list(
        plain.training
    )
    eligible = [
        s for s in marked.training if (s.workers, s.gpus_per_worker) in DATA_PARALLEL_SHAPES
    ]
    flexible = [s for s in eligible if s.alternative_shapes]
    assert len(flexible) / len(eligible) == pytest.approx(
        WorkloadParams().data_parallel_share, abs=0.1
    )
    for spec in flexible:
        assert spec.alternative_shapes == DATA_PARALLEL_SHAPES[(spec.workers, spec.gpus_per_worker)]
    assert not any(s.alternative_shapes for s in marked.training if s not in eligible)
