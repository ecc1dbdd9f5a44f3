"""The process a training worker runs under, so that it outlives the agent:

    python -I .../edge/training/wrapper.py --log PATH --max-log-bytes N --exit-file PATH

The agent starts it in a session of its own and writes the worker's `LaunchPlan`
(edge/training/launch_plan.py) to its standard input, then lets go of it (the wrapper
says "started" once on its standard output and closes it). The wrapper:

1. makes the image present, when the worker runs in one (its output goes to the log);
2. starts each process of the worker as the plan says: its own process group, its
   cgroups joined before it execs, so that everything it starts stays inside, and
   writes the started file;
3. copies their output (stdout and stderr together) to the bounded log, each line
   labelled with its rank when there are several;
4. waits: when one process fails, or the agent sends SIGTERM (a stop), the others get
   SIGTERM, then SIGKILL once the grace period is over. A gang does not limp on
   without one of its workers;
5. when every process has ended, kills what they left in their cgroups (or process
   groups), reads whether the kernel killed one for memory, removes containers,
   cgroups and the work directory, and writes the exit status, atomically, to the exit
   file, where an agent started later collects it.

SIGTERM and SIGINT are the agent's "stop"; the wrapper never dies of them itself, so
the status is always written. A full disk costs output, never the run: the log drops
what it cannot write, the started file is only a fallback (the "started" line is what
the agent that started the wrapper goes by), and an exit status that cannot be written
after a few tries ends the wrapper with `STATUS_NOT_RECORDED_EXIT_CODE`, the error on
its standard error, which the agent reports as this node's fault, not the job's. The
wrapper exits 0 whenever it recorded the status: any other exit is its own failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import IO, cast

# What a worker's start waits for: the standard library, atomic file writes and the
# cgroups' file operations only (a serialization library's import would double the
# wrapper's start).
from edge.atomic_files import write_atomically
from edge.sandbox import cgroup_files as cgroups
from edge.training.launch_plan import ExitStatus, LaunchPlan, PrepareStep, Started
from edge.training.logs import BoundedLog
from edge.training.output import character_start

READ_CHUNK_BYTES = 64 * 1024
# After the processes exit, what they printed last is read for at most this long.
OUTPUT_GRACE_S = 2.0
CLEANUP_TIMEOUT_S = 60.0
# Peak memory this close to the limit counts as having reached it (page granularity).
LIMIT_REACHED_MARGIN_BYTES = 64 * 1024
SIGKILL_CODES = (-signal.SIGKILL, 128 + signal.SIGKILL)
# The wrapper's exit code when the worker's exit status could not be written (a full
# disk): the agent (edge/training/process.py) reads the error from its standard error.
# sysexits' EX_IOERR: neither Python (1, 2, 120) nor a signal (128 + n) exits with it.
STATUS_NOT_RECORDED_EXIT_CODE = 74
# A full disk may get room back (the clean-up just removed the work directory, a log
# rotated elsewhere): the status is tried again after each of these, then given up.
EXIT_STATUS_RETRY_DELAYS_S = (0.1, 0.25, 0.5, 1.0)


def write_exit_status(path: Path, status: ExitStatus) -> None:
    write_atomically(path, json.dumps(status).encode("utf-8"))


def record_exit_status(
    path: Path, status: ExitStatus, *, pause: Callable[[float], None] = time.sleep
) -> OSError | None:
    """Write the status, trying again for a moment while the disk refuses it; the
    last error when it never could (None: written)."""
    for delay_s in EXIT_STATUS_RETRY_DELAYS_S:
        try:
            write_exit_status(path, status)
            return None
        except OSError:
            pause(delay_s)
    try:
        write_exit_status(path, status)
    except OSError as error:
        return error
    return None


def tell_the_agent(text: str) -> None:
    """A line on standard error, which the agent that started the wrapper logs (gone,
    it hears nothing: the wrapper outlives it)."""
    with contextlib.suppress(OSError):
        os.write(sys.stderr.fileno(), f"{text}\n".encode(errors="replace"))


def _exit_status(
    returncode: int | None,
    *,
    error: str = "",
    rank: int | None = None,
    oom_killed: bool = False,
    memory_limit_bytes: int | None = None,
) -> ExitStatus:
    return ExitStatus(
        returncode=returncode,
        error=error,
        finished_at=time.time(),
        rank=rank,
        oom_killed=oom_killed,
        memory_limit_bytes=memory_limit_bytes,
    )


class _Log:
    """The bounded log, shared by the readers of every process; None: it could not be
    opened (a disk out of space or inodes), and the output goes nowhere."""

    def __init__(self, log: BoundedLog | None) -> None:
        self._log = log
        self._lock = threading.Lock()

    def write(self, data: bytes) -> None:
        # A full disk loses output, never the job: the pipes are always drained. A
        # rotation that could not open the new file leaves the log closed (ValueError
        # from then on): the rest of the output is lost, the worker runs on.
        if self._log is None:
            return
        with self._lock, contextlib.suppress(OSError, ValueError):
            self._log.write(data)
            self._log.flush()

    def say(self, text: str) -> None:
        self.write(f"greenfed: {text}\n".encode())


def _copy(output: IO[bytes], log: _Log, label: bytes, last: list[bytes]) -> None:
    """Everything a process prints, to the log; `label` before each line (if any).

    A labelled line is held until its end, but never more than READ_CHUNK_BYTES of it:
    the wrapper runs as root outside the worker's memory limit, and the log rotates
    only between writes, so a line that never ends is written in labelled pieces."""
    pending = b""  # the start of a line: no line break in it
    while chunk := os.read(output.fileno(), READ_CHUNK_BYTES):
        if chunk.strip():
            last[:] = [chunk.strip().splitlines()[-1]]
        if not label:
            log.write(chunk)
            continue
        *ended, rest = chunk.split(b"\n")  # only what is new can hold a line's end
        if ended:
            ended[0] = pending + ended[0]
            log.write(b"".join(label + line + b"\n" for line in ended))
            pending = rest
        else:
            pending += rest
        while len(pending) >= READ_CHUNK_BYTES:
            cut = character_start(pending, READ_CHUNK_BYTES)
            log.write(label + pending[:cut] + b"\n")
            pending = pending[cut:]
    if label and pending:
        log.write(label + pending + b"\n")


class _Wakeups:
    """Signals as events the main loop waits for: SIGTERM and SIGINT ask for a stop,
    SIGCHLD says a process ended."""

    def __init__(self) -> None:
        self.stop_requested = False
        self._reader, self._writer = os.pipe()  # the writer stays open: the wakeup fd
        os.set_blocking(self._reader, False)
        os.set_blocking(self._writer, False)
        signal.set_wakeup_fd(self._writer, warn_on_full_buffer=False)
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        signal.signal(signal.SIGCHLD, self._child)

    def _stop(self, signum: int, frame: object) -> None:
        self.stop_requested = True

    def _child(self, signum: int, frame: object) -> None:
        """The wakeup fd is what wakes the loop."""

    def wait(self, timeout_s: float | None) -> None:
        select.select([self._reader], [], [], timeout_s)
        with contextlib.suppress(BlockingIOError):
            while os.read(self._reader, 4096):
                pass


class _Supervisor:
    def __init__(self, plan: LaunchPlan, log: _Log, wakeups: _Wakeups) -> None:
        self.plan = plan
        self.log = log
        self.wakeups = wakeups
        self.processes: list[subprocess.Popen[bytes]] = []
        self.readers: list[threading.Thread] = []
        self.killed_by_us = False

    # ---- before the processes ----------------------------------------------------------

    def prepare(self) -> str:
        """Run the plan's steps; "" when all are done, else why the worker cannot start."""
        try:
            for step in self.plan["prepare"]:
                if self.wakeups.stop_requested:
                    return ""
                failure = self._step(step)
                if failure:
                    return failure
            return ""
        finally:
            remove_paths(self.plan["remove_after_prepare"])

    def _step(self, step: PrepareStep) -> str:
        if step["check"] and _quietly(step["check"], step["env"]) == 0:
            return ""
        if not step["run"]:
            return step["error"]
        last: list[bytes] = []
        try:
            process = subprocess.Popen(
                step["run"],
                env=step["env"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                process_group=0,
            )
        except OSError as error:
            return f"{step['error']}: {error}"
        except ValueError as error:  # a NUL byte: no program can be given it
            return f"{step['error']}: {_unpassable(error)}"
        assert process.stdout is not None
        reader = threading.Thread(target=_copy, args=(process.stdout, self.log, b"", last))
        reader.start()
        while process.poll() is None:
            if self.wakeups.stop_requested:
                _signal_group(process.pid, signal.SIGKILL)
            self.wakeups.wait(1.0)
        reader.join()
        if process.returncode == 0 or self.wakeups.stop_requested:
            return ""
        detail = last[0].decode("utf-8", "replace")[:300] if last else "no output"
        return f"{step['error']}: {detail}"

    # ---- the processes -------------------------------------------------------------------

    def start(self) -> str:
        """Start every process; "" when all started, else why not (those that did
        are killed)."""
        for process in self.plan["processes"]:
            procs_files = process["cgroup_procs"]
            try:
                self.processes.append(
                    subprocess.Popen(
                        process["argv"],
                        env=process["env"],
                        cwd=process["cwd"],
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                        process_group=0,
                        # Safe here: no thread runs yet (readers start after the last).
                        preexec_fn=(lambda files=procs_files: cgroups.join(files))
                        if procs_files
                        else None,
                    )
                )
            except (OSError, subprocess.SubprocessError) as error:
                self._kill_everything()
                return f"cannot start: {error}"
            except ValueError as error:  # a NUL byte: no program can be given it
                self._kill_everything()
                return f"cannot start: {_unpassable(error)}"
        self._write_started_file(
            Started(started_at=time.time(), process_groups=[p.pid for p in self.processes])
        )
        _tell_the_agent_it_started()
        label_output = self.plan["label_output"]
        for planned, started in zip(self.plan["processes"], self.processes, strict=True):
            assert started.stdout is not None
            label = f"[rank {planned['rank']}] ".encode() if label_output else b""
            reader = threading.Thread(
                target=_copy, args=(started.stdout, self.log, label, []), daemon=True
            )
            reader.start()
            self.readers.append(reader)
        return ""

    def _write_started_file(self, notice: Started) -> None:
        """For an agent started later, and what it kills should the wrapper be gone;
        the agent that started the wrapper goes by its "started" line. A disk that
        refuses it costs only that: the processes run on."""
        path = Path(self.plan["started_file"])
        try:
            path.write_text(json.dumps(notice), encoding="utf-8")
        except OSError as error:
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)  # half a notice is none: never a wrong one
            tell_the_agent(f"greenfed wrapper: cannot write the started file {path}: {error}")

    def wait(self) -> int | None:
        """Until every process has ended; the index of the first to fail (None: none)."""
        live = dict(enumerate(self.processes))
        first_failure: int | None = None
        terminate_by: float | None = None
        while live:
            for index, process in list(live.items()):
                if process.poll() is None:
                    continue
                del live[index]
                # The first to fail on its own, not one stopped with the others.
                if (
                    process.returncode != 0
                    and first_failure is None
                    and terminate_by is None
                    and not self.wakeups.stop_requested
                ):
                    first_failure = index
            if not live:
                break
            if terminate_by is None and (self.wakeups.stop_requested or first_failure is not None):
                if first_failure is not None:
                    rank = self.plan["processes"][first_failure]["rank"]
                    self.log.say(f"rank {rank} failed: stopping the others")
                self._terminate(live.values())
                terminate_by = time.monotonic() + self.plan["grace_period_s"]
            timeout_s = None
            if terminate_by is not None and not self.killed_by_us:
                timeout_s = terminate_by - time.monotonic()
                if timeout_s <= 0:
                    self._kill_everything()
                    timeout_s = None
            self.wakeups.wait(timeout_s)
        return first_failure

    def _terminate(self, processes: Iterable[subprocess.Popen[bytes]]) -> None:
        """SIGTERM to the worker's processes (their process groups, everything in their
        cgroups), never to a sandbox's outer bubblewrap: it would die of it, and its
        sandbox at once with it (--die-with-parent), grace period or not. The job in
        the sandbox is in the same cgroup (a sandbox always has one) and gets it there;
        the sandbox's init ignores it (a PID namespace's init takes from outside only
        the signals it handles) and ends when the job does."""
        outer_bubblewraps = {
            started.pid
            for planned, started in zip(self.plan["processes"], self.processes, strict=False)
            if planned.get("sandboxed", False)
        }
        for process in processes:
            if process.pid not in outer_bubblewraps:
                _signal_group(process.pid, signal.SIGTERM)
        cgroups.signal_all(self.plan["cgroup_dirs"], signal.SIGTERM, sparing=outer_bubblewraps)

    def _kill_everything(self) -> None:
        self.killed_by_us = True
        for process in self.processes:
            _signal_group(process.pid, signal.SIGKILL)
        cgroups.signal_all(self.plan["cgroup_dirs"], signal.SIGKILL)

    # ---- after -------------------------------------------------------------------------

    def finish(self) -> None:
        """Nothing of the worker may outlive it: what its processes left running (in
        their cgroups, else their process groups) is killed; output read to the end."""
        if self.plan["cgroup_dirs"]:
            cgroups.kill_all_and_wait(self.plan["cgroup_dirs"])
        for process in self.processes:
            _signal_group(process.pid, signal.SIGKILL)
        deadline = time.monotonic() + OUTPUT_GRACE_S
        for reader in self.readers:
            reader.join(timeout=max(0.0, deadline - time.monotonic()))

    def out_of_memory(self, index: int) -> bool:
        plan = self.plan["processes"][index]
        returncode = self.processes[index].returncode
        oom_file, peak_file = plan["oom_file"], plan["memory_peak_file"]
        if oom_file and cgroups.oom_kills(oom_file) > 0:
            return True
        if returncode in SIGKILL_CODES and not self.killed_by_us:
            limit = plan["memory_limit_bytes"]
            if (
                peak_file is not None
                and limit is not None
                and cgroups.memory_peak(peak_file) >= limit - LIMIT_REACHED_MARGIN_BYTES
            ):
                return True
            if plan["oom_query"]:
                return _output(plan["oom_query"], plan["env"]).strip() == "true"
        return False

    def clean_up(self) -> None:
        for argv in self.plan["cleanup"]:
            _quietly(argv, dict(os.environ))
        with contextlib.suppress(OSError):
            cgroups.remove_groups(self.plan["cgroup_dirs"])
        remove_paths(self.plan["remove_paths"])

    def status(self, first_failure: int | None) -> ExitStatus:
        if first_failure is None:
            codes = [process.returncode for process in self.processes]
            return _exit_status(next((code for code in codes if code != 0), 0))
        plan = self.plan["processes"][first_failure]
        return _exit_status(
            self.processes[first_failure].returncode,
            rank=plan["rank"],
            oom_killed=self.out_of_memory(first_failure),
            memory_limit_bytes=plan["memory_limit_bytes"],
        )


