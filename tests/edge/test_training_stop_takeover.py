"""A worker the agent is stopping, real processes: listed again meanwhile, or taken over
by the next agent before it ends, it is reported stopped, as the agent asked, never
failed by the agent's own SIGTERM, and its worker is followed once."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from edge.training.process import ProcessRun
from edge.training.reconcile import LEFTOVER_REASON, TrainingReconciler
from edge.training.worker_record import is_alive, load_record
from shared.messages import DesiredTraining
from shared.tasks import stop_task
from tests.support.launchers import plain_launcher
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(60)

TRAINS = "import time\nprint('training', flush=True)\ntime.sleep(60)\n"
# Says it got SIGTERM, then goes on until the wrapper kills it after the grace period.
IGNORES_SIGTERM = (
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: print('got SIGTERM', flush=True))\n"
    "print('training', flush=True)\n"
    "while True: time.sleep(0.05)\n"
)


def job(script: str, grace_period_s: float = 2.0) -> DesiredTraining:
    return DesiredTraining(
        job_id="J", attempt=1, command=(sys.executable, "-c", script), grace_period_s=grace_period_s
    )


@contextlib.contextmanager
def no_worker_left(jobs: Path) -> Iterator[None]:
    """Whatever the test's outcome, no worker of it outlives it."""
    try:
        yield
    finally:
        for path in jobs.glob("*.run"):
            record = load_record(path)
            if record is not None and is_alive(record.pid, record.process_started):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(record.pid, signal.SIGKILL)


async def left_running_by_an_earlier_agent(tmp_path: Path, desired: DesiredTraining) -> None:
    """An agent starts `desired`, then stops: the worker goes on without it."""
    reconciler = TrainingReconciler(
        plain_launcher(tmp_path), (), on_change=lambda: None, on_event=lambda *_: None
    )

    async def agent() -> None:
        async with asyncio.TaskGroup() as tasks:
            reconciler.bind(tasks)
            reconciler.apply([desired])
            await asyncio.Event().wait()  # until the agent stops

    task = asyncio.create_task(agent())
    await eventually(lambda: [r.state for r in reconciler.reported()] == ["running"])
    await stop_task(task)


def log_says(path: Path, text: str) -> Callable[[], bool]:
    return lambda: path.exists() and text in path.read_text(errors="replace")


async def test_a_worker_listed_again_while_it_is_stopped_is_reported_stopped_once(
    tmp_path: Path,
) -> None:
    desired = job(TRAINS)
    events: list[tuple[str, str, str]] = []
    with no_worker_left(tmp_path / "jobs"):
        await left_running_by_an_earlier_agent(tmp_path, desired)
        reconciler = TrainingReconciler(
            plain_launcher(tmp_path),
            (),
            on_change=lambda: None,
            on_event=lambda kind, subject, detail: events.append((kind, subject, detail)),
        )
        async with asyncio.timeout(30), asyncio.TaskGroup() as tasks:
            reconciler.bind(tasks)
            # Restored from disk: an older document that does not list it (it is stopped
            # as not wanted); then the broker's newer one, which does.
            reconciler.apply([])
            reconciler.apply([desired])
            await eventually(lambda: all(r.state == "stopped" for r in reconciler.reported()))
    [reported] = reconciler.reported()
    assert (reported.job_id, reported.state, reported.reason) == ("J", "stopped", LEFTOVER_REASON)
    assert events == [("exited", "J", f"stopped: {LEFTOVER_REASON}")]


async def test_a_worker_taken_over_while_it_is_stopped_is_reported_stopped(
    tmp_path: Path,
) -> None:
    desired = job(IGNORES_SIGTERM, grace_period_s=1.0)
    launcher = plain_launcher(tmp_path)
    with no_worker_left(tmp_path / "jobs"):
        first = launcher.prepare(desired)
        assert isinstance(first, ProcessRun)
        following = asyncio.create_task(first.run())
        await eventually(log_says(first.log_path, "training"))
        stopping = asyncio.create_task(first.stop("withdrawn by the cloud"))
        await eventually(log_says(first.log_path, "got SIGTERM"))
        # The agent ends before its worker has (it takes its grace period).
        await stop_task(stopping)
        await stop_task(following)
        assert not first.status.finished

        taken_over = launcher.adopt(desired)  # by the next agent
        assert taken_over is not None
        await asyncio.wait_for(taken_over.run(), 30)
    status = taken_over.status
    assert (status.state, status.reason) == ("stopped", "withdrawn by the cloud")
