"""The deadline rescue in the evaluation's simulation: a late job that no capacity
freeing in time would let start takes the room from checkpointing work without a
deadline, which resumes from its checkpoint and still finishes."""

from __future__ import annotations

from datetime import date
from pathlib import Path

from cloud.eval.fleet import load_fleet_nodes
from cloud.eval.metrics import recorded_signals
from cloud.eval.runner import EvalOptions, Scenario, run_eval
from cloud.eval.workload import TrainingSpec, Workload
from cloud.signals.trace import TraceProvider

HOUR = 3600.0
FLEET = """
seed = 1
[[group]]
name = "h100"
profile = "h100-8x"
count = 1
site = "cloud"
zone = "DE"
region = "europe-west3"
"""


def test_a_late_job_meets_its_deadline_under_green_and_the_victim_still_finishes(
    tmp_path: Path,
) -> None:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(FLEET)
    long_run = TrainingSpec(
        id="long", tenant="lab", submit_offset_s=0.0, duration_s=20 * HOUR, workers=1,
        gpus_per_worker=8, checkpoint_interval_s=1800.0,
    )  # fmt: skip
    late = TrainingSpec(
        id="late", tenant="lab", submit_offset_s=2 * HOUR, duration_s=HOUR, workers=1,
        gpus_per_worker=8, deadline_offset_s=4 * HOUR,
    )  # fmt: skip
    provider = TraceProvider(None)
    scenario = Scenario(
        tuple(load_fleet_nodes(fleet)),
        Workload(training=(long_run, late)),
        provider,
        recorded_signals(provider, ("DE",)),
    )
    options = EvalOptions(
        start=date(2023, 6, 5), days=2.0, policies=("fifo-binpack", "green"), fleet=fleet
    )
    report = run_eval(options, scenario=scenario)
    baseline, green = report.outcomes
    # Without the rescue the only node is busy for 18 more hours: the late job misses.
    assert baseline.jobs["late"].missed
    assert baseline.jobs["long"].preemptions == {}
    # Green stops the checkpointing run, places the late job in time, and resumes it.
    rescued, victim = green.jobs["late"], green.jobs["long"]
    assert not rescued.missed
    assert rescued.finish_s is not None
    assert rescued.deadline_s is not None
    assert rescued.finish_s <= rescued.deadline_s
    assert victim.preemptions == {"deadline": 1}
    assert victim.finish_s is not None
    by_policy = {result.policy: result for result in report.results}
    assert by_policy["green"].deadline_misses == 0
    assert by_policy["fifo-binpack"].deadline_misses == 1