def _tell_the_agent_it_started() -> None:
    """One line on standard output, the agent's pipe (if it still listens), which is
    then let go: the wrapper outlives the agent, so it holds nothing of it."""
    with contextlib.suppress(OSError):
        os.write(sys.stdout.fileno(), b"started\n")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _unpassable(error: ValueError) -> str:
    """Why a command line or environment could not be handed to a program: the kernel
    takes them as C strings, which a NUL byte would cut short (a job's command, env or
    secret_env may hold one)."""
    return f"its command or environment holds what no program can be given ({error})"


def _signal_group(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)


def _quietly(argv: Sequence[str], env: dict[str, str]) -> int | None:
    try:
        return subprocess.run(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=CLEANUP_TIMEOUT_S,
            check=False,
        ).returncode
    except (OSError, subprocess.TimeoutExpired):
        return None


def _output(argv: Sequence[str], env: dict[str, str]) -> str:
    try:
        return subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=CLEANUP_TIMEOUT_S, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def remove_paths(paths: Sequence[str]) -> None:
    """Remove files and directory trees (gone already is fine)."""
    import shutil  # once the worker is over: not on its start's path

    for text in paths:
        path = Path(text)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError, OSError):
                path.unlink()


def supervise(plan: LaunchPlan, log: _Log, wakeups: _Wakeups) -> ExitStatus:
    supervisor = _Supervisor(plan, log, wakeups)
    try:
        failure = supervisor.prepare()
        if not failure and not supervisor.wakeups.stop_requested:
            failure = supervisor.start()
        first_failure = supervisor.wait() if supervisor.processes and not failure else None
        supervisor.finish()
        if failure:
            log.say(failure)
            return _exit_status(None, error=failure)
        if not supervisor.processes:  # stopped before it started
            return _exit_status(None)
        # Before the clean-up: it removes the cgroups that counted the kills.
        return supervisor.status(first_failure)
    finally:
        supervisor.clean_up()


