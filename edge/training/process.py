"""The real launcher: the job's command as a process that outlives the agent.

The worker runs under its wrapper (edge/training/wrapper.py) in a session (process
group) of its own, with no pipe to the agent: stopping it signals the whole group
(torchrun starts one process per GPU), and an agent that stops, crashes or is
restarted leaves it running. The wrapper writes the output to a bounded log file,
which the agent reads on from where it was (edge/training/log_tail.py), and the
exit status to a file. A restarted agent takes its live workers back (`adopt`:
edge/training/worker_record.py) and collects the status of those that ended while
it was away; a worker gone without a status (the node rebooted) is reported lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

import structlog

from edge.training import wrapper
from edge.training.log_tail import LogTail
from edge.training.output import OutputBuffer
from edge.training.runs import RunStatus
from edge.training.worker_record import (
    WorkerRecord,
    boot_id,
    is_alive,
    load_record,
    process_started,
    save_record,
)
from edge.training.wrapper import read_exit_status
from shared.messages import DesiredTraining, TrainingRunState

WRAPPER_SCRIPT = wrapper.__file__
POLL_S = 0.25  # how often the log is read and the worker's liveness checked
RECORD_EVERY_POLLS = 20  # the record's read position is saved this often (5 s)
LOST_REASON = "lost: the worker was not running when the agent started (the node restarted?)"


def describe_exit(returncode: int, *, stop_requested: bool) -> tuple[TrainingRunState, str]:
    """(state, reason) for a finished worker. A SIGKILL we did not send is most often
    the kernel's out-of-memory killer, so the reason says so."""
    if stop_requested:
        return "stopped", ""
    if returncode == 0:
        return "succeeded", ""
    if returncode < 0:
        signum = -returncode
        if signum == signal.SIGKILL:
            return "failed", "killed by SIGKILL (out of memory?)"
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
        return "failed", f"killed by {name}"
    if returncode == 128 + signal.SIGKILL:
        return "failed", "exit code 137: killed by SIGKILL (out of memory?)"
    return "failed", f"exit code {returncode}"


@dataclass(frozen=True, slots=True)
class WorkerFiles:
    log_path: Path
    record_path: Path
    exit_path: Path


