"""A bounded log file: a job may print for days, the disk must not fill up.

Output goes to `<name>.log`; when it passes `max_bytes` it is renamed to
`<name>.log.1` (replacing the previous one) and a new file starts, so at most
about twice `max_bytes` is ever kept and the newest output is always there.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path


class BoundedLog:
    def __init__(self, path: Path, max_bytes: int) -> None:
        if max_bytes < 1024:
            raise ValueError("max_bytes must be at least 1 KiB")
        self.path = path
        self.previous_path = path.with_name(path.name + ".1")
        self._max_bytes = max_bytes
        path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = path.open("ab")
        self._size = path.stat().st_size

    def write(self, data: bytes) -> None:
        self._handle.write(data)
        self._size += len(data)
        if self._size >= self._max_bytes:
            self._rotate()

    def _rotate(self) -> None:
        self._handle.close()
        self.path.replace(self.previous_path)
        self._handle = self.path.open("ab")
        self._size = 0

    def flush(self) -> None:
        self._handle.flush()

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> BoundedLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def tail_lines(path: Path, lines: int) -> list[str]:
    """The last `lines` lines of a bounded log, across its rotated part."""
    kept: deque[str] = deque(maxlen=lines)
    for part in (path.with_name(path.name + ".1"), path):
        if part.exists():
            with part.open("r", encoding="utf-8", errors="replace") as handle:
                kept.extend(line.rstrip("\n") for line in handle)
    return list(kept)
