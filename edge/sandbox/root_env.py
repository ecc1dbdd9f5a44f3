"""What the processes that run as root on a worker's way in may be told by the job.

A worker starts through programs that run as root before its privileges are dropped:
bubblewrap, `setpriv`, a container runtime's client (podman). Their environment was the
job's, and the job chooses its variables: `PATH` picked which `setpriv` root ran,
`LD_PRELOAD` loaded a library of the job's into bubblewrap and `setpriv` as root, and
`CONTAINERS_CONF` gave podman a hook to run as root. So:

- every program run as root is named by its absolute path, found on `ROOT_PATH`, never
  on the job's `PATH`;
- a variable that changes what such a program loads, runs, reads or connects to
  (`is_root_sensitive`) is never in a root process's environment: the job's value
  reaches the worker after the privilege drop, as an argument (`env NAME=value` after
  `setpriv`; `--env=NAME=value` to a container runtime), so such values are no secrets
  (a secret of such a name is refused: `refused_secret_names`);
- the rest of the job's variables, secrets included, stay in the environment, never on
  a command line another user could read.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Mapping
from typing import Final

from shared.root_sensitive_env import is_root_sensitive

# Where programs run as root are looked for.
ROOT_PATH: Final = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def root_binary(name: str) -> str:
    """The absolute path of a program to run as root, found on `ROOT_PATH` (the name
    itself when it is not there: the start then fails, as a missing program should)."""
    return shutil.which(name, path=ROOT_PATH) or name


def split_environment(
    env: Mapping[str, str], *, root_home: str = "/root"
) -> tuple[dict[str, str], dict[str, str]]:
    """(what processes run as root get, the root-sensitive variables the worker gets
    after the privilege drop)."""
    moved = {name: value for name, value in env.items() if is_root_sensitive(name)}
    kept = {name: value for name, value in env.items() if name not in moved}
    return {**kept, "PATH": ROOT_PATH, "HOME": root_home}, moved


def refused_secret_names(names: Iterable[str]) -> list[str]:
    """The secrets' names that are root-sensitive: their values would have to be passed
    as arguments, which other users of the node can read."""
    return sorted(name for name in names if is_root_sensitive(name))


def env_argv(moved: Mapping[str, str], *, chdir: str | None = None) -> list[str]:
    """`env NAME=value ...` run after the privilege drop, before the worker's command;
    `chdir`: the directory it enters first, as the worker's user (a directory that
    user could not reach by itself is refused by the kernel, not entered by root)."""
    options = [f"--chdir={chdir}"] if chdir else []
    assignments = (f"{name}={value}" for name, value in sorted(moved.items()))
    return [root_binary("env"), *options, "--", *assignments]
