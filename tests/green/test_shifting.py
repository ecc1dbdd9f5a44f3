"""Temporal shifting: the cleanest feasible window, the latest safe start, the
forecast horizon, composition with spatial choice, and never a missed deadline."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloud.green.energy import EnergyModel
from cloud.green.shifting import WindowShifter, best_window, candidate_starts
from cloud.scheduler import Policy, TrainingJob, schedule

from .builders import HOUR, T0, flat, gpu_server, grid, series, snapshot

# Dirty for 6 hours, then clean for 4, then dirty again.
VALLEY = [500.0] * 6 + [50.0] * 4 + [500.0] * 62


def job(
    duration_h: float = 2.0, *, deadline: float | None = None, max_delay_s: float | None = None
) -> TrainingJob:
    return TrainingJob(
        work_id="flex",
        tenant="t",
        submitted_at=T0,
        duration_s=duration_h * HOUR,
        deadline=deadline,
        max_delay_s=max_delay_s,
    )


def shifter_policy(*zones: object, margin_s: float = 0.0, min_saving: float = 0.1) -> Policy:
    signals = grid(*zones)  # type: ignore[arg-type]
    return Policy(
        start_advisor=WindowShifter(
            signals, EnergyModel(), safety_margin_s=margin_s, min_saving=min_saving
        )
    )


def test_candidate_starts_are_now_and_the_hours_until_the_latest_start() -> None:
    starts = candidate_starts(T0 + 600, HOUR, T0 + 3 * HOUR, T0 + 100 * HOUR)
    assert (starts - T0).tolist() == [600, HOUR, 2 * HOUR, 3 * HOUR]


def test_the_horizon_limits_the_window() -> None:
    # The run must end within the series (history plus forecast horizon).
    starts = candidate_starts(T0, 2 * HOUR, T0 + 50 * HOUR, T0 + 5 * HOUR)
    assert (starts - T0).max() == 3 * HOUR
    # A job longer than the horizon cannot be shifted at all.
    assert candidate_starts(T0, 10 * HOUR, T0 + 50 * HOUR, T0 + 5 * HOUR).tolist() == [T0]


def test_best_window_is_the_rolling_minimum_of_the_mean() -> None:
    window = best_window(series("X", VALLEY), T0, 2 * HOUR, T0 + 48 * HOUR)
    assert window.start_s == T0 + 6 * HOUR
    assert window.mean == 50.0
    assert window.mean_now == 500.0
    # Not allowed to wait that long: the cleanest window that still finishes in time.
    late = best_window(series("X", VALLEY), T0, 2 * HOUR, T0 + 5 * HOUR)
    assert late.start_s == T0 + 5 * HOUR
    assert late.mean == pytest.approx(275.0)


def test_a_flexible_job_is_deferred_to_the_cleanest_window_with_an_explanation() -> None:
    flexible = job(deadline=T0 + 24 * HOUR)
    plan = schedule(
        snapshot([gpu_server("n", "X")], [flexible]), shifter_policy(series("X", VALLEY))
    )
    assert not plan.placements
    pending = plan.pending[0]
    assert pending.code == "deferred"
    assert pending.retry_at == T0 + 6 * HOUR
    assert pending.deferral is not None
    assert pending.deferral.saving_fraction == pytest.approx(0.9)
    assert pending.message.startswith("Deferred to 2023-06-15 06:00 UTC for 90% less CO2")
    assert "latest safe start 2023-06-15 22:00 UTC" in pending.message
    assert plan.deferrals == (pending,)


def test_with_migration_a_job_that_checkpoints_starts_now_and_others_still_wait() -> None:
    # A migrating policy moves a checkpointing job once cleaner capacity frees, so it
    # does not hold it back; a job that cannot resume still waits for the valley.
    signals = grid(series("X", VALLEY))
    migrating = Policy(start_advisor=WindowShifter(signals, EnergyModel(), migrating=True))
    movable = dataclasses.replace(
        job(deadline=T0 + 24 * HOUR), work_id="movable", checkpoint_interval_s=1800.0
    )
    plan = schedule(
        snapshot(
            [gpu_server("a", "X"), gpu_server("b", "X")], [movable, job(deadline=T0 + 24 * HOUR)]
        ),
        migrating,
    )
    assert [p.work_id for p in plan.placements] == ["movable"]
    assert [(p.work_id, p.code) for p in plan.pending] == [("flex", "deferred")]
    # Without migration the same job waits like any other.
    alone = Policy(start_advisor=WindowShifter(signals, EnergyModel()))
    assert schedule(snapshot([gpu_server("a", "X")], [movable]), alone).pending[0].code == (
        "deferred"
    )


def test_a_max_delay_bounds_the_window() -> None:
    plan = schedule(
        snapshot([gpu_server("n", "X")], [job(max_delay_s=7 * HOUR)]),
        shifter_policy(series("X", VALLEY)),
    )
    deferral = plan.pending[0].deferral
    assert deferral is not None
    assert deferral.start_at == T0 + 6 * HOUR
    assert deferral.latest_start == T0 + 7 * HOUR
    # Too short a delay to reach the valley: start now.
    soon = schedule(
        snapshot([gpu_server("n", "X")], [job(max_delay_s=3 * HOUR)]),
        shifter_policy(series("X", VALLEY)),
    )
    assert soon.placements


def test_jobs_without_flexibility_or_small_savings_start_now() -> None:
    nodes = [gpu_server("n", "X")]
    assert schedule(snapshot(nodes, [job()]), shifter_policy(series("X", VALLEY))).placements
    almost_flat = series("X", [100.0] * 6 + [95.0] * 66)
    flexible = job(deadline=T0 + 24 * HOUR)
    assert schedule(snapshot(nodes, [flexible]), shifter_policy(almost_flat)).placements


def test_a_price_of_zero_now_is_no_reason_to_wait_for_a_negative_one() -> None:
    # Free power now, paid-for-taking later (negative prices are real): a saving is no
    # share of nothing, so the job starts (it divided by zero before).
    prices = series("X", [100.0] * 72, price=[0.0] * 6 + [-40.0] * 4 + [0.0] * 62)
    flexible = job(deadline=T0 + 24 * HOUR)
    shifter = WindowShifter(grid(prices), EnergyModel(), objective="price", min_saving=0.1)
    plan = schedule(snapshot([gpu_server("n", "X")], [flexible]), Policy(start_advisor=shifter))
    assert plan.placements
    assert not plan.deferrals


def test_at_the_latest_safe_start_it_starts_regardless() -> None:
    # The clean window comes after the latest start (deadline 8 h, 2 h run, 1 h margin).
    flexible = job(deadline=T0 + 8 * HOUR)
    dirty_then_clean = series("X", [500.0] * 10 + [10.0] * 62)
    nodes = [gpu_server("n", "X")]
    policy = shifter_policy(dirty_then_clean, margin_s=HOUR)
    early = schedule(snapshot(nodes, [flexible], now=T0), policy)
    assert early.placements  # nothing cleaner before the latest start: go now
    valley = series("X", [500.0] * 4 + [10.0] * 68)
    policy = shifter_policy(valley, margin_s=HOUR)
    assert schedule(snapshot(nodes, [flexible], now=T0), policy).pending[0].code == "deferred"
    at_latest = schedule(snapshot(nodes, [flexible], now=T0 + 5 * HOUR), policy)
    assert at_latest.placements


def test_spatial_and_temporal_shifting_compose() -> None:
    flexible = job(deadline=T0 + 24 * HOUR)
    nodes = [gpu_server("a", "A"), gpu_server("b", "B")]
    # A is clean now; B is cleaner later, but not by enough over A now: start in A.
    now_in_a = schedule(
        snapshot(nodes, [flexible]),
        Policy(
            start_advisor=WindowShifter(grid(flat("A", 52.0), series("B", VALLEY))),
            score_terms=(),
        ),
    )
    assert now_in_a.placements
    # A is dirty all the time and B has the valley: wait for B's window.
    later_in_b = schedule(
        snapshot(nodes, [flexible]),
        Policy(start_advisor=WindowShifter(grid(flat("A", 400.0), series("B", VALLEY)))),
    )
    deferral = later_in_b.pending[0].deferral
    assert deferral is not None
    assert (deferral.zone, deferral.start_at) == ("B", T0 + 6 * HOUR)


def test_a_full_zone_is_not_waited_for() -> None:
    # The valley's zone is busy with long-running work: no deferral to it.
    from cloud.scheduler import Allocation

    nodes = [gpu_server("a", "A"), gpu_server("b", "B")]
    busy = Allocation(
        allocation_id="x/0",
        work_id="x",
        work_kind="training",
        tenant="t",
        priority="p1",
        preemptible=False,
        node_id="b",
        accelerator_kind="gpu",
        accelerators=4,
        started_at=T0,
        expected_end=T0 + 40 * HOUR,
    )
    from cloud.scheduler import Snapshot

    snap = Snapshot.build(
        now=T0, nodes=nodes, allocations=[busy], queue=[job(deadline=T0 + 24 * HOUR)]
    )
    plan = schedule(
        snap, Policy(start_advisor=WindowShifter(grid(flat("A", 400.0), series("B", VALLEY))))
    )
    assert plan.placements
    assert plan.placements[0].node_id == "a"


def test_the_core_ignores_a_deferral_past_the_latest_start() -> None:
    from cloud.scheduler import Deferral

    class Reckless:
        def advise(self, *_: object) -> Deferral:
            return Deferral(
                start_at=T0 + 30 * HOUR,
                latest_start=T0 + 30 * HOUR,
                zone="X",
                saving_fraction=0.5,
                expected_now=2.0,
                expected_then=1.0,
            )

    plan = schedule(
        snapshot([gpu_server("n", "X")], [job(deadline=T0 + 24 * HOUR)]),
        Policy(start_advisor=Reckless()),
    )
    assert plan.placements


@settings(max_examples=60, deadline=None)
@given(
    carbon=st.lists(st.floats(min_value=0.0, max_value=900.0), min_size=72, max_size=72),
    duration_h=st.floats(min_value=0.1, max_value=12.0),
    slack_h=st.floats(min_value=0.0, max_value=36.0),
    speed=st.sampled_from([0.45, 1.0, 2.5]),
    use_max_delay=st.booleans(),
)
def test_shifting_never_misses_a_deadline(
    carbon: list[float], duration_h: float, slack_h: float, speed: float, use_max_delay: bool
) -> None:
    """Drive the real core pass after pass, jumping to each retry time: the job always
    starts in time to meet its deadline (or maximum delay) on the node it gets."""
    runtime = duration_h * HOUR / speed
    if use_max_delay:
        flexible = job(duration_h, max_delay_s=slack_h * HOUR)
        must_start_by = T0 + slack_h * HOUR
    else:
        flexible = job(duration_h, deadline=T0 + runtime + slack_h * HOUR)
        must_start_by = T0 + slack_h * HOUR
    nodes = [gpu_server("n", "X", speed=speed)]
    policy = Policy(start_advisor=WindowShifter(grid(series("X", carbon))))
    now = T0
    for _ in range(200):
        plan = schedule(snapshot(nodes, [flexible], now=now), policy)
        if plan.placements:
            break
        pending = plan.pending[0]
        assert pending.code == "deferred"
        assert pending.retry_at is not None
        assert pending.retry_at <= must_start_by + 1e-6
        now = pending.retry_at
    else:
        pytest.fail("never started")
    assert now <= must_start_by + 1e-6
    assert math.isfinite(now)
    assert np.isclose(plan.placements[0].start_at, now)
