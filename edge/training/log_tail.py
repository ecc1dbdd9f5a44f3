"""Reading what a worker's wrapper appends to its bounded log (edge/training/logs.py),
across the log's rotations: the file being read is known by its inode, so when the
log was renamed to `<name>.log.1` the rest of it is read there before the new file.
Output written and rotated away twice between two reads (more than twice the log's
bound in one poll) is skipped, and the caller is told how much.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

READ_MAX_BYTES = 256 * 1024


@dataclass(slots=True)
class TailPosition:
    inode: int | None = None  # the file being read (None: not opened yet)
    position: int = 0  # bytes of it already read


class LogTail:
    def __init__(self, path: Path, at: TailPosition | None = None) -> None:
        self.path = path
        self.previous_path = path.with_name(path.name + ".1")
        self.at = at or TailPosition()
        self.lost_rotations = 0

    def read(self, max_bytes: int = READ_MAX_BYTES) -> bytes:
        """New output since the last read (at most `max_bytes`)."""
        try:
            current = os.stat(self.path)
        except FileNotFoundError:
            return b""
        at = self.at
        data = b""
        if at.inode is not None and current.st_ino != at.inode:
            # Rotated since the last read: the rest of that file is now the `.1` part.
            rest = self._read_from(self.previous_path, at.inode, at.position, max_bytes)
            if rest is None:  # rotated away twice: what was left of it is gone
                self.lost_rotations += 1
                at.inode, at.position = current.st_ino, 0
            elif len(rest) == max_bytes:
                at.position += len(rest)
                return rest  # more of it to read next time, before the new file
            else:
                data = rest
                at.inode, at.position = current.st_ino, 0
        if at.inode is None:
            at.inode = current.st_ino
        if len(data) < max_bytes:
            chunk = self._read_from(self.path, at.inode, at.position, max_bytes - len(data))
            chunk = chunk or b""
            at.position += len(chunk)
            data += chunk
        return data

    @staticmethod
    def _read_from(path: Path, inode: int, position: int, max_bytes: int) -> bytes | None:
        """Up to `max_bytes` of the file `inode` from `position`; None: it is not there."""
        try:
            with open(path, "rb") as file:
                if os.fstat(file.fileno()).st_ino != inode:
                    return None
                file.seek(position)
                return file.read(max_bytes)
        except FileNotFoundError:
            return None
