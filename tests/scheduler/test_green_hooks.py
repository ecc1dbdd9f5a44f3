"""What the green issue added to the core: weight validation at construction, the
StartAdvisor hook (deferrals, bookings, the safety rule), the fifo queue order and
the deadline guard."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from cloud.scheduler import (
    Booking,
    Deferral,
    InferenceDeployment,
    Policy,
    Snapshot,
    StartCandidates,
    TrainingJob,
)

from .builders import NOW, gpu_node, job, plan_for


@pytest.mark.parametrize("weight", [-1.0, float("nan"), float("inf")])
def test_bad_weights_fail_when_the_job_is_built(weight: float) -> None:
    with pytest.raises(ValueError, match="score weight carbon must be a finite number >= 0"):
        TrainingJob(work_id="j", tenant="t", score_weights={"carbon": weight})
    with pytest.raises(ValueError, match="score weight packing"):
        InferenceDeployment(work_id="d", tenant="t", score_weights={"packing": weight})


def test_unknown_term_names_fail_naming_the_term() -> None:
    with pytest.raises(ValueError, match="unknown term 'carbn'"):
        TrainingJob(work_id="j", tenant="t", score_weights={"carbn": 1.0})
    # Known names and extension terms ("x-...") are accepted.
    TrainingJob(work_id="j", tenant="t", score_weights={"latency": 0.0, "x-zone-carbon": 2.0})


def test_max_delay_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="max_delay_s"):
        TrainingJob(work_id="j", tenant="t", max_delay_s=-1.0)
    flexible = TrainingJob(work_id="j", tenant="t", submitted_at=NOW, max_delay_s=60.0)
    assert flexible.flexible
    assert flexible.latest_start(3600.0) == NOW + 60.0
    both = TrainingJob(
        work_id="j", tenant="t", submitted_at=NOW, max_delay_s=600.0, deadline=NOW + 3700
    )
    assert both.latest_start(3600.0) == NOW + 100.0


def test_policy_validates_its_switches() -> None:
    with pytest.raises(ValueError, match="queue_order"):
        Policy(queue_order="lifo")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="deadline_guard_s"):
        Policy(deadline_guard_s=-1.0)
    with pytest.raises(ValueError, match="finite"):
        Policy(weights={"packing": float("nan")})


class Recorder:
    """An advisor that defers every job by an hour and records what it was shown."""

    def __init__(self, delay_s: float = 3600.0) -> None:
        self.delay_s = delay_s
        self.calls: list[tuple[str, list[StartCandidates], list[Booking]]] = []

    def advise(
        self,
        snapshot: Snapshot,
        job: TrainingJob,
        options: Sequence[StartCandidates],
        booked: Sequence[Booking],
    ) -> Deferral | None:
        self.calls.append((job.work_id, list(options), list(booked)))
        if job.work_id.startswith("now"):
            return None
        return Deferral(
            start_at=snapshot.now + self.delay_s,
            latest_start=snapshot.now + self.delay_s,
            zone="DE",
            saving_fraction=0.5,
            expected_now=2.0,
            expected_then=1.0,
            accelerators=job.workers * job.accelerators_per_worker,
            runtime_s=job.duration_s,
        )


def test_only_flexible_training_is_offered_to_the_advisor_with_bookings() -> None:
    advisor = Recorder()
    queue = [
        job("now-a", 2, submitted_at=NOW - 30, deadline=NOW + 86400),
        job("later", 1, submitted_at=NOW - 20, deadline=NOW + 86400),
        job("rigid", 1, submitted_at=NOW - 10),
    ]
    plan = plan_for([gpu_node("n")], queue, policy=Policy(start_advisor=advisor))
    assert [call[0] for call in advisor.calls] == ["now-a", "later"]
    options = advisor.calls[0][1]
    assert options[0].candidates.kind == "gpu"
    assert options[0].fits_now.tolist() == [True]
    # "later" sees that "now-a" took two GPUs on n from now.
    booked = advisor.calls[1][2]
    assert [(b.node_id, b.accelerators, b.start_s) for b in booked] == [("n", 2, NOW)]
    later = plan.pending_for("later")
    assert later is not None
    assert later.code == "deferred"
    assert later.retry_at == NOW + 3600
    assert {p.work_id for p in plan.placements} == {"now-a", "rigid"}


def test_a_deferral_that_would_miss_the_deadline_is_ignored() -> None:
    advisor = Recorder(delay_s=7200.0)
    tight = job("tight", 1, submitted_at=NOW, duration_s=3600.0, deadline=NOW + 9000)
    plan = plan_for([gpu_node("n")], [tight], policy=Policy(start_advisor=advisor))
    assert plan.placements  # 2 h + 1 h > 2.5 h: the core starts it now


def test_deadline_guard_puts_urgent_flexible_jobs_first() -> None:
    queue = [
        job("early", 8, submitted_at=NOW - 100),
        job("urgent", 8, submitted_at=NOW - 50, duration_s=3600.0, deadline=NOW + 4000),
    ]
    plain = plan_for([gpu_node("n")], queue)
    assert plain.order == ("early", "urgent")
    guarded = plan_for([gpu_node("n")], queue, policy=Policy(deadline_guard_s=1800.0))
    assert guarded.order == ("urgent", "early")
    assert guarded.placements[0].work_id == "urgent"
