"""What this node can do to contain work, found once when the agent starts.

Three mechanisms, each tried for real rather than assumed:

- switching users: the agent is root and util-linux's `setpriv` is installed;
- cgroups: a hierarchy with the memory and pids controllers where the workers' root
  group can be made (edge/sandbox/cgroups.py);
- namespaces: bubblewrap is installed and a trial sandbox starts (a kernel or a
  container the agent runs in may forbid them). At `user`, a mount and an IPC
  namespace of their own with private temporary directories
  (edge/sandbox/private_tmp.py) where a trial of those works.

`agent.isolation` then picks the level (shared.messages.IsolationLevel): `auto` the
strongest available (`sandbox` needs all three, `user` the first two); `sandbox` or
`user` that level, else `unavailable`; `none` runs workers as the agent's user
(cgroup limits still apply where they can be made). `unavailable` means training is
refused: the birth says so, the scheduler sends the node no training, and the note
says what is missing and how to fix it. A container runtime is looked for as well
(edge/sandbox/containers.py): it runs work that names an image, as the work user.

Blocking (it runs processes): the agent calls it in a thread.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import Final, Literal

from edge.sandbox.cgroups import CgroupError, WorkerCgroups, discover_layout
from edge.sandbox.containers import ContainerRuntime, find_runtime
from edge.sandbox.private_tmp import PrivateTmp
from shared.messages import IsolationLevel, ResourceLimit

TRIAL_TIMEOUT_S: Final = 10.0
IsolationSetting = Literal["auto", "sandbox", "user", "none"]
RuntimeSetting = Literal["auto", "podman", "docker", "none"]
NONE_FIX: Final = 'or set agent.isolation = "none" to run work unisolated'


@dataclass(frozen=True, slots=True)
class NodeIsolation:
    level: IsolationLevel
    note: str  # what the level means here, or what keeps it from being stronger
    cgroups: WorkerCgroups | None = None
    bubblewrap: str | None = None  # its path, when the sandbox uses it
    runtime: ContainerRuntime | None = None
    runtime_note: str = ""
    # At `user`: each worker gets its own /tmp, /var/tmp, /dev/shm and IPC namespace.
    private_tmp: bool = False

    @property
    def limits(self) -> tuple[ResourceLimit, ...]:
        return self.cgroups.limits if self.cgroups is not None else ()

    @property
    def runtimes(self) -> tuple[str, ...]:
        return (self.runtime.name,) if self.runtime is not None else ()

    @property
    def switches_user(self) -> bool:
        return self.level in ("user", "sandbox")


def can_switch_user() -> str:
    """Why workers cannot run as another user here ("" if they can)."""
    if os.geteuid() != 0:
        return "the agent is not root, so it cannot run workers as another user"
    if shutil.which("setpriv") is None:
        return "setpriv is not installed (apt install util-linux)"
    return ""


def bubblewrap_works() -> tuple[str | None, str]:
    """(bubblewrap's path, "") when a trial sandbox starts; (None, why) otherwise."""
    path = shutil.which("bwrap")
    if path is None:
        return None, "bubblewrap is not installed (apt install bubblewrap)"
    trial = [
        path,
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--unshare-pid",
        "--unshare-ipc",
        "--die-with-parent",
        "--",
        "true",
    ]
    try:
        done = subprocess.run(
            trial, capture_output=True, text=True, timeout=TRIAL_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return None, f"bubblewrap cannot start here ({error})"
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()
        return None, f"bubblewrap cannot make namespaces here ({detail[-1] if detail else '?'})"
    return path, ""


def private_tmp_works() -> str:
    """Why workers at `user` cannot get private temporary directories and IPC here (""
    when a trial gets them)."""
    trial = [*PrivateTmp(("/tmp",), size_bytes=1024 * 1024).argv(sys.executable), "/bin/true"]
    try:
        done = subprocess.run(
            trial, capture_output=True, text=True, timeout=TRIAL_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"cannot start a trial ({error})"
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()
        return detail[-1] if detail else f"exit code {done.returncode}"
    return ""


def worker_cgroups(root: str, workers_memory_bytes: int | None) -> tuple[WorkerCgroups | None, str]:
    """The workers' groups, made and limited; (None, why) when they cannot be."""
    layout = discover_layout()
    if layout is None:
        return None, "no cgroup hierarchy with the memory and pids controllers is mounted"
    cgroups = WorkerCgroups(layout, root)
    try:
        cgroups.prepare_root(workers_memory_bytes)
    except CgroupError as error:
        return None, f"cannot make the workers' cgroups ({error})"
    return cgroups, ""


def probe_isolation(
    setting: IsolationSetting,
    *,
    cgroup_root: str = "",
    workers_memory_bytes: int | None = None,
    runtime_setting: RuntimeSetting = "auto",
    oci_runtime: str = "",
) -> NodeIsolation:
    cgroups, cgroups_missing = worker_cgroups(cgroup_root, workers_memory_bytes)
    user_missing = can_switch_user()
    runtime, runtime_note = None, ""
    if not user_missing and cgroups is not None:
        probe = find_runtime(runtime_setting, oci_runtime, hybrid_cgroups=cgroups.layout.hybrid)
        runtime, runtime_note = probe.runtime, probe.note
    else:
        runtime_note = "containers run as the work user: " + (user_missing or cgroups_missing)
    if setting == "none":
        note = "agent.isolation = none: workers run as the agent's own user, unisolated"
        return NodeIsolation("none", note, cgroups, None, runtime, runtime_note)
    missing = [why for why in (user_missing, cgroups_missing) if why]
    bubblewrap, bubblewrap_missing = (None, "")
    if setting in ("auto", "sandbox") and not missing:
        bubblewrap, bubblewrap_missing = bubblewrap_works()
    if not missing and bubblewrap is not None:
        note = "bubblewrap namespaces, a user of their own, cgroup limits"
        return NodeIsolation("sandbox", note, cgroups, bubblewrap, runtime, runtime_note)
    if setting == "sandbox":
        missing.append(bubblewrap_missing)
    if not missing:
        return _user_level(cgroups, bubblewrap_missing, runtime, runtime_note)
    note = f"cannot isolate work: {'; '.join(missing)}; fix that {NONE_FIX}"
    return NodeIsolation("unavailable", note, cgroups, None, runtime, runtime_note)


def _user_level(
    cgroups: WorkerCgroups | None,
    bubblewrap_missing: str,
    runtime: ContainerRuntime | None,
    runtime_note: str,
) -> NodeIsolation:
    note = "a user of their own, cgroup limits"
    private_tmp_missing = private_tmp_works()
    if private_tmp_missing:
        # Then what a job leaves in the host's /tmp, /dev/shm or SysV IPC outlives it.
        note += f"; shared /tmp, /dev/shm and IPC: {private_tmp_missing}"
    else:
        note += ", private /tmp, /var/tmp, /dev/shm and IPC"
    if bubblewrap_missing:
        note += f"; no sandbox: {bubblewrap_missing}"
    return NodeIsolation(
        "user",
        note,
        cgroups,
        None,
        runtime,
        runtime_note,
        private_tmp=not private_tmp_missing,
    )
