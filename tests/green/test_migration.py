"""JobMove: running, checkpointing training moves to cleaner capacity when it frees,
only when the move pays for the work it loses, and never past a deadline."""

from __future__ import annotations

import dataclasses

import pytest

from cloud.green.energy import EnergyModel
from cloud.green.latency import default_latency_estimator
from cloud.green.migration import Migrator, RunningJob
from cloud.green.policies import GreenInputs, build_policy
from cloud.scheduler import Node, Policy, Snapshot, TrainingJob
from cloud.signals.grid import ZoneSeries

from .builders import HOUR, T0, flat, gpu_server, grid, running_on, series

NOW = T0 + 2 * HOUR


def training(
    work_id: str = "job",
    *,
    duration_h: float = 10.0,
    checkpoint_s: float | None = 1800.0,
    deadline: float | None = None,
    preemptible: bool = True,
    gpus: int = 4,
) -> TrainingJob:
    return TrainingJob(
        work_id=work_id,
        tenant="t",
        submitted_at=T0,
        accelerators_per_worker=gpus,
        duration_s=duration_h * HOUR,
        checkpoint_interval_s=checkpoint_s,
        deadline=deadline,
        preemptible=preemptible,
    )


def cluster(
    jobs: list[tuple[str, TrainingJob]], nodes: list[Node] | None = None
) -> tuple[Snapshot, list[RunningJob]]:
    nodes = nodes or [gpu_server("dirty", "DIRTY"), gpu_server("clean", "CLEAN")]
    allocations = [running_on(node_id, job) for node_id, job in jobs]
    snap = Snapshot.build(now=NOW, nodes=nodes, allocations=allocations)
    running = [RunningJob(job=job, started_s=T0, speed=1.0) for _, job in jobs]
    return snap, running


def migrator(*zones: ZoneSeries, **options: float) -> Migrator:
    return Migrator(grid(*zones, now=NOW), EnergyModel(), **options)  # type: ignore[arg-type]


def green(*zones: ZoneSeries, name: str = "green") -> Policy:
    """The policy the trial placement uses: where it would put the job now."""
    return build_policy(name, GreenInputs(signals=grid(*zones, now=NOW), latency=LATENCY))


LATENCY = default_latency_estimator()


ZONES = (flat("DIRTY", 600.0), flat("CLEAN", 60.0))


def test_progress_is_kept_up_to_the_newest_checkpoint() -> None:
    run = RunningJob(job=training(duration_h=10, checkpoint_s=1800), started_s=T0, speed=2.0)
    at = T0 + 5000  # two checkpoints (at 1800 s and 3600 s of the run), at speed 2
    assert run.remaining_s(at) == pytest.approx(10 * HOUR - 10_000)
    assert run.saved_s(at) == pytest.approx(2 * 1800 * 2.0)
    assert run.resume_remaining_s(at) == pytest.approx(10 * HOUR - 7200)
    # A resumed run spends its first restart_s reloading: that is not progress.
    resumed = RunningJob(job=training(duration_h=1), started_s=T0, speed=1.0, restart_s=300)
    assert resumed.saved_s(T0 + 1800) == pytest.approx(1500)
    assert resumed.resume_remaining_s(T0 + 1800) == pytest.approx(HOUR - 300 - 1500)
    # Without checkpoints nothing is kept.
    plain = RunningJob(job=training(checkpoint_s=None), started_s=T0, speed=1.0)
    assert plain.saved_s(T0 + 5 * HOUR) == 0.0


def test_a_job_on_a_dirty_node_moves_to_free_clean_capacity() -> None:
    job = training()
    snap, running = cluster([("dirty", job)])
    [move] = migrator(*ZONES).propose(snap, running, green(*ZONES))
    assert move.work_id == "job"
    assert move.stop == ("job/0",)
    assert move.from_nodes == ("dirty",)
    assert [p.node_id for p in move.placements] == ["clean"]
    assert move.placements[0].start_at == NOW
    # It resumes from its newest checkpoint (2 h in: 4 of them) plus the restart.
    assert move.resumed.duration_s == pytest.approx(8 * HOUR + 300)
    assert move.resumed.max_delay_s is None
    assert move.expected_move < 0.2 * move.expected_stay
    assert move.saving_fraction > 0.8
    assert "Moved from dirty to clean" in move.explain()
    assert "less CO2" in move.explain()


def test_jobs_that_cannot_resume_or_be_stopped_stay() -> None:
    for job in (training(checkpoint_s=None), training(preemptible=False)):
        snap, running = cluster([("dirty", job)])
        assert migrator(*ZONES).propose(snap, running, green(*ZONES)) == []


def test_a_small_saving_is_not_worth_a_move() -> None:
    snap, running = cluster([("dirty", training())])
    close = (flat("DIRTY", 300.0), flat("CLEAN", 270.0))  # 10 % cleaner, below 20 %
    assert migrator(*close).propose(snap, running, green(*close)) == []
    assert len(migrator(*close, min_saving=0.05).propose(snap, running, green(*close))) == 1


