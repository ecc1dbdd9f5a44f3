"""``greenfed eval`` measures every policy against the optimum over the same work: a job
no pool can finish before the run stops draining is refused up front, a job some policy
left unfinished withholds the training and total shares (saying which job), a job no
policy started is in no figure, and work a workload file submits after the period is
left out of the simulation, the optimum and the header alike."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from cloud.eval.bound import optimum
from cloud.eval.inference_bound import inference_optimum
from cloud.eval.metrics import evaluate
from cloud.eval.optimum_share import optimum_shares
from cloud.eval.report import as_json, optimum_line, table
from cloud.eval.runner import (
    EvalOptions,
    build_scenario,
    run_eval,
    serving_latency,
    sim_config,
)
from cloud.eval.simulation import DAY_S, HOUR_S, Simulation
from cloud.eval.workload import load_workload
from greenfed.cli import main

from .scenarios import SMALL_FLEET

ONE_JOB_OF = """
[[training]]
id = "{job_id}"
tenant = "t"
submit_offset_s = {submit_offset_s}
duration_s = {duration_s}
"""


def write_inputs(directory: Path, workload: str) -> tuple[Path, Path]:
    fleet = directory / "fleet.toml"
    fleet.write_text(SMALL_FLEET, encoding="utf-8")
    path = directory / "workload.toml"
    path.write_text(workload, encoding="utf-8")
    return fleet, path


def scenario_args(fleet: Path, workload: Path) -> list[str]:
    return ["--fleet", str(fleet), "--workload", str(workload)]


def job(job_id: str, submit_offset_s: float, duration_s: float) -> str:
    return ONE_JOB_OF.format(job_id=job_id, submit_offset_s=submit_offset_s, duration_s=duration_s)


def test_a_job_no_pool_can_finish_before_the_drain_stops_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 60 days on an A100: even the small fleet's H100s take weeks longer than the
    # evaluation drains (14 days after the period).
    fleet, workload = write_inputs(
        tmp_path, job("fits", 0.0, 3600.0) + job("sixty-days", 0.0, 60 * DAY_S)
    )
    code = main(
        ["eval", "--days", "1", "--policies", "fifo-binpack", *scenario_args(fleet, workload)]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1, err
    assert "training job sixty-days cannot finish" in err
    assert "2023-06-16 00:00, 14 days after the period" in err


def test_a_job_that_finishes_on_its_fastest_pool_is_not_refused(tmp_path: Path) -> None:
    # Twelve days on an A100 are 27 on the V100s, which the job may also use, past the
    # drain's end; but on the H100s it takes five, so a policy can finish it.
    fleet, workload = write_inputs(tmp_path, job("long", 0.0, 12 * DAY_S))
    scenario = build_scenario(
        EvalOptions(days=1, fleet=fleet, workload=workload, policies=("fifo-binpack",))
    )
    assert [spec.id for spec in scenario.workload.training] == ["long"]


def test_shares_are_withheld_where_a_policy_left_a_job_unfinished(tmp_path: Path) -> None:
    """A run stopped draining with a job still running: the optimum does all of its
    work, the policies part of it, so no training or total share compares; inference's
    share, over the same deployments, still does."""
    fleet, workload = write_inputs(
        tmp_path, job("done", 0.0, 3600.0) + job("cut-off", 20 * HOUR_S, 20 * HOUR_S)
    )
    options = EvalOptions(
        days=1, fleet=fleet, workload=workload, policies=("fifo-binpack", "green"), bound=True
    )
    scenario = build_scenario(options)
    latency = serving_latency(scenario, options.start_s)
    outcomes = [
        Simulation(
            # The drain stops an hour after the period, five hours after "cut-off" was
            # submitted: it runs eight even on the H100s.
            dataclasses.replace(sim_config(options, name), max_drain_s=HOUR_S),
            scenario.nodes,
            scenario.workload,
            scenario.provider,
            latency,
        ).run()
        for name in options.policies
    ]
    results = [evaluate(outcome, scenario.recorded) for outcome in outcomes]
    assert all(result.unfinished_jobs == 1 for result in results)
    bound = optimum(scenario.workload, scenario.nodes, outcomes, scenario.recorded, options.energy)
    inference = inference_optimum(
        scenario.workload, scenario.nodes, outcomes, scenario.recorded, options.energy, latency
    )
    assert bound.jobs == 2
    assert "job cut-off had not finished when the run stopped draining" in bound.unequal_work
    assert "under fifo-binpack" in bound.unequal_work
    for result in results:
        shares = optimum_shares(results, result, bound, inference)
        assert shares.training is None
        assert shares.total is None
    assert f"no training or total share: {bound.unequal_work}" in optimum_line(
        results, bound, inference
    )
    items = json.loads(as_json(results, bound, inference))
    for item in items:
        assert item["of_optimum_training"] is None
        assert item["of_optimum_total"] is None
        assert item["optimum_unequal_work"] == bound.unequal_work
    header, _, *rows = table(results, bound, inference).splitlines()
    at = header.index("of optimum (training)")
    assert all(row[at : at + len("of optimum (training)")].strip() == "-" for row in rows)


def test_a_job_no_policy_started_is_in_no_figure(tmp_path: Path) -> None:
    """A deadline no node can meet: no policy starts the job, so the optimum, which
    measures the policies' service, leaves it out too, and the shares stand."""
    hopeless = job("hopeless", 0.0, 10 * HOUR_S) + "deadline_offset_s = 3600.0\n"
    fleet, workload = write_inputs(tmp_path, job("fits", 0.0, 3600.0) + hopeless)
    options = EvalOptions(
        days=1, fleet=fleet, workload=workload, policies=("fifo-binpack", "green"), bound=True
    )
    report = run_eval(options)
    assert all(outcome.jobs["hopeless"].first_start_s is None for outcome in report.outcomes)
    assert report.bound is not None
    assert report.bound.jobs == 1
    assert report.bound.unequal_work == ""
    assert report.bound.gco2 <= min(result.training_gco2 for result in report.results) + 1e-6


