"""Migration and checkpoints in the simulation: a job that started on a dirty node
moves when clean capacity frees, a stopped job resumes from its newest checkpoint,
and no work is lost or invented on the way."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest

from cloud.eval.runner import EvalOptions, EvalReport, run_eval
from cloud.eval.simulation import SimOutcome
from shared.accelerators import capped_speed

from .scenarios import SMALL_FLEET

RESTART_S = 300.0  # SimConfig's default

# Los Angeles (8 H100) and Toronto (4 A100) are busy for a while; the long job can
# only start on the Frankfurt V100s, and should move to Los Angeles once it frees.
CROWDED = """
[[training]]
id = "la-busy"
tenant = "a"
submit_offset_s = 0
duration_s = 7200
gpus_per_worker = 8

[[training]]
id = "toronto-busy"
tenant = "a"
submit_offset_s = 0
duration_s = 36000
gpus_per_worker = 4

[[training]]
id = "long"
tenant = "b"
submit_offset_s = 60
duration_s = 72000
gpus_per_worker = 8
checkpoint_interval_s = 1800
"""

# Every GPU busy with preemptible p2 work that checkpoints, then a p0 job arrives.
PREEMPTED = """
[[training]]
id = "p2-la"
tenant = "a"
priority = "p2"
submit_offset_s = 0
duration_s = 72000
gpus_per_worker = 8
checkpoint_interval_s = 1800

[[training]]
id = "p2-fra"
tenant = "a"
priority = "p2"
submit_offset_s = 0
duration_s = 36000
gpus_per_worker = 8
checkpoint_interval_s = 1800

[[training]]
id = "p2-toronto"
tenant = "a"
priority = "p2"
submit_offset_s = 0
duration_s = 36000
gpus_per_worker = 4
checkpoint_interval_s = 1800

[[training]]
id = "urgent"
tenant = "b"
priority = "p0"
submit_offset_s = 7300
duration_s = 3600
gpus_per_worker = 4
"""


def run(
    tmp_path: Path,
    workload: str,
    *policies: str,
    migration: bool = True,
    room_making: bool = True,
) -> EvalReport:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(SMALL_FLEET, encoding="utf-8")
    jobs = tmp_path / "workload.toml"
    jobs.write_text(workload, encoding="utf-8")
    return run_eval(
        EvalOptions(
            start=date(2023, 6, 1),
            days=1.0,
            policies=policies,
            fleet=fleet,
            workload=jobs,
            migration=migration,
            room_making=room_making,
        )
    )


def reference_work_s(outcome: SimOutcome, work_id: str) -> float:
    """Reference seconds of work the job's runs were given (time × slowest speed, slower
    where its GPUs were held to a power limit)."""
    pools = {
        node.node_id: next(p for p in node.pools if p.kind == "gpu")
        for node in outcome.nodes
        if any(p.kind == "gpu" for p in node.pools)
    }
    return sum(
        (usage.end_s - usage.start_s)
        * capped_speed(
            pools[usage.node_id].relative_speed,
            usage.power_limit_w,
            pools[usage.node_id].max_power_w,
        )
        for usage in outcome.usages
        if usage.work_id == work_id
    )


def nodes_used(outcome: SimOutcome, work_id: str) -> list[str]:
    usages = sorted((u for u in outcome.usages if u.work_id == work_id), key=lambda u: u.start_s)
    return [u.node_id for u in usages]


def test_a_long_job_moves_from_the_dirty_zone_when_clean_capacity_frees(tmp_path: Path) -> None:
    report = run(tmp_path, CROWDED, "fifo-binpack", "green")
    baseline, green = report.outcomes
    assert report.results[0].migrations == 0  # carbon-agnostic: never moves
    assert report.results[1].migrations == 1
    assert nodes_used(baseline, "long") == ["v100-fra-1"]
    assert nodes_used(green, "long") == ["v100-fra-1", "h100-la-1"]
    record = green.jobs["long"]
    assert record.migrations == 1
    assert record.finish_s is not None
    # Nothing lost or invented: the whole job, plus one restart, plus at most the
    # progress since its newest checkpoint on the V100s (speed 0.45).
    work = reference_work_s(green, "long")
    assert 72000 + RESTART_S <= work <= 72000 + RESTART_S + 1800 * 0.45 + 1e-6
    # It finishes sooner on the H100s, and emits less.
    baseline_finish = baseline.jobs["long"].finish_s
    assert baseline_finish is not None
    assert record.finish_s < baseline_finish
    assert report.results[1].gco2 < report.results[0].gco2


def test_the_ablation_switch_turns_migration_off(tmp_path: Path) -> None:
    report = run(tmp_path, CROWDED, "green", migration=False)
    assert report.results[0].migrations == 0
    assert nodes_used(report.outcomes[0], "long") == ["v100-fra-1"]


def test_a_preempted_job_resumes_from_its_newest_checkpoint(tmp_path: Path) -> None:
    report = run(tmp_path, PREEMPTED, "fifo-binpack")
    [outcome] = report.outcomes
    assert all(record.finish_s is not None for record in outcome.jobs.values())
    assert outcome.jobs["urgent"].first_start_s == pytest.approx(outcome.config.start_s + 7300)
    victims = [
        work_id
        for work_id in ("p2-la", "p2-fra", "p2-toronto")
        if len(nodes_used(outcome, work_id)) > 1
    ]
    assert victims, "the p0 job should have preempted a p2 job"
    for work_id in victims:
        duration = outcome.jobs[work_id].spec.duration_s
        work = reference_work_s(outcome, work_id)
        # Not started over: at most the progress since the last checkpoint is redone.
        assert duration + RESTART_S <= work <= duration + RESTART_S + 1800 * 2.5 + 1e-6


# Toronto is full; each 8-GPU server holds one long 4-GPU job (the one in Los Angeles
# checkpoints, the one in Frankfurt does not) once the Los Angeles filler ends: an
# 8-GPU job then has 8 GPUs free in the fleet and no node with room for its worker.
FRAGMENTED = """
[[training]]
id = "toronto-busy"
tenant = "a"
submit_offset_s = 0
duration_s = 72000
gpus_per_worker = 4

