"""What lets a restarted agent find its training workers again: `<name>.run` beside the
worker's log, written when the worker starts and whenever the agent lets go of it.

A worker is taken back only if a process with its pid is alive *and* started when
the record says (psutil's create time), so a pid the kernel gave to another process
after a reboot is never adopted. The record also says where the agent's reading of
the log had got to, so the output is shipped on from there, and its wrapper writes
`<name>.exit` when the worker ends (edge/training/wrapper.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import psutil

from edge.training.log_tail import TailPosition


class WorkerRecord(msgspec.Struct, kw_only=True):
    job_id: str
    attempt: int
    pid: int  # the wrapper's, which leads the worker's process group
    process_started: float  # psutil create time of that process
    started_at: float  # wall clock, for the reported state
    tail_inode: int | None = None
    tail_position: int = 0
    output_offset: int = 0  # offset in the worker's output of the first byte not shipped

    @property
    def tail(self) -> TailPosition:
        return TailPosition(self.tail_inode, self.tail_position)


def save_record(path: Path, record: WorkerRecord) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_bytes(msgspec.json.encode(record))
    os.replace(temporary, path)


def load_record(path: Path) -> WorkerRecord | None:
    try:
        return msgspec.json.decode(path.read_bytes(), type=WorkerRecord)
    except (FileNotFoundError, msgspec.DecodeError, msgspec.ValidationError):
        return None


def process_started(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def is_alive(pid: int, started: float) -> bool:
    """The process `pid` is the one that started at `started` and has not exited."""
    try:
        process = psutil.Process(pid)
        return process.create_time() == started and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
