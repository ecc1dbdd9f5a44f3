"""`greenfed up` owns its data directory; `greenfed cloud` replicas may share one.

`greenfed up` holds an exclusive `flock` on `greenfed.lock` in the data directory
for as long as it runs, and each `greenfed cloud` a shared one: several control
plane replicas may serve one data directory (one SQLite file, one set of model
files, as docs/scheduling.md describes), but a `greenfed up` (which also runs its
own broker and simulated fleet on that directory) neither joins nor is joined by
another process. The kernel drops the
lock when its holder exits or dies, so a crash never leaves a stale lock behind;
the file itself stays (deleting a lock file races with the next process opening it).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from shared.settings import ConfigError

LOCK_FILE_NAME: Final = "greenfed.lock"
SETTING: Final = "store.data_dir"


class DataDirInUse(Exception):
    """Another process holds the lock; the message is one line for the terminal."""

    def __init__(self, data_dir: Path, holder: str) -> None:
        held_by = f" ({holder})" if holder else ""
        super().__init__(
            f"the data directory {data_dir} is in use by another greenfed up or greenfed "
            f"cloud{held_by}; stop it, or give this one its own directory with "
            "GREENFED_STORE__DATA_DIR (or [store] data_dir)"
        )
        self.data_dir = data_dir
        self.holder = holder


@contextlib.contextmanager
def data_dir_lock(data_dir: Path, command: str, *, exclusive: bool = True) -> Iterator[Path]:
    """Hold the lock of `data_dir` for the block (``exclusive``, or shared with other
    shared holders), or raise `DataDirInUse` at once (`ConfigError`: a directory that
    cannot be made or written).

    `command` ("up", "cloud") is written into the lock file with the process id, so the
    next process's message can say who holds it.
    """
    path = data_dir / LOCK_FILE_NAME
    fd = _open_lock_file(path)
    try:
        try:
            fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DataDirInUse(data_dir, _holder(fd)) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}, greenfed {command}\n".encode(), 0)
        yield path
    finally:
        os.close(fd)  # and with it the lock


def _open_lock_file(path: Path) -> int:
    """The lock file's descriptor, its directory made first (as the store makes it); a
    directory that cannot be made or written is a `ConfigError` naming the setting."""
    data_dir = path.parent
    try:
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    except FileExistsError:  # a file of that name (mkdir's own words: "File exists")
        raise ConfigError(f"{SETTING}: {data_dir} is not a directory", key=SETTING) from None
    except OSError as error:  # under /proc, no permission
        raise ConfigError(
            f"{SETTING}: cannot create {data_dir}: {error.strerror or error}", key=SETTING
        ) from None
    try:
        # os.open's descriptors are not inherited: a worker process never keeps the lock.
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as error:  # a read-only directory or filesystem
        raise ConfigError(
            f"{SETTING}: cannot open {path}: {error.strerror or error}", key=SETTING
        ) from None


def _holder(fd: int) -> str:
    """What the holder wrote; empty in the instant between its truncate and its write."""
    try:
        return os.pread(fd, 200, 0).decode(errors="replace").strip()
    except OSError:
        return ""