def _arguments(argv: Sequence[str]) -> tuple[Path, int, Path]:
    """--log PATH --max-log-bytes N --exit-file PATH (parsed by hand: argparse's import
    alone would cost a worker's start a few milliseconds)."""
    values = dict(zip(argv[::2], argv[1::2], strict=False))
    try:
        return Path(values["--log"]), int(values["--max-log-bytes"]), Path(values["--exit-file"])
    except (KeyError, ValueError):
        sys.exit("usage: wrapper.py --log PATH --max-log-bytes N --exit-file PATH")


def _open_log(path: Path, max_bytes: int) -> BoundedLog | None:
    try:
        return BoundedLog(path, max_bytes)
    except OSError as error:  # a disk out of space or inodes: the run goes on without
        tell_the_agent(f"greenfed wrapper: cannot open the log {path}: {error}")
        return None


def _outcome(status: ExitStatus) -> str:
    """How the worker ended, in a few words, for the agent's log."""
    if status["error"]:
        return status["error"]
    return f"exit code {status['returncode']}"


def main(argv: list[str] | None = None) -> int:
    log_path, max_log_bytes, exit_file = _arguments(sys.argv[1:] if argv is None else argv)
    # Before anything else: a stop that comes early is a stop, never the wrapper's death.
    wakeups = _Wakeups()
    bounded = _open_log(log_path, max_log_bytes)
    with bounded if bounded is not None else contextlib.nullcontext():
        log = _Log(bounded)
        try:
            # From the agent, which built it (edge/sandbox/launcher.py): not checked again.
            plan = cast(LaunchPlan, json.loads(sys.stdin.buffer.read()))
        except (ValueError, OSError) as error:
            log.say(f"cannot start: the launch plan is unreadable ({error})")
            status = _exit_status(None, error=f"bad launch plan: {error}")
        else:
            status = supervise(plan, log, wakeups)
    not_recorded = record_exit_status(exit_file, status)
    if not_recorded is not None:
        # Two lines: what the worker did, for the agent's log; the error last, which
        # the agent gives as the reason.
        tell_the_agent(
            f"greenfed wrapper: the worker ended ({_outcome(status)}), "
            f"but its exit status could not be written to {exit_file}:"
        )
        tell_the_agent(str(not_recorded))
        return STATUS_NOT_RECORDED_EXIT_CODE
    return 0


if __name__ == "__main__":
    sys.exit(main())
