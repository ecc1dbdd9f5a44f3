"""One clock for a replayed trace: the grid the loop plans by is told on the wall
clock, so a forecast dip within a flexible job's delay lies ahead of the loop's
"now" and temporal shifting defers into it (issue 30: it never fired live while
the grid said 2023 and the queue 2026)."""

from __future__ import annotations

import pytest

from cloud.green.latency import ServingLatency
from cloud.green.policies import GreenInputs, build_policy
from cloud.scheduler import Plan, TrainingJob, schedule
from cloud.signals.factory import build_signal_service
from cloud.signals.grid import HOUR_S, GridSignals
from cloud.signals.replay_time import replay_offset_s, retold
from cloud.signals.units import same_instant_in_year
from shared.settings import SchedulingSettings, SignalSettings
from tests.green.builders import gpu_server, snapshot

from .support import FakeClock, epoch

# Ontario on 16 June: at 18:00 UTC the forecast for the night ahead is about half
# as dirty (nuclear and hydro carry the grid once demand falls).
WALL = epoch(2026, 6, 16, 18)
ZONE = "CA-ON"


def flexible_job() -> TrainingJob:
    return TrainingJob(
        work_id="flex",
        tenant="t",
        submitted_at=WALL,
        duration_s=HOUR_S,
        max_delay_s=24 * HOUR_S,
    )


# Temporal shifting is off unless an operator sets a minimum saving; this one is set.
SHIFTING_MIN_SAVING = 0.5


def plan_as_the_loop_does(grid: GridSignals) -> Plan:
    """The loop's pass: its settings' policy and minimum saving, its clock's now."""
    settings = SchedulingSettings(shifting_min_saving=SHIFTING_MIN_SAVING)
    green = GreenInputs(
        signals=grid, latency=ServingLatency({}), min_saving=settings.shifting_min_saving
    )
    return schedule(
        snapshot([gpu_server("n", ZONE)], [flexible_job()], now=WALL),
        build_policy(settings.policy, green),
    )


async def test_the_default_chain_tells_the_replayed_trace_on_the_wall_clock() -> None:
    service = build_signal_service(SignalSettings(), wall_clock=FakeClock(WALL))
    grid = await service.snapshot([ZONE, "ZA"])
    assert grid.now_s == WALL
    # The values are the recorded ones: the wall clock's hour reads the trace's.
    traced = await build_signal_service(
        SignalSettings(), clock=FakeClock(same_instant_in_year(WALL, 2023))
    ).snapshot([ZONE, "ZA"])
    assert traced.now_s == epoch(2023, 6, 16, 18)
    for zone in (ZONE, "ZA"):
        assert grid.zones[zone].carbon_at(WALL) == traced.zones[zone].carbon_at(traced.now_s)
        assert grid.zones[zone].start_s - traced.zones[zone].start_s == WALL - traced.now_s


async def test_a_flexible_job_on_the_replayed_trace_is_deferred_to_the_named_hour() -> None:
    grid = await build_signal_service(SignalSettings(), wall_clock=FakeClock(WALL)).snapshot([ZONE])
    plan = plan_as_the_loop_does(grid)
    assert not plan.placements
    (pending,) = plan.pending
    assert pending.code == "deferred"
    deferral = pending.deferral
    assert deferral is not None
    assert deferral.saving_fraction >= SHIFTING_MIN_SAVING
    assert deferral.start_at == WALL + 13 * HOUR_S
    assert pending.message.startswith(
        f"Deferred to 2026-06-17 07:00 UTC for {deferral.saving_fraction:.0%} less CO2"
    )
    assert pending.retry_at == deferral.start_at


async def test_a_grid_in_the_traces_year_never_defers_on_the_wall_clock() -> None:
    # The bug this module fixes: the same grid, told in 2023, next to a 2026 queue.
    traced = await build_signal_service(
        SignalSettings(), clock=FakeClock(same_instant_in_year(WALL, 2023))
    ).snapshot([ZONE])
    plan = plan_as_the_loop_does(traced)
    assert [p.work_id for p in plan.placements] == ["flex"]


def test_the_offset_is_whole_hours_and_zero_leaves_the_grid_alone() -> None:
    assert replay_offset_s(WALL + 0.004, epoch(2023, 6, 16, 18)) == WALL - epoch(2023, 6, 16, 18)
    grid = GridSignals(now_s=WALL, zones={})
    assert retold(grid, 0.0) is grid
    assert retold(grid, HOUR_S).now_s == pytest.approx(WALL + HOUR_S)


async def test_a_replayed_readings_age_is_read_on_the_same_clock_as_its_grid() -> None:
    # /metrics reports now - newest reading as greenfed_grid_signal_age_seconds, and
    # alerts past 3 h: a reading told in 2023 against a grid told in 2026 read 3 years.
    service = build_signal_service(SignalSettings(), wall_clock=FakeClock(WALL))
    grid = await service.snapshot([ZONE])
    newest = service.newest_reading_s(ZONE)
    assert newest is not None
    assert 0.0 <= grid.now_s - newest < 2 * HOUR_S
