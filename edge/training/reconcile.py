"""Desired training -> running workers -> reported states.

The cloud's `desired` document lists the workers this node should run, each
identified by (job id, attempt). The reconciler starts those it does not run
yet, stops those no longer listed, and keeps each finished worker's outcome in
the reported state for as long as the cloud still lists it, so the cloud always
sees how an attempt ended. Workers belong to the reconciler's task group, not to
an MQTT connection: they keep running while the broker is unreachable. A worker's
GPUs are held to the power limit it asks for from before it starts until it ends
(edge/training/power_limits.py).

A withdrawn run stays with the reconciler until it has ended and its output has been
shipped; then the launcher is told it may remove the run's files. Listed again before
that (a document restored from disk older than the broker's lists it again, say), it is
the same run that is reported, not a second takeover of its worker, which would take
the agent's own stop for the job failing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from edge.training.power_limits import PowerLimits
from edge.training.runs import RejectedRun, RunStatus, TrainingLauncher, TrainingRun
from shared.lean_logs import get_logger
from shared.messages import Accelerator, DesiredTraining, EventKind, ReportedTraining

RunKey = tuple[str, int]
LEFTOVER_REASON = "not wanted: an earlier agent's worker its successor was not given"
EventSink = Callable[[EventKind, str, str], None]  # kind, subject (job id), detail


@runtime_checkable
class KeepsRunFiles(Protocol):
    """A launcher that keeps files of each run on disk (edge/training/process.py)."""

    def forget(self, job_id: str, attempt: int) -> None:
        """The reconciler is done with this run: its files may go."""
        ...


class TrainingReconciler:
    def __init__(
        self,
        launcher: TrainingLauncher | None,
        inventory: Sequence[Accelerator],
        *,
        on_change: Callable[[], None],
        on_event: EventSink,
        on_output: Callable[[], None] | None = None,
        power_limits: PowerLimits | None = None,
    ) -> None:
        """`launcher` None: this node does not train; every worker sent here fails with why.
        `power_limits` None: no GPU power limit can be set here (each asked one says so)."""
        self._launcher = launcher
        self._inventory = tuple(inventory)
        self._power = power_limits or PowerLimits(None, inventory)
        self._on_change = on_change
        self._on_event = on_event
        self._on_output = on_output
        # Withdrawn runs stay here until their last output has been shipped.
        self._retired: list[TrainingRun] = []
        self._runs: dict[RunKey, TrainingRun] = {}
        self._tasks: asyncio.TaskGroup | None = None
        self._swept = False  # earlier agents' unclaimed workers were looked for
        self._log = get_logger("greenfed.training")

    def bind(self, tasks: asyncio.TaskGroup) -> None:
        """The task group that owns the workers' supervision (the agent's lifetime)."""
        self._tasks = tasks

    def reported(self) -> tuple[ReportedTraining, ...]:
        return tuple(run.status.reported() for _, run in sorted(self._runs.items()))

    def apply(self, desired: Sequence[DesiredTraining]) -> None:
        """Start what is new, stop what was withdrawn. Returns at once; work happens in tasks."""
        assert self._tasks is not None, "bind() the reconciler to a task group first"
        wanted = {(spec.job_id, spec.attempt): spec for spec in desired}
        for key, run in list(self._runs.items()):
            if key not in wanted:
                del self._runs[key]
                self._retired.append(run)
                if not run.status.finished:
                    self._tasks.create_task(self._stop(run, "withdrawn by the cloud"))
        for key, spec in wanted.items():
            if key in self._runs:
                continue
            withdrawn = self._take_back(key)
            if withdrawn is not None:
                self._runs[key] = withdrawn  # its supervision (and stop) goes on
                continue
            run = self._prepare(spec)
            self._runs[key] = run
            self._tasks.create_task(self._supervise(run))
        if not self._swept and self._launcher is not None:
            # The first document applied says what this node should run: a worker an
            # earlier agent left that it does not list (withdrawn while no agent ran)
            # would hold its GPUs unseen, so it is stopped.
            self._swept = True
            for run in self._launcher.leftovers(set(self._runs)):
                run.status.on_change = self._status_changed
                run.output.on_output = self._on_output
                self._retired.append(run)
                self._tasks.create_task(self._supervise(run))
                self._tasks.create_task(self._stop(run, LEFTOVER_REASON))
            # GPUs an earlier agent capped for workers that ended while no agent ran get
            # their default back, whether or not a worker starts now.
            self._tasks.create_task(self._settle_power_limits())
        self._forget_done()
        self._on_change()

    async def stop_all(self, reason: str, timeout_s: float = 3.0) -> None:
        """Agent shutdown: stop every running worker that does not outlive the agent
        (real processes do: the next agent takes them back), within `timeout_s` in all."""
        running = [
            run for run in self._runs.values() if not run.status.finished and not run.outlives_agent
        ]
        if not running:
            return
        self._log.info("stopping training workers", count=len(running), reason=reason)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await asyncio.gather(*(run.stop(reason) for run in running))
                # Here, not in their supervision, which the agent cancels as it stops.
                for run in running:
                    self._power.release(run.status)
                await self._settle_power_limits()

    def _prepare(self, spec: DesiredTraining) -> TrainingRun:
        run: TrainingRun
        if self._launcher is None:
            run = RejectedRun(spec, "this node does not run training")
        else:
            run = self._launcher.adopt(spec) or self._launcher.prepare(spec)
            if not isinstance(run, RejectedRun):
                # A worker taken back holds its limit again: this agent has set none yet.
                self._power.hold(spec, run.status)
        run.status.on_change = self._status_changed
        run.output.on_output = self._on_output
        return run

    def _take_back(self, key: RunKey) -> TrainingRun | None:
        """The withdrawn run of `key`, listed again, if it is still here: whatever it
        is doing (being stopped, say) goes on, and it is reported as it ends."""
        for run in reversed(self._retired):
            if (run.status.job_id, run.status.attempt) == key:
                self._retired.remove(run)
                return run
        return None

    def runs_with_output(self) -> list[TrainingRun]:
        """Runs, current or withdrawn, whose output waits to be shipped."""
        self._forget_done()
        return [run for run in (*self._runs.values(), *self._retired) if run.output.pending_bytes]

    def _forget_done(self) -> None:
        """Withdrawn runs that have ended and whose output is all shipped are let go,
        and the launcher removes their files (else a node's jobs directory would grow
        with every run it ever ran)."""
        done = [
            run for run in self._retired if run.status.finished and not run.output.pending_bytes
        ]
        if not done:
            return
        self._retired = [run for run in self._retired if run not in done]
        launcher = self._launcher
        if launcher is None or not isinstance(launcher, KeepsRunFiles):
            return
        for run in done:
            key = (run.status.job_id, run.status.attempt)
            if key not in self._runs:  # else the files are the listed run's
                launcher.forget(*key)

    def _status_changed(self, status: RunStatus) -> None:
        if status.state == "running":
            self._on_event("started", status.job_id, f"attempt {status.attempt}")
        elif status.finished:
            kind: EventKind = "exited" if status.state in ("succeeded", "stopped") else "failed"
            exit_text = f"exit code {status.exit_code}" if status.exit_code is not None else ""
            detail = status.reason or exit_text
            self._on_event(
                kind, status.job_id, f"{status.state}: {detail}" if detail else status.state
            )
        self._on_change()

    async def _supervise(self, run: TrainingRun) -> None:
        await self._settle_power_limits()  # the worker starts under its limit
        await run.run()
        if run.status.finished:  # else it is left running for the next agent, capped
            self._power.release(run.status)
            await self._settle_power_limits()
            self._forget_done()  # a withdrawn run that ended with nothing left to ship

    async def _settle_power_limits(self) -> None:
        if await self._power.settle():
            self._on_change()

    async def _stop(self, run: TrainingRun, reason: str) -> None:
        await run.stop(reason)
