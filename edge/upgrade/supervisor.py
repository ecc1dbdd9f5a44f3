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
    ) -> None:
        """`child_command(version)`: the agent's command line (version None: the
        installed one); the supervisor adds the version's code to its PYTHONPATH."""
        self.versions = versions
        self._child_command = child_command
        self._clock = clock
        self._log = log
        self._child: subprocess.Popen[bytes] | None = None
        self._stopping = False
        self._health_file = versions.root / "health"

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
        trial = self.versions.trial()
        if trial is not None and not self.versions.is_installed(trial.version):
            self.versions.end_trial()
            trial = None
        if trial is None:
            return self._start(self.versions.active()).wait()
        self._log(f"greenfed supervisor: trying agent {trial.version}")
        child = self._start(trial.version)
        outcome = self._await_health(child, trial.health_timeout_s)
        if outcome is None:
            self.versions.set_active(trial.version)
            self.versions.end_trial()
            self._log(f"greenfed supervisor: agent {trial.version} announced itself; it stays")
            keep = {trial.version} | ({trial.previous} if trial.previous else set())
            self.versions.prune(keep)
            return child.wait()
        if self._stopping:  # stopped during the trial: the trial is not over
            return child.wait()
        self._stop_child(child)
        self.versions.record_failure(
            Failure(
                version=trial.version,
                rollout_id=trial.rollout_id,
                outcome="rolled-back",
                detail=outcome,
                at=self._clock(),
            )
        )
        self.versions.end_trial()
        self.versions.set_active(trial.previous)
        self._log(
            f"greenfed supervisor: agent {trial.version} rolled back to "
            f"{trial.previous or 'the installed version'}: {outcome}"
        )
        return self._start(trial.previous).wait()

    def _start(self, version: str | None) -> subprocess.Popen[bytes]:
        self._health_file.unlink(missing_ok=True)
        env = dict(os.environ)
        env[HEALTH_FILE_ENV] = str(self._health_file)
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

    def _await_health(self, child: subprocess.Popen[bytes], timeout_s: float) -> str | None:
        """None once the child wrote its health file; else why it did not."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self._health_file.exists():
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
    supervisor = Supervisor(VersionsDir(versions_dir), agent_command(arguments))
    return supervisor.run()


if __name__ == "__main__":
    sys.exit(main())
