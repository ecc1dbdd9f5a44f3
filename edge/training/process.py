"""The real launcher: the job's command as a subprocess, supervised.

The worker runs in its own session (process group), so stopping it also stops
whatever it spawned (torchrun starts one process per GPU). Output (stdout and
stderr together) goes to a bounded log file.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import structlog

from edge.training.logs import BoundedLog
from edge.training.output import OutputBuffer
from edge.training.runs import RunStatus
from shared.messages import DesiredTraining, TrainingRunState

READ_CHUNK_BYTES = 64 * 1024


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


class ProcessRun:
    def __init__(
        self,
        spec: DesiredTraining,
        environment: dict[str, str],
        log_path: Path,
        max_log_bytes: int,
        wall_clock: Callable[[], float],
    ) -> None:
        self.spec = spec
        self.status = RunStatus(spec.job_id, spec.attempt, wall_clock=wall_clock)
        self.output = OutputBuffer()
        self.log_path = log_path
        self._environment = environment
        self._max_log_bytes = max_log_bytes
        self._process: asyncio.subprocess.Process | None = None
        self._stop_reason: str | None = None
        self._finished = asyncio.Event()
        self._log = structlog.get_logger("greenfed.training").bind(
            job_id=spec.job_id, attempt=spec.attempt
        )

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            if not self.status.finished:  # cancelled (agent shutting down) before the end
                await self._terminate(grace_s=0.0)
                self.status.mark_finished("stopped", None, "agent stopped")
            self._finished.set()

    async def _run(self) -> None:
        if not self.spec.command:
            self.status.mark_finished("failed", None, "no command given")
            return
        with BoundedLog(self.log_path, self._max_log_bytes) as log:
            try:
                self._process = await asyncio.create_subprocess_exec(
                    *self.spec.command,
                    env=self._environment,
                    cwd=self.spec.working_dir,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.STDOUT,
                    stdin=asyncio.subprocess.DEVNULL,
                    start_new_session=True,
                )
            except OSError as error:
                self.status.mark_finished("failed", None, f"cannot start: {error}")
                message = f"greenfed: cannot start {self.spec.command[0]}: {error}\n".encode()
                log.write(message)
                self.output.append(message)
                return
            self.status.mark_running()
            self._log.info("training worker started", pid=self._process.pid)
            assert self._process.stdout is not None
            while chunk := await self._process.stdout.read(READ_CHUNK_BYTES):
                log.write(chunk)
                log.flush()
                self.output.append(chunk)
            returncode = await self._process.wait()
        state, reason = describe_exit(returncode, stop_requested=self._stop_reason is not None)
        self.status.mark_finished(state, returncode, self._stop_reason or reason)
        self._log.info("training worker ended", state=state, exit_code=returncode, reason=reason)

    def _signal_group(self, signum: int) -> None:
        if self._process is None or self._process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._process.pid, signum)

    async def _terminate(self, grace_s: float) -> None:
        self._signal_group(signal.SIGTERM)
        if self._process is not None and self._process.returncode is None and grace_s > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace_s):
                    await self._process.wait()
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
        return self.log_dir / f"{job_id}-{attempt}.log"

    def prepare(self, spec: DesiredTraining, environment: dict[str, str]) -> ProcessRun:
        return ProcessRun(
            spec,
            environment,
            self.log_path(spec.job_id, spec.attempt),
            self._max_log_bytes,
            self._wall_clock,
        )
