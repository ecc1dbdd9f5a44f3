"""What is done with a worker's cgroups once they exist, by the wrapper as it runs the
worker (edge/training/wrapper.py) and by the agent after it: join them, count the
kernel's out-of-memory kills, signal and empty them, remove them. Paths come from the
plan (edge/sandbox/cgroups.py made the groups); nothing here discovers anything, and
it imports only what a worker's start can afford (the wrapper starts on its path).
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from collections.abc import Iterable, Iterator, Sequence, Set
from pathlib import Path


def join(procs_files: Iterable[str], pid: int = 0) -> None:
    """Move `pid` (0: the calling process) into every one of the leaves."""
    text = str(pid or os.getpid())
    for path in procs_files:
        with open(path, "w", encoding="ascii") as file:
            file.write(text)


def oom_kills(oom_file: str) -> int:
    """How many of the leaf's processes the kernel killed for memory."""
    try:
        with open(oom_file, encoding="ascii") as file:
            for line in file:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    except (OSError, ValueError):
        pass
    return 0


def memory_peak(path: str) -> int:
    try:
        with open(path, encoding="ascii") as file:
            return int(file.read().strip() or 0)
    except (OSError, ValueError):
        return 0


def pids_in(directories: Iterable[str]) -> set[int]:
    """Every process in the groups and the groups below them (a container's)."""
    found: set[int] = set()
    for top in directories:
        for directory in _walk(Path(top)):
            with contextlib.suppress(OSError, ValueError):
                text = (directory / "cgroup.procs").read_text(encoding="ascii")
                found.update(int(pid) for pid in text.split())
    return found


def signal_all(directories: Iterable[str], signum: int, *, sparing: Set[int] = frozenset()) -> int:
    """Send `signum` to every process in the groups but those `sparing` names; how many
    there were."""
    pids = pids_in(directories) - sparing
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)
    return len(pids)


def kill_all_and_wait(directories: Sequence[str], timeout_s: float = 5.0) -> bool:
    """SIGKILL what is left in the groups until they are empty; whether they are."""
    deadline = time.monotonic() + timeout_s
    while signal_all(directories, signal.SIGKILL):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def remove_groups(directories: Iterable[str]) -> None:
    """rmdir each group (and groups below it, made by a container runtime), deepest
    first; a group that is gone already is fine, one still busy is left (logged by
    the caller when it matters)."""
    for top in directories:
        for directory in sorted(_walk(Path(top)), key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(FileNotFoundError):
                try:
                    directory.rmdir()
                except OSError as error:
                    if error.errno not in (errno.EBUSY, errno.ENOTEMPTY):
                        raise


def _walk(top: Path) -> Iterator[Path]:
    if not top.is_dir():
        return
    yield top
    for path, names, _ in os.walk(top):
        for name in names:
            yield Path(path) / name
