"""One training worker's life on this node, and what launches it.

A run goes starting -> running -> succeeded | failed | stopped. It is *stopped*
when the cloud withdrew it (cancel, preemption) or the agent shut down; the
cloud decides what that means for the job.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from edge.training.output import OutputBuffer
from shared.messages import Accelerator, DesiredTraining, ReportedTraining, TrainingRunState

TERMINAL_STATES: frozenset[TrainingRunState] = frozenset({"succeeded", "failed", "stopped"})


@dataclass
class RunStatus:
    """Mutable status of a run, turned into the wire form for `reported`."""

    job_id: str
    attempt: int
    state: TrainingRunState = "starting"
    exit_code: int | None = None
    reason: str = ""
    started_at: float | None = None
    finished_at: float | None = None
    # The limit its GPUs are held to (None: the default) and why an asked one is not
    # applied: set by edge/training/power_limits.py.
    power_limit_w: float | None = None
    power_limit_note: str = ""
    wall_clock: Callable[[], float] = field(default=time.time, repr=False)
    # Called after every state change (the reconciler reports and raises events).
    on_change: Callable[[RunStatus], None] | None = field(default=None, repr=False)

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL_STATES

    def mark_running(self, at: float | None = None) -> None:
        """`at`: when it started, where the worker itself said (default: now)."""
        self.state = "running"
        self.started_at = self.wall_clock() if at is None else at
        self._changed()

    def mark_finished(self, state: TrainingRunState, exit_code: int | None, reason: str) -> None:
        self.state = state
        self.exit_code = exit_code
        self.reason = reason
        self.finished_at = self.wall_clock()
        self._changed()

    def set_power_limit(self, limit_w: float | None, note: str) -> bool:
        """Whether that changed anything. Not a state change: no `on_change` (which
        raises events), the caller reports it."""
        if (self.power_limit_w, self.power_limit_note) == (limit_w, note):
            return False
        self.power_limit_w, self.power_limit_note = limit_w, note
        return True

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change(self)

    def reported(self) -> ReportedTraining:
        return ReportedTraining(
            job_id=self.job_id,
            attempt=self.attempt,
            state=self.state,
            exit_code=self.exit_code,
            reason=self.reason,
            started_at=self.started_at,
            finished_at=self.finished_at,
            power_limit_w=self.power_limit_w,
            power_limit_note=self.power_limit_note,
        )


class TrainingRun(Protocol):
    status: RunStatus
    output: OutputBuffer  # what the worker printed, waiting to be shipped to the cloud
    # Left running when the agent stops, to be taken back by the next one (`adopt`);
    # else stopped with the agent.
    outlives_agent: bool

    async def run(self) -> None:
        """Start the worker and supervise it until it has finished. A job that fails
        (or cannot even start) ends in a terminal status; this never raises for it."""
        ...

    async def stop(self, reason: str) -> None:
        """Ask the worker to end (SIGTERM, grace period, SIGKILL); return once it has."""
        ...


class RejectedRun:
    """A desired worker this node will not run (an accelerator it lacks, isolation it
    cannot give, secrets it cannot open): it fails at once, saying why."""

    outlives_agent = False

    def __init__(self, spec: DesiredTraining, reason: str) -> None:
        self.status = RunStatus(spec.job_id, spec.attempt)
        self.output = OutputBuffer()
        self.reason = reason

    async def run(self) -> None:
        self.status.mark_finished("failed", None, self.reason)

    async def stop(self, reason: str) -> None:
        return None


class TrainingLauncher(Protocol):
    def prepare(self, spec: DesiredTraining) -> TrainingRun:
        """A run for the worker(s) of `spec` on this node, not started yet (the caller
        owns the task that runs it); a RejectedRun when this node will not run it."""
        ...

    def adopt(self, spec: DesiredTraining) -> TrainingRun | None:
        """The run of this worker an earlier agent started and left (running, or ended
        meanwhile, or lost), to be supervised from where it is; None: there is none."""
        ...

    def leftovers(self, claimed: Collection[tuple[str, int]]) -> Sequence[TrainingRun]:
        """Live workers an earlier agent left that none of `claimed` (job id, attempt)
        is: the reconciler stops them."""
        ...


# The agent builds its launcher once it knows the node's accelerators (after discovery).
LauncherFactory = Callable[[Sequence[Accelerator]], TrainingLauncher]
