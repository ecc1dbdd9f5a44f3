"""The agent versions a node keeps beside the installed one, and what the supervisor
and the agent tell each other through them: `<data_dir>/agent-versions/`.

    <version>/site/         the version's wheel, unpacked (shared/agent_packages.py)
    active.json             the version that runs ({"version": ..., "rollout_id": ...});
                            absent: the installed one
    trial.json              a version on trial: started next, kept only if it announces itself
    failed.json             the last upgrade that did not take, for the birth to report

The installed version (the one `greenfed` was installed as) is never touched: it is
what every rollback can return to. Standard library only: the supervisor imports this
and nothing heavier (edge/upgrade/supervisor.py).

The supervisor runs the code here as its own user (root, as the unit runs it), so
nothing here is trusted that another user could have written or swapped: the
directory, its records and a version's files count only when they are no link, are
owned by that user (or root) and are writable by no group or other user
(`path_problem`). A record that is not is ignored, as if absent; the supervisor does
not run such a version (edge/upgrade/supervisor.py).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from pathlib import Path

from edge.atomic_files import write_atomically

# Standard library modules the supervisor would otherwise hold for nothing: typing
# (Any, Final) only for the type checker, which reads TYPE_CHECKING as true; and no
# dataclasses (it imports inspect, ast and dis: 1.3 MB), so Trial and Failure are plain.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, Final

DIRECTORY_NAME: Final = "agent-versions"
# The supervisor hands its child these; the agent writes the health file once it has
# announced itself (its birth published), which is what keeps a version on trial.
HEALTH_FILE_ENV: Final = "GREENFED_SUPERVISOR_HEALTH_FILE"
VERSIONS_DIR_ENV: Final = "GREENFED_SUPERVISOR_VERSIONS_DIR"
# The agent exits with this once it staged a version on trial: start me again.
# (EX_TEMPFAIL: systemd's RestartPreventExitStatus lists 2 and 3, never this.)
RESTART_EXIT_CODE: Final = 75
# Versions kept on disk besides the active one and the one on trial.
KEPT_VERSIONS: Final = 2


def is_supervised() -> bool:
    """Whether this process is the agent a supervisor started (here, not in
    supervisor.py: the agent asks, and need not load the supervisor to know)."""
    return bool(os.environ.get(HEALTH_FILE_ENV))


_ACTIVE = "active.json"
_TRIAL = "trial.json"
_FAILED = "failed.json"
_WRITABLE_BY_OTHERS = stat.S_IWGRP | stat.S_IWOTH


def is_version_name(text: object) -> bool:
    """Whether `text` can name a version's directory here: one plain path component
    (the agent checks versions against shared/agent_packages.py's stricter pattern; this
    keeps a damaged record from naming a path outside the directory)."""
    return (
        isinstance(text, str)
        and 0 < len(text) <= 64
        and not text.startswith(".")
        and "/" not in text
        and "\0" not in text
    )


def stat_problem(status: os.stat_result, *, owner: int, directory: bool) -> str | None:
    """Why a file or directory with this status (from lstat or fstat) must not be
    trusted by a process running as `owner`: code or records in it could have been
    written by someone else. None when it may be trusted. Root's own files are trusted
    by everyone: root could change them anyway."""
    mode = status.st_mode
    if stat.S_ISLNK(mode):
        return "it is a link"
    if directory and not stat.S_ISDIR(mode):
        return "it is not a directory"
    if not directory and not stat.S_ISREG(mode):
        return "it is not a plain file"
    if status.st_uid not in (owner, 0):
        return f"it is owned by uid {status.st_uid}, not {owner}"
    if mode & _WRITABLE_BY_OTHERS:
        return f"others can write it (mode {stat.S_IMODE(mode):04o})"
    return None


def path_problem(path: Path, *, directory: bool, owner: int | None = None) -> str | None:
    """`stat_problem` for `path` itself (a link is not followed); None also when there
    is nothing at `path`. `owner`: the user to judge for (default: this process's)."""
    try:
        status = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as error:
        return f"it cannot be checked ({error.strerror or error})"
    return stat_problem(status, owner=os.geteuid() if owner is None else owner, directory=directory)


class Trial:
    """A version on trial."""

    __slots__ = ("health_timeout_s", "previous", "rollout_id", "version")

    def __init__(
        self, *, version: str, rollout_id: str, previous: str | None, health_timeout_s: float
    ) -> None:
        self.version = version
        self.rollout_id = rollout_id
        self.previous = previous  # the version to go back to; None: the installed one
        self.health_timeout_s = health_timeout_s

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Trial) and _fields(other) == _fields(self)

    def __repr__(self) -> str:
        return _repr(self)


