"""What lets a restarted agent find its training workers again: `<name>.run` beside the
worker's log, written when the worker starts and whenever the agent lets go of it.

A worker is taken back only if a process with its pid is alive *and* started when
the record says, in this boot: its start in clock ticks since boot (from /proc, which
a stepped wall clock does not move, unlike a create time derived from it) and the
kernel's boot id. A pid the kernel gave to another process, after a reboot or not, is
never adopted; where there is no /proc, psutil's create time stands in.

The record also says where the agent's reading of the log had got to, so the output is
shipped on from there, and its wrapper writes `<name>.exit` when the worker ends
(edge/training/wrapper.py). It names what the worker's wrapper would clean up (its
cgroups, containers, work directory), so that an agent can do it when the wrapper
itself was killed; never anything secret.
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
    process_started: float  # when that process started (`process_started`)
    boot_id: str = ""  # the kernel's boot id then ("": unknown)
    started_at: float  # wall clock, for the reported state
    grace_period_s: float = 30.0  # SIGTERM to SIGKILL, should it have to be stopped
    tail_inode: int | None = None
    tail_position: int = 0
    output_offset: int = 0  # offset in the worker's output of the first byte not shipped
    # 1: the wrapper ran one command and left SIGTERM to it (the agent signalled the
    # whole process group); 2: it runs a launch plan and takes SIGTERM as "stop".
    protocol: int = 1
    started_file: str = ""  # written by the wrapper once the processes started
    processes: int = 1
    image: str | None = None
    cgroup_dirs: tuple[str, ...] = ()
    cleanup: tuple[tuple[str, ...], ...] = ()
    remove_paths: tuple[str, ...] = ()

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


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
    except OSError:
        return ""


def _proc_stat(pid: int) -> list[bytes] | None:
    """The fields of /proc/<pid>/stat from the state on (None: no such process here)."""
    with open(f"/proc/{pid}/stat", "rb") as file:
        data = file.read()
    # The command name is in parentheses and may hold anything: read after the last ')'.
    return data[data.rindex(b")") + 2 :].split()


def process_started(pid: int) -> float | None:
    """When `pid` started: clock ticks since boot on Linux, else psutil's create time;
    None when there is no such process."""
    try:
        fields = _proc_stat(pid)
        return float(fields[19]) if fields is not None else None  # stat's field 22
    except FileNotFoundError:
        return None
    except (OSError, ValueError, IndexError):
        try:
            return psutil.Process(pid).create_time()
        except psutil.Error:
            return None


def is_alive(pid: int, started: float, started_boot_id: str = "") -> bool:
    """The process `pid` is the one that started at `started` (in the boot
    `started_boot_id`, when known) and has not exited."""
    if started_boot_id and boot_id() and started_boot_id != boot_id():
        return False
    if process_started(pid) != started:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
