"""The agent versions a node keeps beside the installed one, and what the supervisor
and the agent tell each other through them: `<data_dir>/agent-versions/`.

    <version>/site/         the version's wheel, unpacked (shared/agent_packages.py)
    active.json             the version that runs ({"version": ...}); absent: the installed one
    trial.json              a version on trial: started next, kept only if it announces itself
    failed.json             the last upgrade that did not take, for the birth to report

The installed version (the one `greenfed` was installed as) is never touched: it is
what every rollback can return to. Standard library only: the supervisor imports this
and nothing heavier (edge/upgrade/supervisor.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from edge.atomic_files import write_atomically

# Standard library modules the supervisor would otherwise hold for nothing: typing
# (Any, Final) only for the type checker, which reads TYPE_CHECKING as true; and no
# dataclasses (it imports inspect, ast and dis: 1.3 MB), so Trial and Failure are plain.
TYPE_CHECKING = False
if TYPE_CHECKING:
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
    def __init__(self, root: Path) -> None:
        self.root = root

    def site(self, version: str) -> Path:
        return self.root / version / "site"

    def is_installed(self, version: str) -> bool:
        return self.site(version).is_dir()

    def active(self) -> str | None:
        document = self._read(_ACTIVE)
        version = document.get("version") if document else None
        if isinstance(version, str) and self.is_installed(version):
            return version
        return None  # the installed one (or an active version whose files are gone)

    def set_active(self, version: str | None) -> None:
        if version is None:
            self._remove(_ACTIVE)
        else:
            self._write(_ACTIVE, {"version": version})

    def trial(self) -> Trial | None:
        document = self._read(_TRIAL)
        if document is None:
            return None
        try:
            return Trial(
                version=str(document["version"]),
                rollout_id=str(document.get("rollout_id", "")),
                previous=document.get("previous"),
                health_timeout_s=float(document["health_timeout_s"]),
            )
        except (KeyError, TypeError, ValueError):
            self._remove(_TRIAL)  # unreadable: nothing is on trial
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
        if not self.root.is_dir():
            return
        candidates = sorted(
            (path for path in self.root.iterdir() if path.is_dir() and path.name not in keep),
            key=lambda path: path.stat().st_mtime,
            reverse=True,
        )
        import shutil

        for path in candidates[KEPT_VERSIONS:]:
            shutil.rmtree(path, ignore_errors=True)

    def _read(self, name: str) -> dict[str, Any] | None:
        try:
            document = json.loads((self.root / name).read_bytes())
        except (OSError, ValueError):
            return None
        return document if isinstance(document, dict) else None

    def _write(self, name: str, document: dict[str, Any]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        write_atomically(self.root / name, json.dumps(document).encode())

    def _remove(self, name: str) -> None:
        (self.root / name).unlink(missing_ok=True)