def test_work_lost_since_the_last_checkpoint_counts_against_a_move() -> None:
    # 1.9 h into a 2 h job that checkpoints every 2 h: moving would redo all of it.
    job = training(duration_h=2.0, checkpoint_s=2 * HOUR)
    snap, _ = cluster([("dirty", job)])
    late = [RunningJob(job=job, started_s=NOW - 1.9 * HOUR, speed=1.0)]
    assert migrator(*ZONES).propose(snap, late, green(*ZONES)) == []


def test_a_move_never_breaks_the_deadline() -> None:
    # The clean node is slow: the rest of the job would end after the deadline there.
    nodes = [gpu_server("dirty", "DIRTY"), gpu_server("clean", "CLEAN", speed=0.5)]
    job = training(deadline=NOW + 12 * HOUR)
    snap, running = cluster([("dirty", job)], nodes)
    assert migrator(*ZONES).propose(snap, running, green(*ZONES)) == []
    relaxed = dataclasses.replace(job, deadline=NOW + 20 * HOUR)
    snap, running = cluster([("dirty", relaxed)], nodes)
    [move] = migrator(*ZONES).propose(snap, running, green(*ZONES))
    assert move.placements[0].expected_end is not None
    assert move.placements[0].expected_end <= NOW + 20 * HOUR


def test_young_runs_stay_put() -> None:
    job = training()
    snap, _ = cluster([("dirty", job)])
    young = [RunningJob(job=job, started_s=NOW - 300, speed=1.0)]
    assert migrator(*ZONES).propose(snap, young, green(*ZONES)) == []
    assert len(migrator(*ZONES, cooldown_s=0).propose(snap, young, green(*ZONES))) == 1


def test_two_jobs_never_claim_the_same_free_accelerators() -> None:
    nodes = [
        gpu_server("dirty-a", "DIRTY"),
        gpu_server("dirty-b", "DIRTIER"),
        gpu_server("clean", "CLEAN"),
    ]
    a, b = training("a"), training("b")
    snap, running = cluster([("dirty-a", a), ("dirty-b", b)], nodes)
    zones = (*ZONES, flat("DIRTIER", 700.0))
    moves = migrator(*zones).propose(snap, running, green(*zones))
    # One free node: the dirtiest job gets it.
    assert [(m.work_id, m.placements[0].node_id) for m in moves] == [("b", "clean")]


def test_at_most_max_per_pass_jobs_move() -> None:
    nodes = [gpu_server(f"dirty-{i}", "DIRTY") for i in range(3)]
    nodes += [gpu_server(f"clean-{i}", "CLEAN") for i in range(3)]
    jobs = [(f"dirty-{i}", training(f"j{i}")) for i in range(3)]
    snap, running = cluster(jobs, nodes)
    moves = migrator(*ZONES, max_per_pass=2).propose(snap, running, green(*ZONES))
    assert len(moves) == 2
    assert len({m.placements[0].node_id for m in moves}) == 2


def test_the_forecast_decides_not_the_current_hour() -> None:
    # The dirty zone turns clean after this hour: over the rest of the run (1 h at 600,
    # 7 h at 10: 84 g/kWh on average) the "clean" zone at 80 is no better.
    zones = (series("DIRTY", [600.0] * 3 + [10.0] * 69), flat("CLEAN", 80.0))
    snap, running = cluster([("dirty", training())])
    assert migrator(*zones).propose(snap, running, green(*zones)) == []


def test_without_a_real_signal_on_both_sides_nothing_moves() -> None:
    # Real zone codes: placement would score them on the static 2022 table (ZA dirty,
    # CA-ON clean), but stopping running work on a stand-in is not worth the risk.
    nodes = [gpu_server("dirty", "ZA"), gpu_server("clean", "CA-ON")]
    snap, running = cluster([("dirty", training())], nodes)
    assert Migrator(grid(now=NOW)).propose(snap, running, green()) == []
    # Only the job's own zone unknown: it would get the dirtiest known value (700).
    known = (flat("CA-ON", 300.0), flat("DE", 700.0))
    assert migrator(*known).propose(snap, running, green(*known)) == []
    # Only the target unknown.
    target_unknown = (flat("ZA", 700.0),)
    assert migrator(*target_unknown).propose(snap, running, green(*target_unknown)) == []
    # Both known: it moves.
    both = (flat("ZA", 700.0), flat("CA-ON", 50.0))
    assert len(migrator(*both).propose(snap, running, green(*both))) == 1


def test_the_cost_objective_moves_to_cheaper_power() -> None:
    zones = (flat("DIRTY", 100.0, price=200.0), flat("CLEAN", 100.0, price=20.0))
    snap, running = cluster([("dirty", training())])
    cost = migrator(*zones, objective="price")  # type: ignore[arg-type]
    [move] = cost.propose(snap, running, green(*zones, name="cost"))
    assert move.quantity == "cost"
    assert "less cost" in move.explain()


def test_bad_settings_are_refused() -> None:
    signals = grid(now=NOW)
    for bad in (
        {"min_saving": 1.0},
        {"min_saving": -0.1},
        {"restart_s": -1.0},
        {"max_per_pass": -1},
        {"max_trials_per_pass": -1},
        {"cooldown_s": float("nan")},
    ):
        with pytest.raises(ValueError, match=next(iter(bad)).split("_")[0]):
            Migrator(signals, **bad)
