"""The real launcher: a job's worker as processes that outlive the agent.

Every worker starts the same way (edge/sandbox/launcher.py builds its plan): its
secrets opened from the sealed document, its processes as its work user, sandboxed or
in a container, each in a cgroup with the job's limits. The plan goes to the worker's
wrapper (edge/training/wrapper.py), started in a session of its own with no pipe back
to the agent: the wrapper runs the processes, writes their output to a bounded log
file, which the agent reads on from where it was (edge/training/log_tail.py), and
their outcome to an exit file. An agent that stops, crashes or is restarted leaves the
wrapper running; the next one takes its live workers back (`adopt`:
edge/training/worker_record.py) and collects the status of those that ended while it
was away; a worker gone without a status (the node rebooted) is reported lost.

A run is `starting` until the wrapper says its processes started (the image pulled,
the sandbox made), then `running`. Stopping it sends the wrapper SIGTERM: it stops the
processes itself (SIGTERM, then SIGKILL after the grace period) and still writes the
status; should the wrapper not finish in time, the agent kills everything of the
worker (the wrapper's process group, the worker's cgroups) and cleans up after it.
A stop is noted on disk before the wrapper is signalled (`<name>.stop`, its reason), so
an agent that takes the worker over before it ends reports it stopped as well, never
failed by the SIGTERM it was sent.

Each run keeps its files in the launcher's directory, named for its job and attempt:
`.run` (its record), `.started`, `.exit`, `.stop` and its log (`.log`, `.log.1`). Once
the reconciler is done with a run (it ended, its output was shipped, the cloud no longer
lists it) all of them go but the log; the logs of the newest `KEPT_FINISHED_LOGS` such
runs stay for people to read (at most twice the log bound each), older ones go too.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import msgspec

from edge.sandbox import cgroup_files
from edge.sandbox.cgroups import CgroupError
from edge.sandbox.launcher import Sandbox
from edge.sandbox.users import WorkUserError
from edge.training import wrapper
from edge.training.environment import WorkerSpecError, process_count, unrunnable_reason
from edge.training.launch_plan import ExitStatus, LaunchPlan, Started
from edge.training.log_tail import LogTail
from edge.training.output import OutputBuffer
from edge.training.runs import RejectedRun, RunStatus, TrainingRun
from edge.training.worker_record import (
    WorkerRecord,
    boot_id,
    is_alive,
    load_record,
    process_started,
    save_record,
)
from shared.lean_logs import get_logger
from shared.messages import DesiredTraining, TrainingRunState
from shared.sealing import SealedSecretsError
from shared.worker_env import DEFAULT_VARIABLES
from shared.worker_secrets import open_worker_secrets

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

WRAPPER_SCRIPT = wrapper.__file__
POLL_S = 0.25  # how often the log is read and the worker's liveness checked
RECORD_EVERY_POLLS = 20  # the record's read position is saved this often (5 s)
# How long past its grace period a stopping wrapper may take before it is killed.
STOP_MARGIN_S: Final = 5.0
LOST_REASON = "lost: the worker was not running when the agent started (the node restarted?)"
# Exit codes of the container runtime itself (podman and docker agree on them).
RUNTIME_EXIT_REASONS: Final = {
    125: "the container runtime could not run the image",
    126: "the command cannot be run in the image",
    127: "the command was not found in the image",
}
GIB: Final = 1024**3
# What a full disk makes of the worker's start or end: this node's fault, not the job's.
# Such a run is reported `stopped` (the control plane places the job again, within
# `store.max_attempts`), never `failed` (which uses up the job's own `max_retries`).
FULL_DISK_ERRNOS: Final = frozenset({errno.ENOSPC, errno.EDQUOT})
STATUS_NOT_RECORDED_REASON: Final = "the greenfed wrapper could not record the worker's exit status"
# What the wrapper says on its standard error (a traceback, a status it could not
# write): to the agent's log, at most this much of it per worker, each line cut to
# WRAPPER_LINE_CHARS; after the wrapper exits, its last words are read for this long.
WRAPPER_STDERR_LOGGED_BYTES: Final = 16 * 1024
WRAPPER_LINE_CHARS: Final = 500
WRAPPER_STDERR_GRACE_S: Final = 2.0
WRAPPER_STDERR_CHUNK_BYTES: Final = 4096
# Logs of runs the reconciler is done with that stay on disk for people to read.
KEPT_FINISHED_LOGS: Final = 8


# What the wrapper writes (it writes with the standard library alone), checked here.
STARTED_DECODER: Final = msgspec.json.Decoder(Started)
EXIT_DECODER: Final = msgspec.json.Decoder(ExitStatus)


def read_exit_status(path: Path) -> ExitStatus | None:
    """What the wrapper recorded when the worker ended; None if it recorded nothing."""
    try:
        return EXIT_DECODER.decode(path.read_bytes())
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None


def describe_exit(returncode: int, *, stop_requested: bool) -> tuple[TrainingRunState, str]:
    """(state, reason) for a finished worker. A SIGKILL nobody sent is most often the
    kernel's out-of-memory killer outside any limit of ours, so the reason says so."""
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


