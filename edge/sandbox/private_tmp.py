"""A worker's own temporary directories and IPC at isolation `user`, so that nothing it
leaves there outlives it:

    python -I -S .../edge/sandbox/private_tmp.py [--size-bytes N] [--tmpfs DIR]... \
        [--mqueue DIR] -- COMMAND...

Run as root on the worker's way in, before `setpriv` drops its privileges (COMMAND).
It enters a mount and an IPC namespace of its own, makes every mount in it private
(nothing propagates to or from the host), mounts an empty tmpfs (mode 1777, nosuid,
nodev, at most N bytes) over each DIR and a fresh POSIX message queue file system over
the --mqueue one, then execs COMMAND with its environment as it is.

Without it, the host's /tmp, /var/tmp and /dev/shm, its SysV shared memory, semaphores
and message queues and its POSIX ones are shared by every worker: what a job leaves
there stays once it ends, and what lies in a RAM-backed tmpfs stays charged to the
workers' memory, so a tenant's jobs would grow it without bound. A namespace goes with
its last process, and the wrapper kills every process of the worker (its cgroups) when
it ends: its tmpfs and IPC objects go with them. (A bubblewrap sandbox does the same
with its own namespaces: edge/sandbox/bubblewrap.py.)

It runs as root with the job's environment on every worker's start: the standard
library only, with no site packages (-S), and none of its slower imports (dataclasses,
typing, pathlib would triple its start).
"""

from __future__ import annotations

import ctypes
import os
import sys

SCRIPT = os.path.realpath(__file__)
# <sched.h> and <sys/mount.h>
CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_REC = 0x4000
MS_PRIVATE = 0x40000
# What a start that could not make them exits with (as `env` does for a command it
# cannot run): the worker's log says why.
CANNOT_START_CODE = 126


class PrivateTmp:
    """What a worker gets of its own: tmpfs over `tmpfs_dirs`, each at most `size_bytes`
    (None: the kernel's default, half the host's memory; the worker's memory limit
    holds what it writes there anyway, as a tmpfs's pages are charged to the cgroup
    of the process that writes them), and a message queue file system over
    `mqueue_dir` (None: the host mounts none)."""

    __slots__ = ("mqueue_dir", "size_bytes", "tmpfs_dirs")

    def __init__(
        self,
        tmpfs_dirs: tuple[str, ...] = (),
        mqueue_dir: str | None = None,
        size_bytes: int | None = None,
    ) -> None:
        self.tmpfs_dirs = tmpfs_dirs
        self.mqueue_dir = mqueue_dir
        self.size_bytes = size_bytes

    def argv(self, python: str) -> list[str]:
        """The command line that makes them, then runs what follows it."""
        argv = [python, "-I", "-S", SCRIPT]
        if self.size_bytes is not None:
            argv += ["--size-bytes", str(self.size_bytes)]
        for directory in self.tmpfs_dirs:
            argv += ["--tmpfs", directory]
        if self.mqueue_dir is not None:
            argv += ["--mqueue", self.mqueue_dir]
        return [*argv, "--"]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        number = ctypes.get_errno()
        raise OSError(number, f"{what}: {os.strerror(number)}")


def enter(private: PrivateTmp) -> None:
    """This process into namespaces of its own, with `private`'s mounts made there.
    Raises OSError."""
    libc = _libc()
    libc.mount.argtypes = [
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_ulong,
        ctypes.c_char_p,
    ]
    _check(libc.unshare(CLONE_NEWNS | CLONE_NEWIPC), "unshare")
    # Else a mount made here would appear in the host's tree (a shared root propagates).
    _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    options = "mode=1777" + (f",size={private.size_bytes}" if private.size_bytes else "")
    for directory in private.tmpfs_dirs:
        _check(
            libc.mount(
                b"tmpfs",
                directory.encode(),
                b"tmpfs",
                MS_NOSUID | MS_NODEV,
                options.encode(),
            ),
            f"mount tmpfs on {directory}",
        )
    if private.mqueue_dir is not None:
        # The host's, mounted there, would create queues in the host's IPC namespace.
        _check(
            libc.mount(
                b"mqueue", private.mqueue_dir.encode(), b"mqueue", MS_NOSUID | MS_NODEV, None
            ),
            f"mount mqueue on {private.mqueue_dir}",
        )


def _arguments(argv: list[str]) -> tuple[PrivateTmp, list[str]]:
    """Parsed by hand: argparse's import alone would cost every worker's start."""
    if "--" not in argv:
        raise ValueError("no command after --")
    cut = argv.index("--")
    options, command = argv[:cut], list(argv[cut + 1 :])
    if len(options) % 2 or not command:
        raise ValueError("expected --option value pairs, then -- COMMAND")
    tmpfs_dirs: list[str] = []
    mqueue_dir: str | None = None
    size_bytes: int | None = None
    for name, value in zip(options[::2], options[1::2], strict=True):
        if name == "--tmpfs":
            tmpfs_dirs.append(value)
        elif name == "--mqueue":
            mqueue_dir = value
        elif name == "--size-bytes":
            size_bytes = int(value)
        else:
            raise ValueError(f"unknown option {name}")
    return PrivateTmp(tuple(tmpfs_dirs), mqueue_dir, size_bytes), command


def main(argv: list[str]) -> int:
    try:
        private, command = _arguments(argv)
    except ValueError as error:
        print(f"greenfed: private_tmp.py: {error}", file=sys.stderr)
        return 2
    try:
        enter(private)
    except OSError as error:
        print(
            f"greenfed: cannot make the worker's private temporary directories ({error})",
            file=sys.stderr,
        )
        return CANNOT_START_CODE
    try:
        os.execv(command[0], command)
    except OSError as error:
        print(f"greenfed: cannot run {command[0]} ({error})", file=sys.stderr)
    return CANNOT_START_CODE


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
