"""How this node runs a worker: the one place that turns a desired worker into the
plan its wrapper carries out (edge/training/launch_plan.py).

For every process of the worker, in this order: the user it runs as (never the
agent's unless the node runs unisolated: edge/sandbox/users.py), a work directory of
its own that only that user can enter, its cgroup with the job's limits
(edge/sandbox/cgroups.py), the environment built from nothing but the job's
(edge/training/environment.py), and the command line: the job's command as it is
(isolation `none`), behind `setpriv` (`user`; in a mount and IPC namespace of its own
with private temporary directories where the node can make one,
edge/sandbox/private_tmp.py), in a bubblewrap sandbox (`sandbox`,
edge/sandbox/bubblewrap.py), or in a container of the job's image with the node's
runtime (edge/sandbox/containers.py). The devices it may use are only those it was
given (edge/sandbox/devices.py).

Whether the node runs the worker at all is decided first (`refusal`): not below the
isolation the job asks for, never when the node cannot isolate work, never an image
without a container runtime.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from edge.atomic_files import write_atomically
from edge.sandbox.bubblewrap import SHARED_TMP_DIRS, drop_privileges, sandbox_argv
from edge.sandbox.cgroups import RunGroups, WorkerLimits
from edge.sandbox.containers import ContainerRuntime, auth_file, local_names, pull_needed
from edge.sandbox.devices import DeviceNode, assigned_device_nodes, device_rules
from edge.sandbox.image_owners import ImageOwners
from edge.sandbox.private_tmp import PrivateTmp
from edge.sandbox.probe import NodeIsolation
from edge.sandbox.root_env import env_argv, refused_secret_names, split_environment
from edge.sandbox.users import WorkUser, WorkUsers
from edge.training.environment import (
    WorkerSpecError,
    process_accelerators,
    process_cores,
    process_count,
    process_environment,
)
from edge.training.launch_plan import LaunchPlan, PrepareStep, ProcessPlan
from shared.images import qualified, registry_of, repository_of
from shared.messages import KERNEL_PIDS_MAX, Accelerator, DesiredTraining, IsolationLevel
from shared.sealing import SealedSecrets
from shared.worker_env import DEFAULT_VARIABLES

ISOLATION_RANK: Final[Mapping[IsolationLevel, int]] = {
    "unavailable": -1,
    "none": 0,
    "user": 1,
    "sandbox": 2,
}
RUN_DIR_MODE: Final = 0o711  # others may pass through to their own work directory only
WORK_DIR_MODE: Final = 0o700
# What a sandbox replaces with its own besides the shared temporary directories
# (edge/sandbox/bubblewrap.py): no place for a job's working_dir.
SYSTEM_DIRS: Final = ("/dev", "/proc", "/sys")
# Opens a directory itself, never what a link in its place leads to.
_DIRECTORY_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class PrivatePaths:
    """What a sandboxed worker must never see: the agent's data directory, its settings
    file, its keys (`hidden_paths` too). Directories are replaced by empty ones, files
    by /dev/null."""

    directories: tuple[Path, ...] = ()
    files: tuple[Path, ...] = ()

    def contains(self, path: Path) -> bool:
        return any(path == d or d in path.parents for d in self.directories) or path in self.files

    def held_by(self, path: Path) -> bool:
        """Whether `path` is one of them or a directory above one: bound into a sandbox,
        it would hold what the sandbox hides."""
        return any(path == p or path in p.parents for p in (*self.directories, *self.files))


def working_dir_refusal(
    working_dir: Path,
    private: PrivatePaths,
    *,
    replaced_tmp_dirs: Sequence[str] = (),
    sandboxed: bool = False,
) -> str:
    """Why a job may not work in `working_dir` (a normalized absolute path; "" when it
    may). A sandbox binds it writable into its view: one that holds what the sandbox
    hides or replaces (the agent's private files, /proc, /dev, /sys, the shared
    temporary directories; `/` or `/var/lib`, say) would bring the host's back, and
    one inside /proc, /sys or /dev would lay the host's over the sandbox's own. The
    same job is refused the same way on every node, sandboxed or not; only inside the
    shared temporary directories that this node's workers get their own of
    (`replaced_tmp_dirs`: a sandbox's, or private ones at `user`), which hide the
    host's, does it matter which node it is."""
    if private.contains(working_dir):
        return f"working_dir {working_dir} is inside the agent's private files"
    held = ["the agent's private files"] if private.held_by(working_dir) else []
    for replaced in (*SYSTEM_DIRS, *SHARED_TMP_DIRS):
        path = Path(replaced)
        if working_dir != path and working_dir not in path.parents:
            continue
        if not any(Path(named) in path.parents for named in held):  # /dev says /dev/shm
            held.append(replaced)
    if held:
        return (
            f"working_dir {working_dir} holds what a sandbox hides or replaces "
            f"({', '.join(held)}): name a directory that holds none of it"
        )
    for replaced in (*SYSTEM_DIRS, *replaced_tmp_dirs):
        if Path(replaced) in working_dir.parents:
            if replaced in SYSTEM_DIRS or sandboxed:
                return (
                    f"working_dir {working_dir} is inside {replaced}, which a sandbox "
                    "replaces with its own"
                )
            return (
                f"working_dir {working_dir} is inside {replaced}, which every worker on "
                "this node gets a private one of"
            )
    return ""


def _may_search(info: os.stat_result, user: WorkUser) -> bool:
    """Whether `user` has search permission on the directory `info` describes, as the
    kernel checks it for that uid and gid."""
    if info.st_uid == user.uid:
        search = stat.S_IXUSR
    elif info.st_gid == user.gid:
        search = stat.S_IXGRP
    else:
        search = stat.S_IXOTH
    return bool(info.st_mode & search)


def unreachable_reason(working_dir: str, user: WorkUser) -> str:
    """Why `user` could not enter `working_dir` (an absolute path without '..') itself,
    in no more words than it could find out on its own ("" when it could).

    The agent (root) looks for it, and the reason goes back to the job's tenant: each
    directory from `/` down is looked at only once the user may search the one above
    it, so what lies behind a directory closed to the user (whether a name exists
    there, where a link there leads) is never told. A link is refused (bound into a
    sandbox as written, it could lay a directory the sandbox hides back over its empty
    stand-in): told by what the link itself says, which the user may read."""
    path = Path(os.path.normpath(working_dir))
    for step in (*reversed(path.parents), path):
        try:
            info = os.lstat(step)
        except OSError:
            return f"working_dir {working_dir} does not exist on this node"
        if stat.S_ISLNK(info.st_mode):
            return (
                f"working_dir {working_dir} goes through a symbolic link ({step} leads to "
                f"{os.readlink(step)}): name the directory itself"
            )
        if not stat.S_ISDIR(info.st_mode):
            return f"working_dir {working_dir} does not exist on this node"
        if not _may_search(info, user):
            return (
                f"working_dir {working_dir} is not a directory the job's user "
                f"(uid {user.uid}) may enter"
            )
    return ""


class Sandbox:
    def __init__(
        self,
        isolation: NodeIsolation,
        *,
        inventory: Sequence[Accelerator],
        work_root: Path,
        credentials_dir: Path,
        users: WorkUsers | None = None,
        private: PrivatePaths = PrivatePaths(),
        default_pids: int = 4096,
        dev_root: Path = Path("/dev"),
        image_owners: ImageOwners | None = None,
    ) -> None:
        """`work_root`: where workers' work directories are made; `credentials_dir`: a
        directory only the agent can read, for registry credentials during a pull;
        `users`: whom workers run as (needed when the isolation switches users);
        `image_owners`: whose credentials pulled which image here (edge/sandbox/
        image_owners.py; default: remembered in memory only)."""
        if isolation.switches_user and users is None:
            raise ValueError(f"isolation {isolation.level} needs work users")
        self.isolation = isolation
        self._inventory = tuple(inventory)
        self._work_root = work_root
        self._credentials_dir = credentials_dir
        self._users = users
        self._private = private
        self._default_pids = default_pids
        self._dev_root = dev_root
        self._image_owners = image_owners or ImageOwners()
        self._replaced_tmp_dirs = self._own_tmp_dirs()

    def _own_tmp_dirs(self) -> tuple[str, ...]:
        """The shared temporary directories each worker gets its own of: a sandbox's
        (edge/sandbox/bubblewrap.py); at `user`, those of the host's that a private
        namespace can cover (edge/sandbox/private_tmp.py), never one that holds the
        work directories, which the worker could no longer reach."""
        if self.isolation.level == "sandbox":
            return SHARED_TMP_DIRS
        if self.isolation.level != "user" or not self.isolation.private_tmp:
            return ()
        work_root = Path(os.path.realpath(self._work_root))
        return tuple(
            directory
            for directory in SHARED_TMP_DIRS
            if os.path.isdir(directory)
            and not os.path.islink(directory)
            and Path(directory) != work_root
            and Path(directory) not in work_root.parents
        )

    @property
    def level(self) -> IsolationLevel:
        return self.isolation.level

    @property
    def inventory(self) -> tuple[Accelerator, ...]:
        return self._inventory

    def refusal(self, spec: DesiredTraining) -> str:
        """Why this node will not run `spec` ("" when it will)."""
        isolation = self.isolation
        if isolation.level == "unavailable":
            return f"this node runs no work it cannot isolate ({isolation.note})"
        if ISOLATION_RANK[isolation.level] < ISOLATION_RANK[spec.min_isolation]:
            return (
                f"the job asks for isolation {spec.min_isolation}; this node gives "
                f"{isolation.level} ({isolation.note})"
            )
        if (
            spec.image
            and spec.image_pull_policy == "never"
            and self._image_owners.owned_by_others(qualified(spec.image), spec.tenant)
        ):
            return _pulled_by_others_reason(spec.image)
        if spec.image and isolation.runtime is None:
            return (
                "the job runs in an image and this node has no container runtime "
                f"({isolation.runtime_note})"
            )
        if spec.working_dir and not spec.image:
            working_dir = Path(spec.working_dir)
            if not working_dir.is_absolute():
                return f"working_dir {spec.working_dir} is not an absolute path"
            if ".." in working_dir.parts:
                return f"working_dir {spec.working_dir} has a '..' in it: name the directory"
            return working_dir_refusal(
                Path(os.path.normpath(working_dir)),
                self._private,
                replaced_tmp_dirs=self._replaced_tmp_dirs,
                sandboxed=self.isolation.level == "sandbox",
            )
        return ""

    def plan(
        self, spec: DesiredTraining, secrets: SealedSecrets, *, name: str, started_file: Path
    ) -> LaunchPlan:
        """The plan for `spec`'s processes, with their work directories and cgroups
        made. Blocking. Raises WorkerSpecError (and OSError, CgroupError) with the
        reason the worker cannot start."""
        user = self._user(spec)
        if spec.working_dir and not spec.image:
            why = self._working_dir_problem(spec.working_dir, user)
            if why:
                raise WorkerSpecError(why)
        runtime = self.isolation.runtime if spec.image else None
        pulled_by_others = self._pulled_by_others(spec, runtime)
        if pulled_by_others and spec.image_pull_policy == "never":
            assert spec.image is not None
            raise WorkerSpecError(_pulled_by_others_reason(spec.image))
        refused = refused_secret_names(secrets.env)
        if refused and self.isolation.switches_user:
            raise WorkerSpecError(
                f"secret {refused[0]} has a name that changes what the programs starting the "
                "worker as root do: its value would have to be an argument others can read; "
                "rename the secret"
            )
        count = process_count(spec)
        run_dir = self._work_root / name
        work_dirs = [run_dir / f"w{local}" for local in range(count)]
        self._make_work_dirs(run_dir, work_dirs, user)
        devices = [
            assigned_device_nodes(
                process_accelerators(spec, local), self._inventory, self._dev_root
            )
            for local in range(count)
        ]
        groups = self._groups(spec, name, devices)
        processes = tuple(
            self._process(
                spec,
                local,
                user=user,
                work_dir=str(work_dirs[local]),
                secrets=secrets,
                devices=devices[local],
                groups=groups,
                runtime=runtime,
                container=f"greenfed-{name}-w{local}",
            )
            for local in range(count)
        )
        prepare, credentials = self._image_steps(spec, secrets, name, runtime, pulled_by_others)
        cleanup = (
            tuple(tuple(runtime.remove_argv(f"greenfed-{name}-w{i}")) for i in range(count))
            if runtime is not None
            else ()
        )
        return LaunchPlan(
            processes=processes,
            grace_period_s=spec.grace_period_s,
            started_file=str(started_file),
            prepare=prepare,
            cgroup_dirs=groups.all_dirs() if groups else (),
            cleanup=cleanup,
            remove_paths=(str(run_dir), *credentials),
            remove_after_prepare=credentials,
            label_output=count > 1,
        )

    def _working_dir_problem(self, working_dir: str, user: WorkUser) -> str:
        """Why the worker cannot work in the job's `working_dir` on this node ("" when it
        can): missing, through a link, closed to the job's user, or where a sandbox
        hides or replaces what is there."""
        if self.isolation.switches_user:
            # The worker enters it as its user: one behind a directory closed to that
            # user is refused before anything behind it is looked at.
            why = unreachable_reason(working_dir, user)
        elif not Path(working_dir).is_dir():
            why = f"working_dir {working_dir} does not exist on this node"
        elif (real := os.path.realpath(working_dir)) != os.path.normpath(working_dir):
            # Refused at every level, as unreachable_reason says why.
            why = (
                f"working_dir {working_dir} goes through a symbolic link (to {real}): "
                "name the directory itself"
            )
        else:
            why = ""
        return why or working_dir_refusal(
            Path(os.path.normpath(working_dir)),
            self._private,
            replaced_tmp_dirs=self._replaced_tmp_dirs,
            sandboxed=self.isolation.level == "sandbox",
        )

    def _process(
        self,
        spec: DesiredTraining,
        local: int,
        *,
        user: WorkUser,
        work_dir: str,
        secrets: SealedSecrets,
        devices: Sequence[DeviceNode],
        groups: RunGroups | None,
        runtime: ContainerRuntime | None,
        container: str,
    ) -> ProcessPlan:
        # A sandbox's and a container's /tmp are their own; elsewhere TMPDIR is in the
        # work directory, on disk (at `user`, even where /tmp is the worker's own: a
        # tmpfs, which holds what is written there in memory).
        own_tmp = runtime is not None or self.isolation.level == "sandbox"
        env = process_environment(
            spec,
            self._inventory,
            local=local,
            secret_env=secrets.env,
            work_dir=work_dir,
            user_name=user.name,
            tmp_dir="/tmp" if own_tmp else f"{work_dir}/tmp",
        )
        rank = spec.rank + (local if spec.launch == "per-worker" else 0)
        memory_bytes = self._memory_bytes(spec)
        # What the processes run as root get (never the job's PATH, LD_PRELOAD, ...), and
        # the job's root-sensitive variables, given after the privilege drop.
        root_env, moved = split_environment(env)
        if runtime is not None:
            assert spec.image is not None
            # The container's PATH and LANG are its image's unless the job sets them.
            inherited = {name for name in DEFAULT_VARIABLES if name not in spec.env}
            accelerators = set(process_accelerators(spec, local))
            argv = runtime.run_argv(
                container=container,
                image=qualified(spec.image),
                command=spec.command,
                user=user,
                env_names=sorted(n for n in env if n not in inherited and n not in moved),
                env_values={n: v for n, v in moved.items() if n not in inherited},
                work_dir=work_dir,
                cwd=spec.working_dir,
                cgroup_parent=groups.container_parents[local] if groups else None,
                memory_bytes=memory_bytes,
                cpu_cores=process_cores(spec),
                pids=self._pids(spec),
                gpus=[a for a in self._inventory if a.id in accelerators and a.kind == "gpu"],
                devices=devices,
            )
            own_groups = runtime.name == "docker"  # its daemon's, not the worker's leaf
            return ProcessPlan(
                rank=rank,
                argv=tuple(argv),
                env=root_env,
                cwd=work_dir,
                cgroup_procs=(),  # the container's runtime places it under the leaf
                oom_file=groups.oom_file(local) if groups and not own_groups else None,
                memory_peak_file=(
                    groups.memory_peak_file(local) if groups and not own_groups else None
                ),
                oom_query=tuple(runtime.oom_argv(container)) if own_groups else (),
                memory_limit_bytes=memory_bytes,
            )
        cwd = spec.working_dir or work_dir
        level = self.isolation.level
        if level == "sandbox":
            assert self.isolation.bubblewrap is not None
            argv = sandbox_argv(
                spec.command,
                bubblewrap=self.isolation.bubblewrap,
                user=user,
                work_dir=work_dir,
                working_dir=spec.working_dir,
                hidden_dirs=[str(d) for d in self._private.directories if d.exists()],
                hidden_files=[str(f) for f in self._private.files if f.exists()],
                devices=devices,
                moved_env=moved,
            )
        elif level == "user":
            argv = [
                *self._private_tmp_argv(memory_bytes),
                *drop_privileges(user),
                *env_argv(moved, chdir=cwd),
                *spec.command,
            ]
        else:  # the agent's own user: nothing is run as another
            argv, root_env = list(spec.command), env
        if level in ("sandbox", "user"):
            # Root starts it in its work directory, which only the agent names; the job's
            # working_dir is entered once privileges are dropped (above): a link the job
            # put in its place since it was checked leads root nowhere.
            cwd = work_dir
        if level in ("sandbox", "user") and "=" in spec.command[0]:
            # `env` would take it for a variable to set.
            raise WorkerSpecError(f"the command {spec.command[0]!r} has an '=' in its name")
        return ProcessPlan(
            rank=rank,
            argv=tuple(argv),
            env=root_env,
            cwd=cwd,
            cgroup_procs=groups.procs_files(local) if groups else (),
            oom_file=groups.oom_file(local) if groups else None,
            memory_peak_file=groups.memory_peak_file(local) if groups else None,
            oom_query=(),
            memory_limit_bytes=memory_bytes,
            sandboxed=level == "sandbox",
        )

    # ---- pieces of a plan ------------------------------------------------------------

    def _user(self, spec: DesiredTraining) -> WorkUser:
        if self.isolation.switches_user:
            assert self._users is not None
            return self._users.for_tenant(spec.tenant)
        uid = os.geteuid()
        try:
            name = pwd.getpwuid(uid).pw_name
        except KeyError:
            name = f"uid-{uid}"
        return WorkUser(uid, os.getegid(), name)

    def _make_work_dirs(self, run_dir: Path, work_dirs: Sequence[Path], user: WorkUser) -> None:
        """Each work directory with its own temporary directory in it (where /tmp is the
        host's: no sandbox), given to the work user.

        Root works here beside the user's other jobs, which may run already and own
        work directories of their own: nothing is done by a path a job could change.
        Both directories are made while root still owns them (nobody else can put
        anything in them), through descriptors of the directories themselves, and
        given away inner first: once the user owns the work directory, root does
        nothing more in it."""
        self._work_root.mkdir(parents=True, exist_ok=True)
        os.chmod(self._work_root, RUN_DIR_MODE)
        if run_dir.exists():  # an earlier start of this attempt that never ran
            shutil.rmtree(run_dir)  # fd-based: never follows a link the job left in it
        run_dir.mkdir(mode=RUN_DIR_MODE)
        run_fd = os.open(run_dir, _DIRECTORY_FLAGS)
        try:
            os.fchmod(run_fd, RUN_DIR_MODE)
            for directory in work_dirs:
                os.mkdir(directory.name, WORK_DIR_MODE, dir_fd=run_fd)
                work_fd = os.open(directory.name, _DIRECTORY_FLAGS, dir_fd=run_fd)
                try:
                    os.mkdir("tmp", WORK_DIR_MODE, dir_fd=work_fd)
                    if self.isolation.switches_user:
                        tmp_fd = os.open("tmp", _DIRECTORY_FLAGS, dir_fd=work_fd)
                        try:
                            os.fchown(tmp_fd, user.uid, user.gid)
                        finally:
                            os.close(tmp_fd)
                        os.fchown(work_fd, user.uid, user.gid)
                finally:
                    os.close(work_fd)
        finally:
            os.close(run_fd)

    def _private_tmp_argv(self, memory_bytes: int | None) -> list[str]:
        """What gives a worker at `user` its own temporary directories and IPC, as root
        before the privilege drop (nothing where the node cannot: the host's are
        shared then). Sized by the worker's memory limit, which holds what it writes
        there anyway."""
        if not self._replaced_tmp_dirs:
            return []
        # A host's mounted message queue file system would create queues in its IPC
        # namespace, not the worker's.
        mqueue_dir = "/dev/mqueue" if os.path.ismount("/dev/mqueue") else None
        private = PrivateTmp(self._replaced_tmp_dirs, mqueue_dir, memory_bytes)
        return private.argv(sys.executable)

    def _memory_bytes(self, spec: DesiredTraining) -> int | None:
        if spec.host_memory_bytes is None:
            return None
        return spec.host_memory_bytes * (spec.processes if spec.launch == "per-node" else 1)

    def _pids(self, spec: DesiredTraining) -> int:
        """The processes and threads one worker's leaf holds: launched per node, the
        node's processes of the gang together."""
        per_node = spec.processes if spec.launch == "per-node" else 1
        return min((spec.pids_limit or self._default_pids) * per_node, KERNEL_PIDS_MAX)

    def _groups(
        self, spec: DesiredTraining, name: str, devices: Sequence[Sequence[DeviceNode]]
    ) -> RunGroups | None:
        cgroups = self.isolation.cgroups
        if cgroups is None:
            return None
        limits = [
            WorkerLimits(
                memory_bytes=self._memory_bytes(spec),
                cpu_cores=process_cores(spec),
                pids=self._pids(spec),
                # A container's runtime keeps its own device rules (and refuses a
                # parent that allows less than they do).
                device_rules=None if spec.image else device_rules(nodes),
            )
            for nodes in devices
        ]
        return cgroups.create_run(name, limits)

    def _pulled_by_others(self, spec: DesiredTraining, runtime: ContainerRuntime | None) -> bool:
        """Whether the image `spec` names may have come here on another tenant's registry
        credentials (edge/sandbox/image_owners.py). Blocking: it may ask the runtime.

        A digest finds an image in the runtime's store whatever repository the reference
        names (podman runs `localhost/any@sha256:<d>` from an image it holds as
        `ghcr.io/acme/private:2`): one the store holds under no name of the named
        repository is owned as its names are."""
        if spec.image is None or runtime is None:
            return False
        image = qualified(spec.image)
        if self._image_owners.owned_by_others(image, spec.tenant):
            return True
        if "@" not in image:
            return False
        names = local_names(runtime, image, DEFAULT_VARIABLES)
        if any(repository_of(held) == repository_of(image) for held in names):
            return False
        return any(self._image_owners.owned_by_others(held, spec.tenant) for held in names)

    def _image_steps(
        self,
        spec: DesiredTraining,
        secrets: SealedSecrets,
        name: str,
        runtime: ContainerRuntime | None,
        pulled_by_others: bool,
    ) -> tuple[tuple[PrepareStep, ...], tuple[str, ...]]:
        """(the steps that make the image present, the credential files they use)."""
        if runtime is None or spec.image is None:
            return (), ()
        # Always by its qualified name: a short one matches any local image of that path.
        image = qualified(spec.image)
        credentials: tuple[str, ...] = ()
        auth_path: str | None = None
        registry = secrets.registry
        check, pull = pull_needed(spec.image_pull_policy)
        if pulled_by_others:
            check, pull = False, True  # the registry decides, on this job's credentials
        if registry is not None:
            self._image_owners.record(image, spec.tenant)
            directory = self._credentials_dir / f"{name}.auth"
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            path = directory / runtime.auth_file_name()
            credentials_file = auth_file(
                registry.registry or registry_of(image), registry.username, registry.password
            )
            write_atomically(path, credentials_file)
            os.chmod(path, 0o600)
            auth_path, credentials = str(path), (str(directory),)
        if pull:
            error = f"image {image} could not be pulled"
        else:
            error = f"image {image} is not on this node (image_pull_policy never)"
        step = PrepareStep(
            check=tuple(runtime.exists_argv(image)) if check else (),
            run=tuple(runtime.pull_argv(image, auth_path)) if pull else (),
            env=dict(DEFAULT_VARIABLES),
            error=error,
        )
        return (step,), credentials


def _pulled_by_others_reason(image: str) -> str:
    return (
        f"image {image} may have been pulled to this node with another tenant's registry "
        "credentials (its repository, or the image its digest finds; or this node has "
        "forgotten whose), and image_pull_policy never would run it without asking the "
        "registry: use if-not-present or always"
    )
