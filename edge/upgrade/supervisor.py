"""The upgrade supervisor: the process `greenfed edge run` becomes, which runs the agent
as its child, in the version `agent-versions/` says (edge/upgrade/versions.py), and
takes it back to the version it ran when a new one does not announce itself in time.

Why a parent process: a version that cannot start (a broken package, a dependency it
needs and the node lacks) cannot roll itself back. The supervisor imports only the
standard library and the versions directory's few lines, so no package it installs
can break it, and it costs a few MB: not even argparse (two options, read by hand),
typing (annotations only) or dataclasses, which a process that runs for months would
hold for nothing. It is started with `python -m`, replacing the `greenfed` process
(`os.execv`), so it holds nothing that command imported, and keeps its process id for
systemd.

One round: start the child in the active version (or the one on trial). A version on
trial must write its health file (the agent does, once its birth is published: it
reached the broker with its credentials and runs its modules) within the trial's
bound; it then becomes the active version. If the child exits first, or the bound
passes, the supervisor stops it, records the failure (the next birth reports it:
`agent_upgrade` in `status`) and starts the version it ran before. The child's exit
code `RESTART_EXIT_CODE` asks for another round (it staged a version on trial); any
other exit ends the supervisor with that code, for systemd to restart or not.

A version that passed its trial can still break later: a power cut soon after it was
made active can leave its files empty, and an empty `__main__` exits 0 at once, which
systemd does not restart. So a version other than the installed one that exits
without announcing itself, within `QUICK_EXIT_S` of its start, `QUICK_EXITS` times in
a row (whatever the code) is given up like a failed trial: recorded, and the installed
version runs.

What the supervisor cannot record (a full or read-only disk) is logged, never fatal:
it does first what a full disk still allows (removing `trial.json` or `active.json`
needs no space), and an agent keeps running whatever could not be written.

It runs as root: a versions directory, a record or a version's files that another
user could have written or swapped (edge/upgrade/versions.py `path_problem`) are
ignored, logged, and the installed version runs; in a directory it cannot trust, the
agent is told of none (it cannot upgrade itself: its birth says so).

SIGTERM and SIGINT are passed to the child, whose training workers and serving
replicas outlive it as they outlive any agent restart; the child gets SIGTERM if the
supervisor dies (PR_SET_PDEATHSIG), so no agent outlives its supervisor.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from edge.upgrade.versions import (
    HEALTH_FILE_ENV,
    RESTART_EXIT_CODE,
    VERSIONS_DIR_ENV,
    Failure,
    Trial,
    VersionsDir,
)

TYPE_CHECKING = False  # the type checker reads it as true; typing is not imported at run time
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Final, NoReturn, TypeAlias

    ChildCommand: TypeAlias = Callable[[str | None], Sequence[str]]

# How long a stopped child has to exit before it is killed (the agent's own shutdown
# budget is 4 s, the unit's TimeoutStopSec 10 s).
STOP_GRACE_S: Final = 8.0
# A version other than the installed one that exits this soon after its start, before
# it announced itself, this many times in a row, is given up for the installed one;
# between its starts the supervisor waits as systemd would (the unit's RestartSec).
QUICK_EXIT_S: Final = 60.0
QUICK_EXITS: Final = 3
RESTART_PAUSE_S: Final = 5.0
_POLL_S: Final = 0.2
_PR_SET_PDEATHSIG: Final = 1
_USAGE = "usage: python -m edge.upgrade.supervisor --versions-dir DIR -- GREENFED_ARGUMENTS..."


@functools.cache
def _prctl() -> Callable[[int, int], int] | None:
    """The C library's prctl, found among the interpreter's own symbols; looked up here,
    in the supervisor, not between fork and exec."""
    try:
        prctl: Callable[[int, int], int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux
        return None
    return prctl


def _die_with_parent() -> None:  # runs in the child between fork and exec
    prctl = _prctl()
    if prctl is not None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class Supervisor:
    def __init__(
        self,
        versions: VersionsDir,
        child_command: ChildCommand,
        *,
        clock: Callable[[], float] = time.time,
        log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
        restart_pause_s: float = RESTART_PAUSE_S,
    ) -> None:
        """`child_command(version)`: the agent's command line (version None: the
        installed one); the supervisor adds the version's code to its PYTHONPATH."""
        self.versions = versions
        self._child_command = child_command
        self._clock = clock
        self._log = log
        self._restart_pause_s = restart_pause_s
        self._child: subprocess.Popen[bytes] | None = None
        self._stopping = False
        self._health_file = versions.root / "health"
        # The health file left by an earlier child that could not be removed (a
        # read-only disk): its inode and time, so that it is not taken for a new one.
        self._stale_health: tuple[int, int] | None = None
        # Trials rolled back by this process: not tried again in a later round even if
        # their trial.json could not be removed (a read-only disk).
        self._rolled_back: set[tuple[str, str]] = set()

    def run(self) -> int:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_stop_signal)
        while True:
            code = self.round()
            if code != RESTART_EXIT_CODE or self._stopping:
                return 0 if self._stopping and code == RESTART_EXIT_CODE else code
            self._log(f"greenfed supervisor: the agent asked to start again (exit {code})")

    def round(self) -> int:
        """Start the child once (and, if its version on trial failed, the previous one);
        return the exit code that ends the round."""
        problem = self.versions.root_problem()
        if problem is not None:
            # Nothing in it is run or written; the agent is told of no versions
            # directory, so it stages nothing there either.
            self._log(
                f"greenfed supervisor: {self.versions.root} ignored ({problem}): the "
                "installed version runs, and cannot upgrade itself"
            )
            return self._start(None, upgrades=False).wait()
        trial = self._trial()
        if trial is None:
            return self._run(self.versions.active())
        self._log(f"greenfed supervisor: trying agent {trial.version}")
        child = self._start(trial.version)
        outcome = self._await_health(child, trial.health_timeout_s)
        if outcome is None:
            self._promote(trial)
            return child.wait()  # the agent runs on, whatever could not be recorded
        if self._stopping:  # stopped during the trial: the trial is not over
            return child.wait()
        self._stop_child(child)
        self._roll_back(trial, outcome)
        return self._run(_version_before(trial))

    def _trial(self) -> Trial | None:
        """The version on trial to start now, if any."""
        trial = self.versions.trial()  # None also for a record it must not trust
        if trial is None or (trial.version, trial.rollout_id) in self._rolled_back:
            return None
        if not self.versions.is_installed(trial.version):
            self._attempt(
                "end the trial of a version whose files are gone", self.versions.end_trial
            )
            return None
        problem = self.versions.version_problem(trial.version)
        if problem is not None:
            self._roll_back(trial, f"its files cannot be trusted: {problem}", outcome="failed")
            return None
        return trial

    def _promote(self, trial: Trial) -> None:
        """The version on trial announced itself: make it the active one."""
        version = trial.version
        if not self._attempt(
            f"make agent {version} the active version",
            lambda: self.versions.set_active(version, trial.rollout_id),
        ):
            # trial.json stays: the next start tries this version again, and makes it
            # active if it can then.
            self._log(f"greenfed supervisor: agent {version} announced itself; it stays on trial")
            return
        self._attempt("end the trial", self.versions.end_trial)
        self._log(f"greenfed supervisor: agent {version} announced itself; it stays")
        keep = {version} | ({trial.previous} if trial.previous else set())
        self._attempt("prune old versions", lambda: self.versions.prune(keep))

    def _roll_back(self, trial: Trial, detail: str, *, outcome: str = "rolled-back") -> None:
        """Give the version on trial up for the one before it."""
        self._rolled_back.add((trial.version, trial.rollout_id))
        # First what a full disk still allows: removing trial.json needs no space, and
        # active.json still names the version before the trial (staging one leaves it
        # alone), so every later start runs that version even if nothing else is written.
        self._attempt("end the trial", self.versions.end_trial)
        previous = _version_before(trial)
        if self.versions.active() != previous:
            self._attempt(
                f"make {previous or 'the installed version'} active again",
                lambda: self.versions.set_active(previous),
            )
        self._record(trial.version, trial.rollout_id, outcome, detail)
        self._log(
            f"greenfed supervisor: agent {trial.version} rolled back to "
            f"{previous or 'the installed version'}: {detail}"
        )

    def _run(self, version: str | None) -> int:
        """Run the agent in `version` (None: the installed one) until it exits; its exit
        code. A version other than the installed one is run only if its files can be
        trusted, and is given up for the installed one when it keeps exiting at once,
        before it announced itself (QUICK_EXITS in a row): a version a power cut
        emptied exits 0 at each start."""
        if version is not None and (problem := self.versions.version_problem(version)):
            self._log(
                f"greenfed supervisor: agent {version} not run ({problem}); the installed "
                "version runs"
            )
            version = None
        quick_exits = 0
        while True:
            started = time.monotonic()
            code = self._start(version).wait()
            ran_s = time.monotonic() - started
            if (
                version is None
                or self._stopping
                or code == RESTART_EXIT_CODE
                or ran_s >= QUICK_EXIT_S
                or self._health_written()
            ):
                return code
            quick_exits += 1
            detail = (
                f"it exited with code {code} {ran_s:.1f} s after it started, before "
                f"announcing itself, {quick_exits} time(s) in a row"
            )
            if quick_exits >= QUICK_EXITS:
                self._give_up(version, detail)
                version = None
                continue
            self._log(f"greenfed supervisor: agent {version}: {detail}; starting it again")
            if not self._pause(self._restart_pause_s):
                return code

    def _give_up(self, version: str, detail: str) -> None:
        """The active version cannot run: back to the installed one, reported."""
        rollout_id = self.versions.active_rollout_id() if self.versions.active() == version else ""
        # Removing active.json needs no space: done first, as for a failed trial.
        self._attempt("go back to the installed version", lambda: self.versions.set_active(None))
        self._record(version, rollout_id, "rolled-back", detail)
        self._log(
            f"greenfed supervisor: agent {version} given up for the installed version: {detail}"
        )

    def _record(self, version: str, rollout_id: str, outcome: str, detail: str) -> None:
        """Record the failure for the next birth to report."""
        failure = Failure(
            version=version,
            rollout_id=rollout_id,
            outcome=outcome,
            detail=detail,
            at=self._clock(),
        )
        self._attempt(
            f"record the failure of agent {version}",
            lambda: self.versions.record_failure(failure),
        )

    def _attempt(self, what: str, change: Callable[[], None]) -> bool:
        """Make one change to the versions directory; whether it was made. A full or
        read-only disk is logged, never fatal: an agent must run whatever the
        supervisor could not write."""
        try:
            change()
        except OSError as error:
            self._log(f"greenfed supervisor: could not {what}: {error}")
            return False
        return True

    def _pause(self, seconds: float) -> bool:
        """Wait `seconds`; False if a stop signal came meanwhile."""
        deadline = time.monotonic() + seconds
        while not self._stopping and time.monotonic() < deadline:
            time.sleep(min(_POLL_S, max(0.0, deadline - time.monotonic())))
        return not self._stopping

    def _start(self, version: str | None, *, upgrades: bool = True) -> subprocess.Popen[bytes]:
        """`upgrades`: tell the child the versions directory (without it, the agent does
        not upgrade itself; the health file's variable alone still tells it that a
        supervisor runs it, so that it does not start one of its own)."""
        env = dict(os.environ)
        env[HEALTH_FILE_ENV] = str(self._health_file)
        env.pop(VERSIONS_DIR_ENV, None)
        if upgrades:
            self._forget_health()
            env[VERSIONS_DIR_ENV] = str(self.versions.root)
        if version is not None:
            site = str(self.versions.site(version))
            env["PYTHONPATH"] = os.pathsep.join(
                [site, *filter(None, [os.environ.get("PYTHONPATH")])]
            )
        _prctl()  # looked up before the fork
        self._child = subprocess.Popen(
            list(self._child_command(version)), env=env, preexec_fn=_die_with_parent
        )
        return self._child

    def _forget_health(self) -> None:
        """Remove the last child's health file before the next child starts."""
        self._stale_health = None
        try:
            self._health_file.unlink(missing_ok=True)
        except OSError:  # a read-only disk: remember which file is the old one
            with contextlib.suppress(OSError):
                status = self._health_file.stat()
                self._stale_health = (status.st_ino, status.st_mtime_ns)

    def _health_written(self) -> bool:
        """Whether the child started last wrote its health file (it announced itself)."""
        try:
            status = self._health_file.stat()
        except OSError:
            return False
        return (status.st_ino, status.st_mtime_ns) != self._stale_health

    def _await_health(self, child: subprocess.Popen[bytes], timeout_s: float) -> str | None:
        """None once the child wrote its health file; else why it did not."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self._health_written():
                return None
            code = child.poll()
            if code is not None:
                return f"the new version exited with code {code} before announcing itself"
            if self._stopping:
                return "stopped during the trial"
            if time.monotonic() >= deadline:
                return f"the new version did not announce itself within {timeout_s:g} s"
            time.sleep(_POLL_S)

    def _stop_child(self, child: subprocess.Popen[bytes]) -> None:
        if child.poll() is not None:
            return
        child.terminate()
        try:
            child.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()

    def _on_stop_signal(self, signum: int, _frame: object) -> None:
        self._stopping = True
        child = self._child
        if child is not None and child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signum)


def _version_before(trial: Trial) -> str | None:
    """The version a failed trial goes back to (None: the installed one): the one its
    record names, unless that is the version on trial itself, which an older agent wrote
    when it ran the installed version while `active.json` named the new one."""
    return None if trial.previous == trial.version else trial.previous


def replace_with_supervisor(versions_dir: Path, arguments: Sequence[str]) -> NoReturn:
    """Become the supervisor (same process id), whose child runs `greenfed ARGUMENTS`."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(
        sys.executable,
        [
            sys.executable,
            "-P",
            "-m",
            "edge.upgrade.supervisor",
            "--versions-dir",
            str(versions_dir),
            "--",
            *arguments,
        ],
    )