class ProcessRun:
    outlives_agent = True

    def __init__(
        self,
        spec: DesiredTraining,
        environment: dict[str, str],
        files: WorkerFiles,
        max_log_bytes: int,
        wall_clock: Callable[[], float],
        adopted: WorkerRecord | None = None,
    ) -> None:
        """`adopted`: the record of a worker an earlier agent started (see `adopt`)."""
        self.spec = spec
        self.status = RunStatus(spec.job_id, spec.attempt, wall_clock=wall_clock)
        self.output = OutputBuffer(offset=adopted.output_offset if adopted else 0)
        self.files = files
        self._environment = environment
        self._max_log_bytes = max_log_bytes
        self._tail = LogTail(files.log_path, adopted.tail if adopted else None)
        self._record = adopted
        self._process: asyncio.subprocess.Process | None = None  # None: not our child
        self._exited: asyncio.Task[int] | None = None
        self._stop_reason: str | None = None
        self._finished = asyncio.Event()
        self._log = structlog.get_logger("greenfed.training").bind(
            job_id=spec.job_id, attempt=spec.attempt
        )
        if adopted is not None:
            # It is running already (or ended while no agent watched): no new "started".
            self.status.state = "running"
            self.status.started_at = adopted.started_at

    @property
    def log_path(self) -> Path:
        return self.files.log_path

    @property
    def pid(self) -> int | None:
        return self._record.pid if self._record is not None else None

    async def run(self) -> None:
        try:
            if self._record is None and not await self._start():
                return
            if self._process is None:
                self._log.info("training worker taken over", pid=self.pid)
            await self._follow()
        except asyncio.CancelledError:
            # The agent is stopping: the worker goes on, and the next agent takes it back.
            if not self.status.finished and self._record is not None:
                self._save_record()
                self._log.info("training worker left running", pid=self.pid)
            raise
        finally:
            self._finished.set()

    async def _start(self) -> bool:
        files = self.files
        if not self.spec.command:
            self.status.mark_finished("failed", None, "no command given")
            return False
        files.log_path.parent.mkdir(parents=True, exist_ok=True)
        for stale in (files.exit_path, files.record_path):
            stale.unlink(missing_ok=True)
        try:
            self._process = await asyncio.create_subprocess_exec(
                sys.executable,
                # Isolated (-I) and by path: the job's PYTHONPATH and working directory
                # reach the command (which inherits the environment), never the wrapper's
                # own imports, where a package of the same name would shadow ours.
                "-I",
                WRAPPER_SCRIPT,
                "--log",
                str(files.log_path),
                "--max-log-bytes",
                str(self._max_log_bytes),
                "--exit-file",
                str(files.exit_path),
                "--",
                *self.spec.command,
                env=self._environment,
                cwd=self.spec.working_dir,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as error:  # e.g. the working directory does not exist
            self.status.mark_finished("failed", None, f"cannot start: {error}")
            return False
        self._exited = asyncio.ensure_future(self._process.wait())
        pid = self._process.pid
        self._record = WorkerRecord(
            job_id=self.spec.job_id,
            attempt=self.spec.attempt,
            pid=pid,
            process_started=process_started(pid) or 0.0,
            boot_id=boot_id(),
            started_at=self.status.wall_clock(),
            grace_period_s=self.spec.grace_period_s,
        )
        self._save_record()
        self.status.mark_running()
        self._log.info("training worker started", pid=pid)
        return True

    def _running(self) -> bool:
        if self._process is not None:
            return self._process.returncode is None
        record = self._record
        return record is not None and is_alive(record.pid, record.process_started, record.boot_id)

    async def _pause(self) -> None:
        if self._exited is not None:
            await asyncio.wait({self._exited}, timeout=POLL_S)
        else:
            await asyncio.sleep(POLL_S)

    async def _follow(self) -> None:
        polls = 0
        while self._running():
            self._read_output()
            polls += 1
            if polls % RECORD_EVERY_POLLS == 0:
                self._save_record()
            await self._pause()
        while self._read_output():
            pass  # the rest of what it printed
        self._finish()

    def _read_output(self) -> bool:
        data = self._tail.read()
        if data:
            self.output.append(data)
        return bool(data)

    def _finish(self) -> None:
        stop_requested = self._stop_reason is not None
        recorded = read_exit_status(self.files.exit_path)
        if recorded is not None and recorded[1]:
            self.status.mark_finished("failed", None, recorded[1])  # it could not start
        elif recorded is not None or self._process is not None:
            # The wrapper's record, or, if it was killed before writing it, its own exit.
            returncode = recorded[0] if recorded is not None else self._process_returncode()
            state, reason = describe_exit(
                returncode if returncode is not None else -signal.SIGKILL,
                stop_requested=stop_requested,
            )
            self.status.mark_finished(state, returncode, self._stop_reason or reason)
        elif stop_requested:
            self.status.mark_finished("stopped", None, self._stop_reason or "")
        else:
            self.status.mark_finished("stopped", None, LOST_REASON)
        self._log.info(
            "training worker ended",
            state=self.status.state,
            exit_code=self.status.exit_code,
            reason=self.status.reason,
        )

    def _process_returncode(self) -> int | None:
        return self._process.returncode if self._process is not None else None

    def _save_record(self) -> None:
        """Where the reading got to: the output not yet taken is read again later."""
        record = self._record
        if record is None:
            return
        at, pending = self._tail.at, self.output.pending_bytes
        if pending <= at.position:
            record.tail_position = at.position - pending
            record.output_offset = self.output.shipped_offset
        else:  # part of it came from the rotated file: that part is given up
            record.tail_position = 0
            record.output_offset = self.output.shipped_offset + pending - at.position
        record.tail_inode = at.inode
        with contextlib.suppress(OSError):
            save_record(self.files.record_path, record)

    def _signal_group(self, signum: int) -> None:
        if self._record is None or not self._running():
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._record.pid, signum)

    async def _terminate(self, grace_s: float) -> None:
        self._signal_group(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while self._running() and time.monotonic() < deadline:
            await self._pause()
        self._signal_group(signal.SIGKILL)

    async def stop(self, reason: str) -> None:
        if self.status.finished:
            return
        self._stop_reason = reason
        await self._terminate(self.spec.grace_period_s)
        await self._finished.wait()


class ProcessLauncher:
    def __init__(
        self,
        log_dir: Path,
        max_log_bytes: int = 10 * 1024 * 1024,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.log_dir = log_dir
        self._max_log_bytes = max_log_bytes
        self._wall_clock = wall_clock

    def log_path(self, job_id: str, attempt: int) -> Path:
        return self.files(job_id, attempt).log_path

    def files(self, job_id: str, attempt: int) -> WorkerFiles:
        name = f"{job_id}-{attempt}"
        return WorkerFiles(
            self.log_dir / f"{name}.log",
            self.log_dir / f"{name}.run",
            self.log_dir / f"{name}.exit",
        )

    def prepare(self, spec: DesiredTraining, environment: dict[str, str]) -> ProcessRun:
        return ProcessRun(
            spec,
            environment,
            self.files(spec.job_id, spec.attempt),
            self._max_log_bytes,
            self._wall_clock,
        )

    def leftovers(self, claimed: Collection[tuple[str, int]]) -> list[ProcessRun]:
        """Live workers an earlier agent started that nothing here claims (withdrawn
        while no agent ran, say): runs to stop, taken back from their records."""
        found = []
        for path in sorted(self.log_dir.glob("*.run")):
            record = load_record(path)
            if record is None or (record.job_id, record.attempt) in claimed:
                continue
            if not is_alive(record.pid, record.process_started, record.boot_id):
                continue
            spec = DesiredTraining(
                job_id=record.job_id,
                attempt=record.attempt,
                grace_period_s=record.grace_period_s,
            )
            files = self.files(record.job_id, record.attempt)
            found.append(
                ProcessRun(spec, {}, files, self._max_log_bytes, self._wall_clock, adopted=record)
            )
        return found

    def adopt(self, spec: DesiredTraining, environment: dict[str, str]) -> ProcessRun | None:
        """The run of this worker an earlier agent started, if it left a record."""
        files = self.files(spec.job_id, spec.attempt)
        record = load_record(files.record_path)
        if record is None or (record.job_id, record.attempt) != (spec.job_id, spec.attempt):
            return None
        return ProcessRun(
            spec, environment, files, self._max_log_bytes, self._wall_clock, adopted=record
        )
