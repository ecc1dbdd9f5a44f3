"""The command line that runs a worker in namespaces of its own (Debian's `bubblewrap`)
as its own unprivileged user (util-linux's `setpriv`).

bubblewrap runs as root (the agent's user) and builds the worker's view of the
system, then `setpriv` drops to the work user with no capabilities, an empty bounding
set and `no_new_privs` (set-uid programs cannot give root back) and execs the job's
command. The worker sees:

- the host's file system read-only, except its own work directory (and the job's
  `working_dir`, when it names one), writable; the job's `working_dir` entered as the
  work user, never by root;
- the agent's data directory, settings and keys replaced by empty ones (`--tmpfs`
  over a directory, /dev/null over a file): not there to read, whatever their modes;
- a /dev of its own with the standard devices and only the accelerators it was
  given; private /tmp, /var/tmp and /dev/shm;
- a PID namespace of its own (it cannot see, signal or trace the agent or other
  jobs), and IPC, UTS and cgroup namespaces of its own. The network is the host's:
  gangs rendezvous over it.

`--die-with-parent`: if the wrapper that supervises it is killed, the sandbox goes
with it, leaving nothing behind.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Final

from edge.sandbox.devices import DeviceNode
from edge.sandbox.root_env import env_argv, root_binary
from edge.sandbox.users import WorkUser

SANDBOX_HOSTNAME: Final = "greenfed-worker"
SHARED_TMP_DIRS: Final = ("/tmp", "/var/tmp", "/dev/shm")


def drop_privileges(user: WorkUser) -> list[str]:
    """`setpriv` (its absolute path: never the job's PATH) to the work user with nothing
    privileged left."""
    return [
        root_binary("setpriv"),
        f"--reuid={user.uid}",
        f"--regid={user.gid}",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
        "--",
    ]


def sandbox_argv(
    command: Sequence[str],
    *,
    bubblewrap: str,
    user: WorkUser,
    work_dir: str,
    working_dir: str | None,
    hidden_dirs: Sequence[str],
    hidden_files: Sequence[str],
    devices: Sequence[DeviceNode],
    moved_env: Mapping[str, str],
) -> list[str]:
    """The argv that runs `command` in a sandbox. `work_dir`: the worker's own, which
    the agent made; `working_dir`: the directory the job names (None: none), where the
    command starts; `moved_env`: the job's root-sensitive variables
    (edge/sandbox/root_env.py), set once privileges are dropped.

    bubblewrap's mounts apply in order, the later over the earlier, so the job's
    working_dir is bound first, right over the read-only host: whatever it is or holds
    (`/`, a parent of the agent's data directory, a link swapped in for it after it was
    checked: a bind lands where the link leads), every stand-in comes after it and
    covers what it brought back. The launcher refuses such a working_dir anyway
    (edge/sandbox/launcher.py); this keeps a miss there from undoing the sandbox.
    The work directory comes last: it is inside the hidden data directory."""
    argv = [bubblewrap, "--ro-bind", "/", "/"]
    if working_dir:
        argv += ["--bind", working_dir, working_dir]
    argv += ["--dev", "/dev", "--proc", "/proc"]
    for directory in SHARED_TMP_DIRS:
        argv += ["--perms", "1777", "--tmpfs", directory]
    for directory in hidden_dirs:
        argv += ["--tmpfs", directory]
    for path in hidden_files:
        argv += ["--ro-bind", "/dev/null", path]
    for device in devices:
        argv += ["--dev-bind", device.path, device.inside]
    # A work directory inside a hidden directory (the agent's data directory) needs its
    # parents made in the empty tmpfs: passable, not listable (bubblewrap would make
    # them 0700, which the work user cannot pass).
    for parent in _parents_inside(work_dir, hidden_dirs):
        argv += ["--perms", "0711", "--dir", parent]
    argv += ["--bind", work_dir, work_dir]
    argv += [
        # bubblewrap is still root here: it enters the work directory, which only the
        # agent names; the job's working_dir is entered by `env` as the work user.
        "--chdir",
        work_dir,
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--hostname",
        SANDBOX_HOSTNAME,
        "--die-with-parent",
        "--",
        *drop_privileges(user),
        *env_argv(moved_env, chdir=working_dir or work_dir),
        *command,
    ]
    return argv


def _parents_inside(path: str, hidden_dirs: Sequence[str]) -> list[str]:
    """The parents of `path` below any of `hidden_dirs`, outermost first."""
    target = PurePosixPath(path)
    parents = []
    for hidden in hidden_dirs:
        top = PurePosixPath(hidden)
        if top in target.parents:
            parents += [str(p) for p in reversed(target.parents) if top in p.parents]
    return list(dict.fromkeys(parents))