def agent_command(arguments: Sequence[str]) -> ChildCommand:
    """The agent's command line in any version: `python -P -m greenfed ARGUMENTS`, which
    imports `greenfed` from the version's code when it comes first on the path (`-P`:
    the working directory is not put before it, where a checkout would shadow it)."""

    def command(_version: str | None) -> Sequence[str]:
        return [sys.executable, "-P", "-m", "greenfed", *arguments]

    return command


def parse_arguments(argv: Sequence[str]) -> tuple[Path, list[str]]:
    """`--versions-dir DIR [--] ARGUMENTS...`: the versions directory and greenfed's own
    arguments. Raises ValueError with the usage."""
    match list(argv):
        case ["--versions-dir", directory, *arguments]:
            pass
        case [option, *arguments] if option.startswith("--versions-dir="):
            directory = option.removeprefix("--versions-dir=")
        case _:
            raise ValueError(_USAGE)
    if not directory:
        raise ValueError(_USAGE)
    if arguments[:1] == ["--"]:
        arguments = arguments[1:]
    return Path(directory), arguments


def main(argv: Sequence[str] | None = None) -> int:
    try:
        versions_dir, arguments = parse_arguments(sys.argv[1:] if argv is None else argv)
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2

    def warn(line: str) -> None:
        print(f"greenfed supervisor: {line}", file=sys.stderr, flush=True)

    supervisor = Supervisor(VersionsDir(versions_dir, warn=warn), agent_command(arguments))
    return supervisor.run()


if __name__ == "__main__":
    sys.exit(main())
