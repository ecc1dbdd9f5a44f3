"""A scoring, latency or start hook that fails for one job gives that job a pending
reason (code ``hook-failed``); the rest of the pass is decided as if it were not queued."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pytest

from cloud.scheduler import (
    Booking,
    Candidates,
    Deferral,
    HookFailure,
    InferenceDeployment,
    Pending,
    Plan,
    Policy,
    Snapshot,
    StartCandidates,
    TermValues,
    TrainingJob,
    Work,
)
from cloud.scheduler.arrays import FloatArray

from .builders import NOW, deployment, edge_node, gpu_node, job, plan_for


def hook_failure(plan: Plan, work_id: str) -> tuple[Pending, HookFailure]:
    pending = plan.pending_for(work_id)
    assert pending is not None
    assert pending.code == "hook-failed"
    assert pending.hook_failure is not None
    return pending, pending.hook_failure


@dataclass(frozen=True, slots=True)
class FailingTerm:
    """Prefers nothing, and fails for the jobs named in ``fail_for``."""

    fail_for: frozenset[str]
    wrong_size_for: frozenset[str] = frozenset()

    @property
    def name(self) -> str:
        return "x-flaky"

    def evaluate(self, snapshot: Snapshot, work: Work, candidates: Candidates) -> TermValues:
        if work.work_id in self.fail_for:
            raise KeyError("DE")
        size = candidates.nodes.size + (1 if work.work_id in self.wrong_size_for else 0)
        return TermValues(self.name, np.zeros(size), higher_is_better=False)


def test_a_failing_score_term_leaves_only_its_job_pending() -> None:
    queue = [
        job("before", 1, submitted_at=NOW - 30),
        job("bad", 1, submitted_at=NOW - 20),
        job("after", 1, submitted_at=NOW - 10),
    ]
    policy = Policy(score_terms=(FailingTerm(frozenset({"bad"})),))
    plan = plan_for([gpu_node("n")], queue, policy=policy)
    assert plan.order == ("before", "bad", "after")
    assert {p.work_id for p in plan.placements} == {"before", "after"}
    assert [p.work_id for p in plan.pending] == ["bad"]
    pending, failure = hook_failure(plan, "bad")
    assert failure == HookFailure(
        hook="score-term", name="x-flaky", error="KeyError", detail="'DE'"
    )
    assert pending.message == (
        "Not scheduled in this pass: score term 'x-flaky' failed for it (KeyError: 'DE'); "
        "other work is unaffected and the next pass tries again."
    )
    assert pending.nodes_total == 1
    assert dict(pending.rejections) == {}
    assert pending.fitting_nodes == 0
    assert pending.members_needed == 1
    assert pending.members_placed == 0
    assert pending.reservation is None
    assert plan.explain("bad") == [pending.message]


def test_a_term_with_the_wrong_number_of_values_fails_its_job_only() -> None:
    queue = [job("bad", 1, submitted_at=NOW - 20), job("good", 1, submitted_at=NOW - 10)]
    policy = Policy(score_terms=(FailingTerm(frozenset(), frozenset({"bad"})),))
    plan = plan_for([gpu_node("n")], queue, policy=policy)
    assert [p.work_id for p in plan.placements] == ["good"]
    _, failure = hook_failure(plan, "bad")
    assert failure.hook == "score-term"
    assert failure.error == "ValueError"
    assert failure.detail == "score term 'x-flaky' returned 2 raw values for 1 candidates"


def test_a_term_switched_off_for_a_job_is_not_called_for_it() -> None:
    bad = job("bad", 1, score_weights={"x-flaky": 0.0})
    plan = plan_for(
        [gpu_node("n")], [bad], policy=Policy(score_terms=(FailingTerm(frozenset({"bad"})),))
    )
    assert [p.work_id for p in plan.placements] == ["bad"]


@dataclass(frozen=True, slots=True)
class MarsUnknown:
    """A latency estimator that has no idea about traffic from Mars."""

    def estimate_ms(
        self, snapshot: Snapshot, deployment: InferenceDeployment, candidates: Candidates
    ) -> FloatArray:
        if "mars" in deployment.traffic_by_region:
            raise LookupError("no RTT from mars")
        return np.full(candidates.nodes.size, 10.0)


@dataclass(frozen=True, slots=True)
class TooFewEstimates:
    def estimate_ms(
        self, snapshot: Snapshot, deployment: InferenceDeployment, candidates: Candidates
    ) -> FloatArray:
        return np.zeros(candidates.nodes.size - 1)


def test_a_failing_latency_estimator_leaves_only_its_deployment_pending() -> None:
    nodes = [edge_node("e1"), edge_node("e2")]
    queue = [
        deployment("mars", latency_slo_ms=50, traffic_by_region={"mars": 1.0}, submitted_at=1.0),
        deployment("earth", latency_slo_ms=50, traffic_by_region={"edge-a": 1.0}, submitted_at=2.0),
        deployment("no-slo", traffic_by_region={"mars": 1.0}, submitted_at=3.0),
    ]
    plan = plan_for(nodes, queue, policy=Policy(latency_estimator=MarsUnknown()))
    assert {p.work_id for p in plan.placements} == {"earth", "no-slo"}
    pending, failure = hook_failure(plan, "mars")
    assert failure == HookFailure(
        hook="latency-estimator", name="MarsUnknown", error="LookupError", detail="no RTT from mars"
    )
    assert "latency estimator 'MarsUnknown' failed for it (LookupError: no RTT from mars)" in (
        pending.message
    )
    assert pending.members_needed == 1


def test_a_latency_estimate_per_candidate_is_required() -> None:
    queue = [deployment("d", latency_slo_ms=50)]
    plan = plan_for(
        [edge_node("e1"), edge_node("e2")],
        queue,
        policy=Policy(latency_estimator=TooFewEstimates()),
    )
    _, failure = hook_failure(plan, "d")
    assert failure.hook == "latency-estimator"
    assert failure.error == "ValueError"
    assert failure.detail == "returned 1 estimates for 2 candidates"


def test_a_failed_estimate_is_not_cached_for_the_next_job_of_the_same_shape() -> None:
    calls: list[str] = []

    @dataclass(frozen=True, slots=True)
    class FirstCallFails:
        def estimate_ms(
            self, snapshot: Snapshot, deployment: InferenceDeployment, candidates: Candidates
        ) -> FloatArray:
            calls.append(deployment.work_id)
            if len(calls) == 1:
                raise RuntimeError("warming up")
            return np.zeros(candidates.nodes.size)

    queue = [
        deployment("first", latency_slo_ms=50, submitted_at=1.0),
        deployment("second", latency_slo_ms=50, submitted_at=2.0),
    ]
    plan = plan_for(
        [edge_node("e1"), edge_node("e2")], queue, policy=Policy(latency_estimator=FirstCallFails())
    )
    assert calls == ["first", "second"]
    hook_failure(plan, "first")
    assert [p.work_id for p in plan.placements] == ["second"]


class FailingAdvisor:
    """Defers nothing; fails for the jobs named ``bad*``."""

    def advise(
        self,
        snapshot: Snapshot,
        job: TrainingJob,
        options: Sequence[StartCandidates],
        booked: Sequence[Booking],
    ) -> Deferral | None:
        if job.work_id.startswith("bad"):
            raise ZeroDivisionError("float division by zero")
        return None


def test_a_failing_start_advisor_leaves_only_its_job_pending() -> None:
    queue = [
        job("bad", 1, submitted_at=NOW - 30, deadline=NOW + 86400),
        job("flexible", 1, submitted_at=NOW - 20, deadline=NOW + 86400),
        job("rigid", 1, submitted_at=NOW - 10),
    ]
    plan = plan_for([gpu_node("n")], queue, policy=Policy(start_advisor=FailingAdvisor()))
    assert {p.work_id for p in plan.placements} == {"flexible", "rigid"}
    pending, failure = hook_failure(plan, "bad")
    assert failure == HookFailure(
        hook="start-advisor",
        name="FailingAdvisor",
        error="ZeroDivisionError",
        detail="float division by zero",
    )
    assert pending.deferral is None
    assert pending.retry_at is None
    assert plan.deferrals == ()


def test_the_sentence_stays_one_line_for_a_long_error() -> None:
    @dataclass(frozen=True, slots=True)
    class Chatty:
        @property
        def name(self) -> str:
            return "x-chatty"

        def evaluate(self, snapshot: Snapshot, work: Work, candidates: Candidates) -> TermValues:
            raise RuntimeError("line one\nline two " + "x" * 500)

    plan = plan_for([gpu_node("n")], [job("j", 1)], policy=Policy(score_terms=(Chatty(),)))
    pending, failure = hook_failure(plan, "j")
    assert "\n" in failure.detail  # the data keeps the whole text
    assert "\n" not in pending.message
    assert "(RuntimeError: line one line two xxx" in pending.message
    assert len(pending.message) < 400


def test_an_interrupt_in_a_hook_is_not_swallowed() -> None:
    class Interrupted:
        def advise(
            self,
            snapshot: Snapshot,
            job: TrainingJob,
            options: Sequence[StartCandidates],
            booked: Sequence[Booking],
        ) -> Deferral | None:
            raise KeyboardInterrupt

    flexible = job("j", 1, deadline=NOW + 86400)
    with pytest.raises(KeyboardInterrupt):
        plan_for([gpu_node("n")], [flexible], policy=Policy(start_advisor=Interrupted()))
