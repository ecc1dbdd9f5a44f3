"""The discrete-event simulation: it drives the real core, is deterministic for a
seed, and its numbers add up."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest

from cloud.eval.runner import EvalOptions, build_scenario, run_eval
from cloud.eval.simulation import HookFailedInEvaluation
from cloud.green.latency import ServingLatency

from .scenarios import write_scenario


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_scenario(tmp_path_factory.mktemp("scenario"))


def options(small: tuple[Path, Path], *policies: str, days: float = 1.0) -> EvalOptions:
    fleet, workload = small
    return EvalOptions(
        start=date(2023, 6, 1), days=days, policies=policies, fleet=fleet, workload=workload
    )


def test_every_job_runs_and_is_accounted(small: tuple[Path, Path]) -> None:
    report = run_eval(options(small, "fifo-binpack", "green"))
    for result, outcome in zip(report.results, report.outcomes, strict=True):
        assert result.jobs == 4
        assert result.unfinished_jobs == 0
        assert all(record.finish_s is not None for record in outcome.jobs.values())
        assert result.kwh > 0
        assert result.gco2 > 0
        assert result.cost > 0
        assert result.kwh == pytest.approx(result.training_kwh + result.inference_kwh)
        assert result.deadline_misses == 0
        assert result.slo_violations == 0
        assert result.slo_hours == 2 * 24 - 1  # the second deployment arrives at 00:01
        assert 0 < result.utilisation < 1
        assert result.wait_mean_s >= result.queue_wait_mean_s >= 0
        assert result.passes > 0
    baseline, _ = report.results
    # fifo-binpack's own counterfactual is itself, up to the estimate's resolution.
    assert abs(baseline.gco2_avoided) <= 0.05 * baseline.gco2


def test_the_simulation_is_deterministic(small: tuple[Path, Path]) -> None:
    first = run_eval(options(small, "green", "spread"))
    again = run_eval(options(small, "green", "spread"))
    for a, b in zip(first.results, again.results, strict=True):
        assert a.as_json() | {"runtime_s": 0} == b.as_json() | {"runtime_s": 0}


def test_the_default_scenario_is_built_from_the_default_fleet_and_generator() -> None:
    opts = EvalOptions(start=date(2023, 6, 1), days=0.25, policies=("fifo-binpack",), seed=3)
    scenario = build_scenario(opts)
    assert len(scenario.nodes) == 40
    assert {n.zone for n in scenario.nodes} == {"CA-ON", "US-CAL-CISO", "DE", "ZA"}
    assert len(scenario.workload.inference) == 8
    assert set(scenario.recorded.zones) == {"CA-ON", "US-CAL-CISO", "DE", "ZA"}
    [result] = run_eval(opts, scenario=scenario).results
    assert result.slo_violations == 0
    assert result.deadline_misses == 0


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match="unknown policy"):
        EvalOptions(policies=("nope",))
    with pytest.raises(ValueError, match="days"):
        EvalOptions(days=0)
    with pytest.raises(ValueError, match="unknown forecaster"):
        EvalOptions(forecaster="crystal-ball")


def test_a_failing_hook_stops_the_evaluation_naming_it(
    small: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Live, a failing hook leaves one job pending; an evaluation that carried on would
    report the bug's waits and misses as the policy's."""

    def broken(*args: object, **kwargs: object) -> None:
        raise KeyError("no RTT for this region")

    monkeypatch.setattr(ServingLatency, "estimate_ms", broken)
    with pytest.raises(HookFailedInEvaluation, match="latency estimator 'ServingLatency'"):
        run_eval(options(small, "green"))
