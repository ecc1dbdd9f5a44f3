"""The live loop counts every job a failing hook left pending and logs each distinct
failure at most once a minute."""

from __future__ import annotations

import numpy as np
from structlog.testing import capture_logs

from cloud.loop.hook_failures import HookFailureLog
from cloud.scheduler import Candidates, Policy, Snapshot, TermValues, Work
from tests.scheduler.builders import gpu_node, job, plan_for


class BrokenTerm:
    name = "x-broken"

    def evaluate(self, snapshot: Snapshot, work: Work, candidates: Candidates) -> TermValues:
        if work.work_id.startswith("bad"):
            raise KeyError("DE")
        return TermValues(self.name, np.zeros(candidates.nodes.size), higher_is_better=False)


def test_each_failure_is_counted_and_logged_at_most_once_per_interval() -> None:
    clock = [100.0]
    failures = HookFailureLog(lambda: clock[0], log_interval_s=60.0)
    plan = plan_for(
        [gpu_node("n")],
        [job("bad-1", 1), job("bad-2", 1), job("good", 1)],
        policy=Policy(score_terms=(BrokenTerm(),)),
    )
    with capture_logs() as logs:
        failures.note(plan)  # two jobs, one failure: one line
        clock[0] += 30.0
        failures.note(plan)  # within the interval: counted, not logged
        clock[0] += 31.0
        failures.note(plan)  # past it: logged again
    assert failures.total == 6
    lines = [line for line in logs if line["event"] == "scheduling hook failed"]
    assert len(lines) == 2
    assert lines[0]["hook"] == "score-term"
    assert lines[0]["name"] == "x-broken"
    assert lines[0]["error"] == "KeyError"
    assert lines[0]["log_level"] == "error"
