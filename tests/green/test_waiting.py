"""Waiting for cleaner capacity (cloud/green/waiting.py): a job held a little while
for a clean node that is full now and frees soon, never longer than its patience."""

from __future__ import annotations

import dataclasses

import pytest

from cloud.green.energy import EnergyModel
from cloud.green.policies import GreenInputs, build_policy
from cloud.green.waiting import CapacityWaiter
from cloud.scheduler import Policy, Snapshot, TrainingJob, schedule

from .builders import HOUR, T0, flat, gpu_server, grid, running_on

CLEAN, DIRTY = flat("CLEAN", 50.0), flat("DIRTY", 500.0)


def job(work_id: str = "j", *, gpus: int = 4, duration_h: float = 2.0) -> TrainingJob:
    return TrainingJob(
        work_id=work_id,
        tenant="t",
        submitted_at=T0,
        accelerators_per_worker=gpus,
        duration_s=duration_h * HOUR,
    )


def cluster(ends_in_s: float, queue: list[TrainingJob]) -> Snapshot:
    """A clean node held by a job that ends in `ends_in_s`, and a free dirty one."""
    running = dataclasses.replace(job("running"), duration_s=ends_in_s)
    return Snapshot.build(
        now=T0,
        nodes=[gpu_server("clean", "CLEAN"), gpu_server("dirty", "DIRTY")],
        allocations=[running_on("clean", running)],
        queue=queue,
    )


def waiting(patience_s: float) -> Policy:
    waiter = CapacityWaiter(grid(CLEAN, DIRTY), EnergyModel(), patience_s)
    return Policy(start_advisor=waiter, patience_s=patience_s)


def test_a_job_waits_for_the_clean_node_that_frees_within_its_patience() -> None:
    plan = schedule(cluster(600.0, [job()]), waiting(1800.0))
    assert plan.placements == ()
    (pending,) = plan.pending
    assert pending.code == "deferred"
    assert pending.retry_at == T0 + 600.0  # when the running job ends
    assert pending.deferral is not None
    assert pending.deferral.zone == "CLEAN"
    assert pending.deferral.latest_start == T0 + 1800.0


def test_it_starts_now_where_it_can_when_the_clean_node_frees_too_late() -> None:
    for policy in (waiting(1800.0), Policy(start_advisor=waiting(1800.0).start_advisor)):
        plan = schedule(cluster(3600.0, [job()]), policy)
        assert [p.node_id for p in plan.placements] == ["dirty"]


def test_once_its_patience_is_spent_it_starts_regardless() -> None:
    late = cluster(600.0, [job()])
    later = Snapshot.build(
        now=T0 + 1800.0,
        nodes=[gpu_server("clean", "CLEAN"), gpu_server("dirty", "DIRTY")],
        allocations=late.allocations,
        queue=late.queue,
    )
    # (The running job is past its expected end but still there: the node is not free.)
    assert [p.node_id for p in schedule(later, waiting(1800.0)).placements] == ["dirty"]


def test_two_jobs_do_not_wait_for_the_same_freed_gpus() -> None:
    plan = schedule(cluster(600.0, [job("a"), job("b")]), waiting(1800.0))
    assert {p.code for p in plan.pending} == {"deferred"}
    assert [p.work_id for p in plan.pending] == ["a"]
    assert [(p.work_id, p.node_id) for p in plan.placements] == [("b", "dirty")]


def test_a_small_saving_is_not_worth_a_wait() -> None:
    nearly = flat("DIRTY", 60.0)  # 60 against 50 g/kWh: less than the 30 % a wait needs
    waiter = CapacityWaiter(grid(CLEAN, nearly), EnergyModel(), 1800.0)
    plan = schedule(cluster(600.0, [job()]), Policy(start_advisor=waiter, patience_s=1800.0))
    assert [p.node_id for p in plan.placements] == ["dirty"]


def test_with_negative_prices_a_small_saving_is_still_not_worth_a_wait() -> None:
    def held(clean_price: float, dirty_price: float) -> list[tuple[float, float, float]]:
        signals = grid(
            flat("CLEAN", 100.0, price=clean_price), flat("DIRTY", 100.0, price=dirty_price)
        )
        waiter = CapacityWaiter(signals, EnergyModel(), 1800.0, objective="price")
        plan = schedule(cluster(600.0, [job()]), Policy(start_advisor=waiter, patience_s=1800.0))
        return [
            (p.deferral.saving_fraction, p.deferral.expected_now, p.deferral.expected_then)
            for p in plan.pending
            if p.deferral is not None
        ]

    # The clean node 1 % cheaper than the free one, whichever side of zero: no wait.
    assert held(49.5, 50.0) == []
    assert held(-50.5, -50.0) == []  # before: held, with a saving "fraction" of -1 %
    # Paid 60 % more for the same run by waiting: a saving, and its fraction, are positive.
    ((fraction, now, then),) = held(-80.0, -50.0)
    assert now < 0
    assert then < now
    assert fraction == pytest.approx((now - then) / abs(now))
    assert fraction == pytest.approx(0.6)


def test_the_green_policy_waits_and_the_baseline_never_does() -> None:
    inputs = GreenInputs(signals=grid(CLEAN, DIRTY), latency=None)  # type: ignore[arg-type]
    green = build_policy("green", inputs)
    assert green.patience_s == inputs.patience_s > 0
    assert schedule(cluster(600.0, [job()]), green).pending[0].code == "deferred"
    baseline = build_policy("fifo-binpack", inputs)
    assert baseline.patience_s == 0
    assert [p.node_id for p in schedule(cluster(600.0, [job()]), baseline).placements] == ["dirty"]
