"""A node's jobs directory does not grow with every worker it ever ran, real processes:
a run's files stay while the cloud lists it and while its output waits to be shipped
(a restarted agent reads on from them), then go, but for the newest few logs."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from edge.training.reconcile import TrainingReconciler
from shared.messages import DesiredTraining
from tests.support.launchers import plain_launcher
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(60)

KEPT_LOGS = 2


def job(number: int) -> DesiredTraining:
    return DesiredTraining(
        job_id=f"job-{number}", command=(sys.executable, "-c", f"print('job {number}')")
    )


def ship_output(reconciler: TrainingReconciler) -> None:
    """What the agent's log shipper does (edge/agent/job_logs.py), all at once."""
    for run in reconciler.runs_with_output():
        while run.output.take() is not None:
            pass
    reconciler.runs_with_output()


def finished(reconciler: TrainingReconciler) -> bool:
    return all(r.state in ("succeeded", "failed", "stopped") for r in reconciler.reported())


async def test_runs_done_with_leave_only_the_newest_logs(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    launcher = plain_launcher(tmp_path, kept_finished_logs=KEPT_LOGS)
    reconciler = TrainingReconciler(launcher, (), on_change=lambda: None, on_event=lambda *_: None)

    def files() -> set[str]:
        return {path.name for path in jobs.iterdir()}

    async with asyncio.timeout(45), asyncio.TaskGroup() as tasks:
        reconciler.bind(tasks)
        reconciler.apply([job(0)])
        await eventually(lambda: finished(reconciler))
        # Listed still: the cloud has yet to see how it ended.
        assert {"job-0-0.run", "job-0-0.exit", "job-0-0.log"} <= files()
        reconciler.apply([])
        # Withdrawn, its output not shipped yet: a restarted agent would read it on.
        assert {"job-0-0.run", "job-0-0.log"} <= files()
        ship_output(reconciler)
        assert files() == {"job-0-0.log"}

        for number in range(1, 5):
            reconciler.apply([job(number)])
            await eventually(lambda: finished(reconciler))
            reconciler.apply([])
            ship_output(reconciler)
    assert files() == {"job-3-0.log", "job-4-0.log"}
    assert (jobs / "job-4-0.log").read_text() == "job 4\n"
    assert launcher.leftovers(set()) == []