def _memory_text(limit_bytes: int | None) -> str:
    if limit_bytes is None:
        return "no limit of its own"
    if limit_bytes >= GIB:
        return f"limit {limit_bytes / GIB:g} GiB"
    return f"limit {limit_bytes / 1024**2:g} MiB"


def describe_status(
    recorded: ExitStatus, *, stop_requested: bool, processes: int, image: str | None
) -> tuple[TrainingRunState, str]:
    """(state, reason) from the wrapper's exit status."""
    if stop_requested:
        return "stopped", ""
    if recorded["error"]:
        return "failed", recorded["error"]
    returncode = recorded["returncode"]
    returncode = returncode if returncode is not None else -signal.SIGKILL
    state: TrainingRunState
    if recorded.get("oom_killed"):
        limit_bytes = recorded.get("memory_limit_bytes")
        state, reason = "failed", f"out of memory: {_memory_text(limit_bytes)}"
    elif image is not None and returncode in RUNTIME_EXIT_REASONS:
        state, reason = "failed", f"exit code {returncode}: {RUNTIME_EXIT_REASONS[returncode]}"
    else:
        state, reason = describe_exit(returncode, stop_requested=False)
    rank = recorded.get("rank")
    if state == "failed" and processes > 1 and rank is not None:
        reason = f"{reason} (rank {rank})"
    return state, reason


@dataclass(frozen=True, slots=True)
class WorkerFiles:
    log_path: Path
    record_path: Path
    exit_path: Path
    started_path: Path
    stop_path: Path  # written when the agent stops the worker: the stop's reason