class Failure:
    """The last upgrade that did not take."""

    __slots__ = ("at", "detail", "outcome", "rollout_id", "version")

    def __init__(
        self, *, version: str, rollout_id: str, outcome: str, detail: str, at: float
    ) -> None:
        self.version = version
        self.rollout_id = rollout_id
        self.outcome = outcome  # "failed" or "rolled-back" (shared/messages.py AgentUpgradeOutcome)
        self.detail = detail
        self.at = at

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Failure) and _fields(other) == _fields(self)

    def __repr__(self) -> str:
        return _repr(self)


def _fields(record: Trial | Failure) -> tuple[object, ...]:
    return tuple(getattr(record, name) for name in record.__slots__)


def _repr(record: Trial | Failure) -> str:
    fields = ", ".join(f"{name}={getattr(record, name)!r}" for name in record.__slots__)
    return f"{type(record).__name__}({fields})"


class VersionsDir:
    def __init__(
        self,
        root: Path,
        *,
        owner: int | None = None,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        """`owner`: the user whose files are trusted here besides root (default: this
        process's); `warn(line)` is told of each record or directory ignored, and why."""
        self.root = root
        self._owner = os.geteuid() if owner is None else owner
        self._warn = warn

    def site(self, version: str) -> Path:
        return self.root / version / "site"

    def is_installed(self, version: str) -> bool:
        return is_version_name(version) and self.site(version).is_dir()

    def root_problem(self) -> str | None:
        """Why nothing in the directory may be trusted (a link, another user's, writable
        by others), or None. A directory not made yet holds nothing to distrust."""
        return path_problem(self.root, directory=True, owner=self._owner)

    def version_problem(self, version: str) -> str | None:
        """Why the version's code must not run (not unpacked, or a file or directory of
        it that another user could have written: a link, another owner, writable by a
        group or others), or None. Every file is looked at (a wheel's few hundred)."""
        if not self.is_installed(version):
            return "its files are gone"
        for path in (self.root / version, self.site(version)):
            problem = path_problem(path, directory=True, owner=self._owner)
            if problem is not None:
                return f"{path}: {problem}"
        return self._tree_problem(self.site(version))

    def active(self) -> str | None:
        document = self._read(_ACTIVE)
        version = document.get("version") if document else None
        if isinstance(version, str) and self.is_installed(version):
            return version
        return None  # the installed one (or an active version whose files are gone)

    def active_rollout_id(self) -> str:
        """The rollout that made the active version active ("" if unknown)."""
        document = self._read(_ACTIVE)
        rollout_id = document.get("rollout_id") if document else None
        return rollout_id if isinstance(rollout_id, str) else ""

    def set_active(self, version: str | None, rollout_id: str = "") -> None:
        if version is None:
            self._remove(_ACTIVE)
        else:
            self._write(_ACTIVE, {"version": version, "rollout_id": rollout_id})

    def trial(self) -> Trial | None:
        document = self._read(_TRIAL)
        if document is None:
            return None
        try:
            version = document["version"]
            previous = document.get("previous")
            if not is_version_name(version):
                raise ValueError(version)
            return Trial(
                version=version,
                rollout_id=str(document.get("rollout_id", "")),
                # Anything but a version name (a damaged record) goes back to the
                # installed version, which is always there.
                previous=previous if is_version_name(previous) else None,
                health_timeout_s=float(document["health_timeout_s"]),
            )
        except (KeyError, TypeError, ValueError):
            # Unreadable: nothing is on trial (removed if it can be: a read-only disk
            # makes it unreadable again at every start, no worse).
            with contextlib.suppress(OSError):
                self._remove(_TRIAL)
            return None

    def start_trial(self, trial: Trial) -> None:
        self._write(
            _TRIAL,
            {
                "version": trial.version,
                "rollout_id": trial.rollout_id,
                "previous": trial.previous,
                "health_timeout_s": trial.health_timeout_s,
            },
        )

    def end_trial(self) -> None:
        self._remove(_TRIAL)

    def failure(self) -> Failure | None:
        document = self._read(_FAILED)
        if document is None:
            return None
        try:
            return Failure(
                version=str(document["version"]),
                rollout_id=str(document.get("rollout_id", "")),
                outcome=str(document["outcome"]),
                detail=str(document.get("detail", ""))[:1024],
                at=float(document["at"]),
            )
        except (KeyError, TypeError, ValueError):
            return None

    def record_failure(self, failure: Failure) -> None:
        self._write(
            _FAILED,
            {
                "version": failure.version,
                "rollout_id": failure.rollout_id,
                "outcome": failure.outcome,
                "detail": failure.detail[:1024],
                "at": failure.at,
            },
        )

    def prune(self, keep: set[str]) -> None:
        """Remove unpacked versions but those in `keep` and the newest `KEPT_VERSIONS`
        others (by when they were unpacked)."""
        try:
            entries = list(os.scandir(self.root))
        except OSError:  # not made yet, or gone
            return
        candidates = []
        for entry in entries:
            if entry.name in keep:
                continue
            try:
                if entry.is_dir(follow_symlinks=False):
                    candidates.append((entry.stat(follow_symlinks=False).st_mtime, entry.path))
            except OSError:  # removed since it was listed: nothing to prune
                continue
        candidates.sort(reverse=True)
        import shutil

        for _, path in candidates[KEPT_VERSIONS:]:
            shutil.rmtree(path, ignore_errors=True)

    def _tree_problem(self, directory: Path) -> str | None:
        """The first file or directory under `directory` that must not be trusted."""
        pending = [directory]
        while pending:
            try:
                with os.scandir(pending.pop()) as entries:
                    for entry in entries:
                        is_directory = entry.is_dir(follow_symlinks=False)
                        problem = stat_problem(
                            entry.stat(follow_symlinks=False),
                            owner=self._owner,
                            directory=is_directory,
                        )
                        if problem is not None:
                            return f"{entry.path}: {problem}"
                        if is_directory:
                            pending.append(Path(entry.path))
            except OSError as error:
                return f"{error.filename}: it cannot be checked ({error.strerror or error})"
        return None

    def _read(self, name: str) -> dict[str, Any] | None:
        """The record's document; None when there is none, it does not parse, or it
        (or the directory) must not be trusted (told to `warn`)."""
        path = self.root / name
        problem = self.root_problem()
        if problem is not None:
            self._distrust(self.root, problem)
            return None
        try:
            # Not through a link, and never blocking on a FIFO planted in its place.
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as error:
            if error.errno == errno.ELOOP:
                self._distrust(path, "it is a link")
            return None
        with os.fdopen(fd, "rb") as file:
            try:
                problem = stat_problem(os.fstat(fd), owner=self._owner, directory=False)
                if problem is not None:
                    self._distrust(path, problem)
                    return None
                document = json.loads(file.read(1 << 16))
            except (OSError, ValueError):
                return None
        return document if isinstance(document, dict) else None

    def _distrust(self, path: Path, problem: str) -> None:
        if self._warn is not None:
            self._warn(f"{path} ignored: {problem}")

    def _write(self, name: str, document: dict[str, Any]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        write_atomically(self.root / name, json.dumps(document).encode())

    def _remove(self, name: str) -> None:
        (self.root / name).unlink(missing_ok=True)
