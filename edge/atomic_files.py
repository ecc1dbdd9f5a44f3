"""Replacing a file atomically: written beside, flushed to disk, renamed, and the
rename made durable, so a crash leaves the old file or the new one, never half of
either. The agent's state files (edge/agent/state_files.py), the GPUs held to a
power limit (edge/training/power_limits.py) and a worker's exit status
(edge/training/wrapper.py) are written this way."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``; on an OSError (a full or read-only disk) the old
    file stays whole, the half-written one is removed, and the error is raised."""
    temporary = path.with_name(f".{path.name}.tmp")
    try:
        with open(temporary, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise
    # The rename itself is durable only once the directory is.
    with contextlib.suppress(OSError):
        sync_to_disk(path.parent)


def sync_to_disk(path: Path) -> None:
    """fsync: a file's bytes, or a directory's entries (a rename in it), on disk.
    Read-only opening is enough on Linux, and the only way to open a directory."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