class ProcessRun:
    outlives_agent = True

    def __init__(
        self,
        spec: DesiredTraining,
        files: WorkerFiles,
        max_log_bytes: int,
        wall_clock: Callable[[], float],
        *,
        make_plan: Callable[[], LaunchPlan] | None = None,
        adopted: WorkerRecord | None = None,
    ) -> None:
        """`make_plan`: builds the worker's launch plan (blocking: it makes directories
        and cgroups); `adopted`: the record of a worker an earlier agent started."""
        self.spec = spec
        self.status = RunStatus(spec.job_id, spec.attempt, wall_clock=wall_clock)
        self.output = OutputBuffer(offset=adopted.output_offset if adopted else 0)
        self.files = files
        self._make_plan = make_plan
        self._max_log_bytes = max_log_bytes
        self._tail = LogTail(files.log_path, adopted.tail if adopted else None)
        self._record = adopted
        self._process: asyncio.subprocess.Process | None = None  # None: not our child
        self._exited: asyncio.Task[int] | None = None
        self._started_notice: asyncio.Future[bytes] | None = None  # our child's "started"
        self._wrapper_stderr: asyncio.Future[None] | None = None  # read into the agent's log
        self._wrapper_last_line = ""  # the last line the wrapper wrote on its stderr
        self._wrapper_logged_bytes = 0
        self._stop_reason: str | None = None
        self._finished = asyncio.Event()
        self._log = get_logger("greenfed.training").bind(job_id=spec.job_id, attempt=spec.attempt)
        if adopted is not None:
            # It is running already (or ended while no agent watched): no new "started".
            started = _started_at(files.started_path)
            if started is not None or adopted.protocol == 1:
                self.status.state = "running"
                self.status.started_at = started or adopted.started_at

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
            if self._wrapper_stderr is not None and not self._wrapper_stderr.done():
                self._wrapper_stderr.cancel()  # the wrapper lives on: nobody reads it now
                await asyncio.wait({self._wrapper_stderr})
            if self.status.finished:
                self.output.end()  # no more of it: what waits for the rest of a character goes
            self._finished.set()

    async def _start(self) -> bool:
        files = self.files
        if not self.spec.command:
            self.status.mark_finished("failed", None, "no command given")
            return False
        assert self._make_plan is not None, "an adopted run is never started"
        files.log_path.parent.mkdir(parents=True, exist_ok=True)
        for stale in (files.exit_path, files.record_path, files.started_path, files.stop_path):
            stale.unlink(missing_ok=True)
        try:
            plan = await asyncio.to_thread(self._make_plan)
        except (WorkerSpecError, WorkUserError, CgroupError, OSError) as error:
            if isinstance(error, OSError) and error.errno in FULL_DISK_ERRNOS:
                # Its work directory, say, on a full disk: the job may run elsewhere.
                self.status.mark_finished("stopped", None, f"cannot start on this node: {error}")
            else:
                self.status.mark_finished("failed", None, f"cannot start: {error}")
            return False
        if self._stop_reason is not None:  # withdrawn while it was being prepared
            await asyncio.to_thread(
                _clean_up_after,
                tuple(plan["cgroup_dirs"]),
                tuple(tuple(argv) for argv in plan["cleanup"]),
                tuple(plan["remove_paths"]),
                "",
            )
            self.status.mark_finished("stopped", None, self._stop_reason)
            return False
        try:
            self._process = await asyncio.create_subprocess_exec(
                sys.executable,
                # Isolated (-I) and by path: the wrapper's own imports come from greenfed,
                # never from a package of the same name in some working directory.
                "-I",
                WRAPPER_SCRIPT,
                "--log",
                str(files.log_path),
                "--max-log-bytes",
                str(self._max_log_bytes),
                "--exit-file",
                str(files.exit_path),
                env=dict(DEFAULT_VARIABLES),
                cwd="/",
                stdin=asyncio.subprocess.PIPE,
                # One line, "started", as soon as its processes are: `running` at once.
                stdout=asyncio.subprocess.PIPE,
                # What goes wrong with the wrapper itself: to this agent's log.
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as error:
            await asyncio.to_thread(
                _clean_up_after,
                tuple(plan["cgroup_dirs"]),
                tuple(tuple(argv) for argv in plan["cleanup"]),
                tuple(plan["remove_paths"]),
                "",
            )
            self.status.mark_finished("failed", None, f"cannot start: {error}")
            return False
        self._exited = asyncio.ensure_future(self._process.wait())
        assert self._process.stdout is not None
        self._started_notice = asyncio.ensure_future(self._process.stdout.readline())
        assert self._process.stderr is not None
        self._wrapper_stderr = asyncio.ensure_future(
            self._read_wrapper_stderr(self._process.stderr)
        )
        pid = self._process.pid
        self._record = WorkerRecord(
            job_id=self.spec.job_id,
            attempt=self.spec.attempt,
            pid=pid,
            process_started=process_started(pid) or 0.0,
            boot_id=boot_id(),
            started_at=self.status.wall_clock(),
            grace_period_s=self.spec.grace_period_s,
            protocol=2,
            started_file=str(files.started_path),
            processes=len(plan["processes"]),
            image=self.spec.image,
            cgroup_dirs=tuple(plan["cgroup_dirs"]),
            cleanup=tuple(tuple(argv) for argv in plan["cleanup"]),
            remove_paths=tuple(plan["remove_paths"]),
        )
        self._save_record()
        if self._stop_requested():
            # Withdrawn while the wrapper was being spawned: the stop found nothing to
            # signal then. The plan never reaches it, so none of the worker's processes
            # ever starts; following it collects the wrapper and cleans up after it.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            assert self._process.stdin is not None
            self._process.stdin.close()
            self._log.info("training worker withdrawn as it was launched", pid=pid)
            return True
        await self._hand_over(plan)
        self._log.info("training worker launched", pid=pid, processes=len(plan["processes"]))
        return True

    def _stop_requested(self) -> bool:
        """Whether stop() was called (a method: a stop may come at any await)."""
        return self._stop_reason is not None

    async def _hand_over(self, plan: LaunchPlan) -> None:
        """The plan, on the wrapper's standard input (it holds secrets: never on disk)."""
        assert self._process is not None
        assert self._process.stdin is not None
        stdin = self._process.stdin
        with contextlib.suppress(ConnectionError, OSError):
            stdin.write(msgspec.json.encode(plan))
            await stdin.drain()
        stdin.close()
        with contextlib.suppress(ConnectionError, OSError):
            await stdin.wait_closed()

    async def _read_wrapper_stderr(self, stream: asyncio.StreamReader) -> None:
        """Until the wrapper closes it (it exits): each line to the agent's log while
        the bound lasts, the last one kept (the reason, should the wrapper fail)."""
        pending = b""
        while chunk := await stream.read(WRAPPER_STDERR_CHUNK_BYTES):
            *lines, pending = (pending + chunk).split(b"\n")
            pending = pending[:WRAPPER_STDERR_CHUNK_BYTES]  # a line that never ends: its start
            for line in lines:
                self._wrapper_said(line)
        self._wrapper_said(pending)

    def _wrapper_said(self, line: bytes) -> None:
        text = line.decode("utf-8", "replace").strip()[:WRAPPER_LINE_CHARS]
        if not text:
            return
        self._wrapper_last_line = text
        if self._wrapper_logged_bytes < WRAPPER_STDERR_LOGGED_BYTES:
            self._wrapper_logged_bytes += len(text)
            self._log.warning("training worker's wrapper said", line=text)

    def _running(self) -> bool:
        if self._process is not None:
            return self._process.returncode is None
        record = self._record
        return record is not None and is_alive(record.pid, record.process_started, record.boot_id)

    async def _pause(self) -> None:
        if self._exited is not None:
            waiting: set[asyncio.Future[Any]] = {self._exited}
            notice = self._started_notice
            if notice is not None and not notice.done():
                waiting.add(notice)
            await asyncio.wait(waiting, timeout=POLL_S, return_when=asyncio.FIRST_COMPLETED)
        else:
            await asyncio.sleep(POLL_S)

    async def _follow(self) -> None:
        polls = 0
        while self._running():
            self._read_output()
            self._note_started()
            polls += 1
            if polls % RECORD_EVERY_POLLS == 0:
                self._save_record()
            await self._pause()
        while self._read_output():
            pass  # the rest of what it printed
        self._note_started()
        await self._finish()

    def _note_started(self) -> None:
        if self.status.state != "starting":
            return
        started = _started_at(self.files.started_path)
        if started is not None:
            self.status.mark_running(at=started)
        elif self._said_started():
            # No started file (a full disk): the wrapper's "started" line is as good.
            self.status.mark_running()

    def _said_started(self) -> bool:
        notice = self._started_notice
        if notice is None or not notice.done() or notice.cancelled():
            return False
        return notice.exception() is None and notice.result() == b"started\n"

    def _read_output(self) -> bool:
        data = self._tail.read()
        if data:
            self.output.append(data)
        return bool(data)

    async def _finish(self) -> None:
        if self._wrapper_stderr is not None:  # its last words, before they are judged
            await asyncio.wait({self._wrapper_stderr}, timeout=WRAPPER_STDERR_GRACE_S)
        stop_reason = self._stop_reason
        if stop_reason is None:  # an earlier agent may have stopped it, then ended
            stop_reason = read_stop_reason(self.files.stop_path)
        stop_requested = stop_reason is not None
        recorded = read_exit_status(self.files.exit_path)
        record = self._record
        processes = record.processes if record is not None else process_count(self.spec)
        if recorded is not None:
            state, reason = describe_status(
                recorded,
                stop_requested=stop_requested,
                processes=processes,
                image=record.image if record is not None else self.spec.image,
            )
            self.status.mark_finished(state, recorded["returncode"], stop_reason or reason)
        else:
            # The wrapper was killed before it could say: nothing of the worker may stay.
            if record is not None and record.protocol >= 2:
                await asyncio.to_thread(
                    _clean_up_after,
                    record.cgroup_dirs,
                    record.cleanup,
                    record.remove_paths,
                    # Process ids of another boot name other processes now.
                    record.started_file if _this_boot(record) else "",
                )
            returncode = self._process.returncode if self._process is not None else None
            if stop_requested:
                self.status.mark_finished("stopped", returncode, stop_reason or "")
            elif returncode is not None and returncode > 0:
                # The wrapper's own exit (it exits 0 once the status is recorded), which
                # says nothing of the worker's: a fault of this node, not the job's.
                self.status.mark_finished("stopped", None, self._wrapper_failure(returncode))
            elif returncode is not None:
                state, reason = describe_exit(returncode, stop_requested=False)
                self.status.mark_finished(state, returncode, reason)
            else:
                self.status.mark_finished("stopped", None, LOST_REASON)
        self._log.info(
            "training worker ended",
            state=self.status.state,
            exit_code=self.status.exit_code,
            reason=self.status.reason,
        )

    def _wrapper_failure(self, returncode: int) -> str:
        said = self._wrapper_last_line or "it gave no reason"
        if returncode == wrapper.STATUS_NOT_RECORDED_EXIT_CODE:
            return f"{STATUS_NOT_RECORDED_REASON}: {said}"
        return (
            f"the greenfed wrapper failed (exit code {returncode}) before it recorded "
            f"the worker's exit status: {said}"
        )

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

    async def _wait_until(self, deadline: float) -> None:
        while self._running() and time.monotonic() < deadline:
            await self._pause()

    async def stop(self, reason: str) -> None:
        if self.status.finished:
            return
        self._stop_reason = reason
        record = self._record
        grace_s = self.spec.grace_period_s
        if record is not None:
            self._note_stop(reason)
        if record is not None and record.protocol >= 2:
            # The wrapper stops its processes itself and still writes their status.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if self._running():
                    os.kill(record.pid, signal.SIGTERM)
            await self._wait_until(time.monotonic() + grace_s + STOP_MARGIN_S)
            if self._running():
                # Its processes go with it (_finish cleans up after a wrapper gone silent).
                self._log.warning("training worker's wrapper did not stop: killing it")
                self._signal_group(signal.SIGKILL)
        else:
            self._signal_group(signal.SIGTERM)
            await self._wait_until(time.monotonic() + grace_s)
            self._signal_group(signal.SIGKILL)
        await self._finished.wait()

    def _note_stop(self, reason: str) -> None:
        """The stop, on disk before the wrapper hears of it: should this agent end
        before the worker does, the next one takes a stop for a stop."""
        with contextlib.suppress(OSError):
            self.files.stop_path.write_text(reason, encoding="utf-8")


def read_stop_reason(path: Path) -> str | None:
    """Why an agent stopped the worker; None: no agent asked it to stop."""
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def read_started(path: Path) -> Started | None:
    """What the wrapper wrote once the worker's processes started (None: not yet)."""
    try:
        return STARTED_DECODER.decode(path.read_bytes())
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None


def _started_at(path: Path) -> float | None:
    started = read_started(path)
    return started["started_at"] if started is not None else None


def _this_boot(record: WorkerRecord) -> bool:
    """Whether the record's worker started in this boot (unknown: no)."""
    current = boot_id()
    return bool(current) and record.boot_id == current


def _left_behind(record: WorkerRecord) -> bool:
    """Whether a worker whose wrapper is gone left anything to clean up after it: its
    cgroups (and whatever still runs in them) or its work directory. A wrapper that
    ended by itself removed them; an agent that cleaned up after one did too."""
    if record.protocol < 2:
        return False  # an old record does not say what its worker left
    return any(os.path.lexists(path) for path in (*record.cgroup_dirs, *record.remove_paths))


def _clean_up_after(
    cgroup_dirs: tuple[str, ...],
    cleanup: tuple[tuple[str, ...], ...],
    remove_paths: tuple[str, ...],
    started_file: str,
) -> None:
    """What a wrapper that was killed could not do: kill what the worker left (its
    cgroups; its processes' groups where it has none), remove its containers, cgroups
    and work directory (idempotent)."""
    started = read_started(Path(started_file)) if started_file else None
    for group in started["process_groups"] if started is not None else ():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
    if cgroup_dirs:
        cgroup_files.kill_all_and_wait(cgroup_dirs)
    for argv in cleanup:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(argv, capture_output=True, timeout=60, check=False)
    with contextlib.suppress(OSError):
        cgroup_files.remove_groups(cgroup_dirs)
    wrapper.remove_paths(remove_paths)


class ProcessLauncher:
    def __init__(
        self,
        log_dir: Path,
        *,
        sandbox: Sandbox,
        node_id: str = "",
        sealing_key: X25519PrivateKey | None = None,
        max_log_bytes: int = 10 * 1024 * 1024,
        wall_clock: Callable[[], float] = time.time,
        kept_finished_logs: int = KEPT_FINISHED_LOGS,
    ) -> None:
        """`sandbox`: how this node runs workers (edge/sandbox/launcher.py);
        `sealing_key`: this node's, which opens the secrets sealed to it;
        `kept_finished_logs`: how many logs of forgotten runs stay on disk."""
        self.log_dir = log_dir
        self.sandbox = sandbox
        self._node_id = node_id
        self._sealing_key = sealing_key
        self._max_log_bytes = max_log_bytes
        self._wall_clock = wall_clock
        self._kept_finished_logs = kept_finished_logs
        # Runs handed out and not forgotten: their files are theirs, record or not yet.
        self._handed_out: set[str] = set()

    def log_path(self, job_id: str, attempt: int) -> Path:
        return self.files(job_id, attempt).log_path

    @staticmethod
    def run_name(job_id: str, attempt: int) -> str:
        return f"{job_id}-{attempt}"

    def files(self, job_id: str, attempt: int) -> WorkerFiles:
        name = self.run_name(job_id, attempt)
        return WorkerFiles(
            self.log_dir / f"{name}.log",
            self.log_dir / f"{name}.run",
            self.log_dir / f"{name}.exit",
            self.log_dir / f"{name}.started",
            self.log_dir / f"{name}.stop",
        )

    def prepare(self, spec: DesiredTraining) -> TrainingRun:
        refusal = unrunnable_reason(spec, self.sandbox.inventory) or self.sandbox.refusal(spec)
        if refusal:
            return RejectedRun(spec, refusal)
        try:
            secrets = open_worker_secrets(spec, self._sealing_key, self._node_id)
        except SealedSecretsError as error:
            return RejectedRun(spec, f"cannot start: {error}")
        files = self.files(spec.job_id, spec.attempt)

        def make_plan() -> LaunchPlan:
            return self.sandbox.plan(
                spec,
                secrets,
                name=self.run_name(spec.job_id, spec.attempt),
                started_file=files.started_path,
            )

        self._handed_out.add(self.run_name(spec.job_id, spec.attempt))
        return ProcessRun(spec, files, self._max_log_bytes, self._wall_clock, make_plan=make_plan)

    def leftovers(self, claimed: Collection[tuple[str, int]]) -> list[ProcessRun]:
        """Workers an earlier agent started that nothing here claims (withdrawn while
        no agent ran, say): runs to stop, taken back from their records. Those whose
        wrapper is alive, and those of this boot whose wrapper died without cleaning
        up (killed while no agent ran): their processes may run on in their cgroups,
        which following the run kills and removes, with the work directory."""
        found = []
        for path in sorted(self.log_dir.glob("*.run")):
            record = load_record(path)
            if record is None or (record.job_id, record.attempt) in claimed:
                continue
            files = self.files(record.job_id, record.attempt)
            alive = is_alive(record.pid, record.process_started, record.boot_id)
            # A wrapper that wrote the worker's status cleaned up after it itself.
            killed = _this_boot(record) and not files.exit_path.exists()
            if not alive and not (killed and _left_behind(record)):
                continue
            spec = DesiredTraining(
                job_id=record.job_id,
                attempt=record.attempt,
                grace_period_s=record.grace_period_s,
            )
            found.append(
                ProcessRun(spec, files, self._max_log_bytes, self._wall_clock, adopted=record)
            )
            self._handed_out.add(self.run_name(record.job_id, record.attempt))
        return found

    def adopt(self, spec: DesiredTraining) -> ProcessRun | None:
        """The run of this worker an earlier agent started, if it left a record."""
        files = self.files(spec.job_id, spec.attempt)
        record = load_record(files.record_path)
        if record is None or (record.job_id, record.attempt) != (spec.job_id, spec.attempt):
            return None
        self._handed_out.add(self.run_name(spec.job_id, spec.attempt))
        return ProcessRun(spec, files, self._max_log_bytes, self._wall_clock, adopted=record)

    def forget(self, job_id: str, attempt: int) -> None:
        """The reconciler is done with this run (it ended, its output was shipped, the
        cloud no longer lists it): its files go, but for its log, kept among the newest
        `kept_finished_logs` of runs forgotten."""
        self._handed_out.discard(self.run_name(job_id, attempt))
        files = self.files(job_id, attempt)
        for path in (files.record_path, files.exit_path, files.started_path, files.stop_path):
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
        self._remove_old_logs()

    def _remove_old_logs(self) -> None:
        """Logs of forgotten runs (no record beside them, not handed out) beyond the
        newest `kept_finished_logs`, by when they were last written."""
        forgotten: list[tuple[float, Path]] = []
        with contextlib.suppress(OSError):
            for log in self.log_dir.glob("*.log"):
                name = log.name.removesuffix(".log")
                if name in self._handed_out or log.with_name(f"{name}.run").exists():
                    continue  # a run of this agent's, or one a later agent takes back
                with contextlib.suppress(OSError):
                    forgotten.append((log.stat().st_mtime, log))
        forgotten.sort(reverse=True)
        for _, log in forgotten[self._kept_finished_logs :]:
            for path in (log, log.with_name(f"{log.name}.1")):
                with contextlib.suppress(OSError):
                    path.unlink(missing_ok=True)
