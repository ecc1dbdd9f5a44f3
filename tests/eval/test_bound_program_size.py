"""What keeps the training optimum's program small (cloud/eval/bound.py) without making
it any less of a lower bound: power modes a mix of the others beats are left out (the
optimum is the same), and a job's window on a pool ends with its run on that pool, so
that a MIG slice's slow run opens no late hours on the whole GPUs beside it."""

from __future__ import annotations

import pytest

from cloud.eval import bound
from cloud.eval.runner import EvalOptions, EvalReport, run_eval
from cloud.scheduler import Snapshot

# One A100 server in Ontario, one whole A100 beside one cut into 7 × 1g.10gb, and a
# 4 × A100 server in South Africa.
FLEET = """
[[group]]
name = "mig"
profile = "a100-mig"
count = 1
site = "cloud"
zone = "CA-ON"
region = "northamerica-northeast2"

[[group]]
name = "za"
profile = "a100-4x"
count = 1
site = "cloud"
zone = "ZA"
region = "africa-south1"
"""

# An hour of A100 work that cannot wait, one with a latest start, and one on slices.
WORKLOAD = """
seed = 1

[[training]]
id = "now"
tenant = "vision"
submit_offset_s = 0
duration_s = 3600

[[training]]
id = "later"
tenant = "speech"
submit_offset_s = 600
duration_s = 7200
max_delay_s = 14400

[[training]]
id = "sliced"
tenant = "vision"
submit_offset_s = 1200
duration_s = 1800
gpus_per_worker = 2
"""


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> EvalReport:
    directory = tmp_path_factory.mktemp("program")
    fleet, workload = directory / "fleet.toml", directory / "workload.toml"
    fleet.write_text(FLEET, encoding="utf-8")
    workload.write_text(WORKLOAD, encoding="utf-8")
    return run_eval(
        EvalOptions(
            days=1, fleet=fleet, workload=workload, policies=("fifo-binpack", "green"), bound=True
        )
    )


def test_the_modes_left_out_leave_the_optimum_as_it_is(
    report: EvalReport, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario = report.scenario
    args = (scenario.workload, scenario.nodes, report.outcomes, scenario.recorded)
    small = bound.optimum(*args, report.options.energy)
    monkeypatch.setattr(bound, "_efficient_modes", tuple)  # every mode
    every_mode = bound.optimum(*args, report.options.energy)
    assert small.variables < every_mode.variables
    assert small.gco2 == pytest.approx(every_mode.gco2, rel=1e-7)
    for result in report.results:
        assert result.training_gco2 >= small.gco2 * (1 - 1e-9), result.policy


def test_a_mode_a_mix_of_others_beats_is_left_out() -> None:
    """On the power-capping curve (shares 1.0, 0.4, 0.5, 0.6, 0.7, 0.8 of an A100 with
    its host share): 0.4 is slower per kW than 0.5, and 0.8 saves 10 W of 448 for 2 %
    of the speed, less than a mix of 0.7 and the default does."""
    modes = ((1.0, 0.448), (0.66, 0.278), (0.8, 0.318), (0.9, 0.358), (0.95, 0.398), (0.98, 0.438))
    assert bound._efficient_modes(modes) == (
        (0.8, 0.318),
        (0.9, 0.358),
        (0.95, 0.398),
        (1.0, 0.448),
    )
    # A mode no faster than a cheaper one is beaten by it alone.
    assert bound._efficient_modes(((1.0, 0.4), (0.9, 0.45))) == ((1.0, 0.4),)


def test_a_jobs_window_on_a_pool_ends_with_its_run_there(report: EvalReport) -> None:
    """On the whole A100s a job's window ends with its run there (at their slowest power
    mode) from its latest start, or when a policy finished it; only on the slices, seven
    times slower at full power, does it run longer."""
    scenario = report.scenario
    snapshot = Snapshot.build(now=report.options.start_s, nodes=scenario.nodes)
    pools = bound._pools(snapshot, report.options.energy)
    windows = bound._windows(scenario.workload, report.outcomes)
    specs = {spec.id: spec for spec in scenario.workload.training}
    finished = {
        job_id: max(outcome.jobs[job_id].finish_s or 0.0 for outcome in report.outcomes)
        for job_id in specs
    }
    slices = [p for p in pools if "MIG" in snapshot.nodes.model_at(p.column, p.representative)]
    wholes = [p for p in pools if p not in slices]
    assert slices
    assert wholes
    for job_id, latest_start_s in (("now", 0.0), ("later", 600.0 + 14400.0)):
        spec, window = specs[job_id], windows[job_id]
        run_from = report.options.start_s + latest_start_s
        for pool in wholes:
            slowest = min(speed for speed, _ in pool.modes)
            assert window.end_s(spec, pool) == pytest.approx(
                max(finished[job_id], run_from + spec.duration_s / slowest)
            )
        [sliced] = slices
        slowest = min(speed for speed, _ in sliced.modes)
        # A slice runs at its default power only: no policy caps one (NVML's limit is
        # the whole GPU's), so the optimum offers it no capped mode either.
        assert slowest == pytest.approx(1 / 7)
        assert window.end_s(spec, sliced) == pytest.approx(
            max(finished[job_id], run_from + spec.duration_s / slowest)
        )
        assert window.end_s(spec, sliced) > max(window.end_s(spec, p) for p in wholes)
