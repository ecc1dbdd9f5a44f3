"""What this greenfed is: its version (one place: the package's metadata, from
pyproject.toml) and, run from a git checkout, the commit it was built from."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

from shared import __version__

_SOURCE_ROOT = Path(__file__).resolve().parent.parent


@functools.cache
def commit() -> str:
    """The checkout's commit (short, `+dirty` with changes), or "" where greenfed was not
    run from a git checkout (a wheel) or git is not there."""
    if not (_SOURCE_ROOT / ".git").exists():
        return ""
    try:
        found = subprocess.run(
            ["git", "-C", str(_SOURCE_ROOT), "describe", "--always", "--dirty=+dirty",
             "--abbrev=12", "--exclude=*"],
            capture_output=True, text=True, timeout=5, check=False,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return ""
    return found.stdout.strip() if found.returncode == 0 else ""


def version_text() -> str:
    """`greenfed 0.1.0 (commit 0123abcd4567)`, or without the commit where none is known."""
    built_from = commit()
    return f"greenfed {__version__}" + (f" (commit {built_from})" if built_from else "")