[[training]]
id = "small-la"
tenant = "a"
submit_offset_s = 10
duration_s = 72000
gpus_per_worker = 4
checkpoint_interval_s = 1800

[[training]]
id = "la-filler"
tenant = "a"
submit_offset_s = 20
duration_s = 8000
gpus_per_worker = 4

[[training]]
id = "small-fra"
tenant = "a"
submit_offset_s = 30
duration_s = 72000
gpus_per_worker = 4

[[training]]
id = "big"
tenant = "b"
submit_offset_s = 4000
duration_s = 7200
gpus_per_worker = 8
"""


def test_a_waiting_8_gpu_job_gets_a_node_when_a_small_job_moves(tmp_path: Path) -> None:
    made = run(tmp_path, FRAGMENTED, "green")
    off = run(tmp_path, FRAGMENTED, "green", room_making=False)
    [with_room], [without] = made.outcomes, off.outcomes
    start = with_room.config.start_s
    where = {job: nodes_used(with_room, job)[0] for job in ("small-la", "small-fra")}
    assert where == {"small-la": "h100-la-1", "small-fra": "v100-fra-1"}
    # Without room making the 8-GPU job waits for one of the long jobs to end.
    waited = without.jobs["big"].first_start_s
    assert waited is not None
    assert waited - start >= 8 * 3600
    # With it, the checkpointing job moves beside the other one within the hour,
    # the big job starts on the node it left, and nothing else moves.
    big = with_room.jobs["big"]
    assert big.first_start_s is not None
    assert big.first_start_s - start <= 2 * 3600 + 2  # the next pass after a minute waiting
    assert nodes_used(with_room, "big") == ["h100-la-1"]
    # Once the big job is done, the migrator takes the moved job back to the cleaner
    # H100s: two moves, each losing at most the progress since its newest checkpoint.
    assert nodes_used(with_room, "small-la") == ["h100-la-1", "v100-fra-1", "h100-la-1"]
    assert with_room.jobs["small-la"].migrations == 2
    assert with_room.jobs["small-fra"].migrations == 0
    work = reference_work_s(with_room, "small-la")
    assert 72000 + 2 * RESTART_S <= work <= 72000 + 2 * (RESTART_S + 1800 * 2.5) + 1e-6