def test_work_submitted_after_the_period_is_left_out_and_counted_in_the_header(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    late_deployment = """
[[inference]]
id = "late-infer"
tenant = "t"
reference_ms_per_request = 0.5
peak_requests_per_s = 10.0
start_offset_s = 300000.0
traffic = [{ region = "us-west2", share = 1.0, utc_offset_hours = -8.0 }]
"""
    fleet, workload = write_inputs(
        tmp_path,
        job("early", 0.0, 3600.0) + job("after-period", 2 * DAY_S, 3600.0) + late_deployment,
    )
    code = main(
        ["eval", "--days", "1", "--policies", "fifo-binpack,green", *scenario_args(fleet, workload)]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    header = out.splitlines()[0]
    assert "1 training jobs (0 flexible), 0 inference deployments" in header
    assert "left out, submitted after the period: 1 training jobs, 1 inference deployments" in (
        header
    )
    assert "(1 jobs," in out  # the optimum's
    assert "(0 deployments," in out


def test_a_scenario_built_by_hand_with_late_work_still_gets_its_optimum(tmp_path: Path) -> None:
    """The optimum takes the jobs the simulations submitted, whatever the scenario holds."""
    fleet, workload = write_inputs(
        tmp_path, job("early", 0.0, 3600.0) + job("after-period", 2 * DAY_S, 3600.0)
    )
    options = EvalOptions(
        days=1, fleet=fleet, workload=workload, policies=("fifo-binpack",), bound=True
    )
    scenario = dataclasses.replace(build_scenario(options), workload=load_workload(workload))
    report = run_eval(options, scenario=scenario)
    assert report.bound is not None
    assert report.bound.jobs == 1
    assert report.inference_bound is not None
