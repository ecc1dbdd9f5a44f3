"""Resource limits for training workers: a cgroup per worker, on v2 or v1 hierarchies.

Where the controllers are is read from /proc/self/mountinfo, never assumed: a unified
v2 hierarchy with the memory and pids controllers (most current distributions), or
v1 hierarchies, one per controller (older hosts, and hybrid ones that mount an empty
v2 tree beside them, as this project's CI machine does).

Every run of a job gets a group under the workers' root (`agent.cgroup_root`, else
`greenfed` at the root of each hierarchy, outside any service manager's tree, so
workers outlive the agent's unit as they outlive its process), and each of its
processes a leaf below that (limits are per gang worker):

    <hierarchy>/greenfed/<job>-<attempt>/w<local rank>

A leaf holds the worker to its host memory (swap included where it is accounted),
CPU cores (a CFS quota of cores x period), a number of processes and threads, and,
on v1, to the device nodes it was given (edge/sandbox/devices.py). The root holds all
workers together to the host's memory less `agent.reserved_memory_mib`, so the agent
and the system keep theirs whatever the workers do.

The worker's processes join their leaf before they exec (the wrapper writes each
one's pid to the leaf's `cgroup.procs` in every hierarchy), so whatever they start
stays inside: the count of out-of-memory kills is read from the leaf when the worker
ends, what is left in it is killed, and the groups are removed.

All of this is blocking file I/O: callers run it in a thread.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal

from edge.sandbox.cgroup_files import remove_groups

if TYPE_CHECKING:  # the wrapper imports this module: it starts faster without shared/
    from shared.messages import ResourceLimit

DEFAULT_ROOT: Final = "greenfed"
CFS_PERIOD_US: Final = 100_000
# The v1 controllers workers are held with ("name=systemd" and the rest are left alone).
V1_CONTROLLERS: Final = ("memory", "pids", "cpu", "devices")
V2_CONTROLLERS: Final = ("memory", "pids", "cpu")
UNLIMITED_V1_MEMORY: Final = "-1"


class CgroupError(OSError):
    """A group that cannot be made, limited or removed; the message says which file."""


@dataclass(frozen=True, slots=True)
class CgroupLayout:
    """Where the hierarchies are: a unified v2 mount, or v1 mounts per controller."""

    version: Literal[1, 2]
    unified: Path | None = None  # v2
    v1_mounts: Mapping[str, Path] | None = None  # v1: controller -> its mount point
    # v1: every cgroup hierarchy mounted (a container runtime makes groups in all)
    v1_all_mounts: tuple[Path, ...] = ()
    # v1 controllers beside a mounted v2 tree (some runtimes, crun, refuse such hosts)
    hybrid: bool = False

    @property
    def controllers(self) -> tuple[str, ...]:
        if self.version == 2:
            assert self.unified is not None
            return tuple(c for c in _read_words(self.unified / "cgroup.controllers"))
        assert self.v1_mounts is not None
        return tuple(self.v1_mounts)

    def mounts(self) -> tuple[Path, ...]:
        """One path per hierarchy workers are placed in."""
        if self.version == 2:
            assert self.unified is not None
            return (self.unified,)
        assert self.v1_mounts is not None
        return tuple(
            dict.fromkeys(self.v1_mounts[c] for c in V1_CONTROLLERS if c in self.v1_mounts)
        )

    def every_mount(self) -> tuple[Path, ...]:
        """Every hierarchy: where groups a container runtime made may have to go."""
        return self.mounts() if self.version == 2 else self.v1_all_mounts


def parse_mountinfo(text: str) -> CgroupLayout | None:
    """The layout /proc/self/mountinfo describes; None: no usable hierarchy."""
    unified: Path | None = None
    v1: dict[str, Path] = {}
    v1_all: list[Path] = []
    for line in text.splitlines():
        head, separator, tail = line.partition(" - ")
        if not separator:
            continue
        fields, after = head.split(), tail.split()
        if len(fields) < 5 or len(after) < 3:
            continue
        mount_point = Path(_unescape(fields[4]))
        fs_type, options = after[0], after[2].split(",")
        if fs_type == "cgroup2":
            unified = mount_point
        elif fs_type == "cgroup":
            v1_all.append(mount_point)
            for controller in options:
                if controller in V1_CONTROLLERS:
                    v1.setdefault(controller, mount_point)
    if unified is not None and {"memory", "pids"} <= set(
        _read_words(unified / "cgroup.controllers")
    ):
        return CgroupLayout(version=2, unified=unified)
    if {"memory", "pids"} <= set(v1):
        # A hybrid host's empty v2 tree gets groups from container runtimes too.
        every = (*v1_all, unified) if unified is not None else tuple(v1_all)
        return CgroupLayout(
            version=1, v1_mounts=v1, v1_all_mounts=every, hybrid=unified is not None
        )
    return None


def discover_layout() -> CgroupLayout | None:
    try:
        text = Path("/proc/self/mountinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return parse_mountinfo(text)


def _unescape(field: str) -> str:
    """mountinfo escapes spaces, tabs, newlines and backslashes as octal (\\040)."""
    return field.encode().decode("unicode_escape") if "\\" in field else field


def _read_words(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="ascii").split()
    except OSError:
        return []


@dataclass(frozen=True, slots=True)
class WorkerLimits:
    """What one worker (one process of a run) is held to; None: not limited."""

    memory_bytes: int | None
    cpu_cores: float | None
    pids: int | None
    # v1 devices controller rules ("c 195:0 rwm"); None: no device rules (a container,
    # whose runtime keeps its own)
    device_rules: tuple[str, ...] | None = None
    # The CFS period `cpu_cores` is a share of: a shorter one makes a throttled process
    # wait less between its turns (the kernel's least quota, 1 ms, bounds it below).
    cpu_period_us: int = CFS_PERIOD_US


@dataclass(frozen=True, slots=True)
class RunGroups:
    """The groups of one run, in every hierarchy: what the wrapper and the agent use.
    Paths are absolute; `leaves[i]` are process i's leaf directories, one per hierarchy."""

    run_dirs: tuple[str, ...]
    leaves: tuple[tuple[str, ...], ...]
    memory_leaves: tuple[str, ...]  # per process: its leaf in the memory hierarchy
    # per process: its leaf as a container runtime's --cgroup-parent (from the root)
    container_parents: tuple[str, ...]
    version: Literal[1, 2]
    # the run's group in every hierarchy, also those only a container runtime uses
    cleanup_dirs: tuple[str, ...] = ()

    def procs_files(self, process: int) -> tuple[str, ...]:
        return tuple(f"{leaf}/cgroup.procs" for leaf in self.leaves[process])

    def oom_file(self, process: int) -> str:
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        return f"{self.memory_leaves[process]}/{name}"

    def memory_peak_file(self, process: int) -> str | None:
        """v1: the most memory process i's leaf held (v2 needs none: its memory.events
        counts the kills below the leaf too)."""
        if self.version == 2:
            return None
        return f"{self.memory_leaves[process]}/memory.max_usage_in_bytes"

    def all_dirs(self) -> tuple[str, ...]:
        """Every group of the run; `remove_groups` takes what is below them first."""
        return tuple(dict.fromkeys((*self.run_dirs, *self.cleanup_dirs)))


class WorkerCgroups:
    """The workers' root groups on this host, and the groups of each run below them."""

    def __init__(self, layout: CgroupLayout, root: str = "") -> None:
        self.layout = layout
        self._relative = (root or DEFAULT_ROOT).strip("/")
        self.roots = tuple(mount / self._relative for mount in layout.mounts())

    @property
    def limits(self) -> tuple[ResourceLimit, ...]:
        available = set(self.layout.controllers)
        kinds: list[ResourceLimit] = ["memory", "pids"]
        if "cpu" in available:
            kinds.append("cpu")
        if self.layout.version == 1 and "devices" in available:
            kinds.append("devices")
        return tuple(kinds)

    def prepare_root(self, workers_memory_bytes: int | None) -> None:
        """Make the root groups (idempotent) and hold all workers together to
        `workers_memory_bytes` (None: no such limit). Raises CgroupError."""
        for root in self.roots:
            _mkdir(root)
        if self.layout.version == 2:
            assert self.layout.unified is not None
            _enable_controllers(self.layout.unified, self._v2_controllers())
            _enable_controllers(self.roots[0], self._v2_controllers())
        memory_root = self._memory_dir(self.roots)
        if workers_memory_bytes is not None:
            _write(memory_root / self._memory_limit_file, str(workers_memory_bytes))

    def create_run(self, name: str, workers: Sequence[WorkerLimits]) -> RunGroups:
        """Groups for a run's processes with their limits. Raises CgroupError (and
        removes what it made)."""
        run_dirs = tuple(root / name for root in self.roots)
        leaves: list[tuple[Path, ...]] = []
        try:
            for directory in run_dirs:
                _mkdir(directory)
            if self.layout.version == 2:
                _enable_controllers(run_dirs[0], self._v2_controllers())
            for index, limits in enumerate(workers):
                leaf = tuple(directory / f"w{index}" for directory in run_dirs)
                for directory in leaf:
                    _mkdir(directory)
                leaves.append(leaf)
                self._limit(leaf, limits)
        except OSError:
            made = [str(d) for leaf in leaves for d in leaf] + [str(d) for d in run_dirs]
            with contextlib.suppress(OSError):
                remove_groups(made)
            raise
        return RunGroups(
            run_dirs=tuple(str(d) for d in run_dirs),
            leaves=tuple(tuple(str(d) for d in leaf) for leaf in leaves),
            memory_leaves=tuple(str(self._memory_dir(leaf)) for leaf in leaves),
            container_parents=tuple(
                f"/{self._relative}/{name}/w{index}" for index in range(len(leaves))
            ),
            version=self.layout.version,
            cleanup_dirs=tuple(
                str(mount / self._relative / name) for mount in self.layout.every_mount()
            ),
        )

    # ---- limits --------------------------------------------------------------------

    @property
    def _memory_limit_file(self) -> str:
        return "memory.max" if self.layout.version == 2 else "memory.limit_in_bytes"

    def _v2_controllers(self) -> tuple[str, ...]:
        available = set(self.layout.controllers)
        return tuple(c for c in V2_CONTROLLERS if c in available)

    def _memory_dir(self, directories: Sequence[Path]) -> Path:
        if self.layout.version == 2:
            return directories[0]
        assert self.layout.v1_mounts is not None
        memory_mount = self.layout.v1_mounts["memory"]
        return next(d for d in directories if memory_mount in d.parents)

    def _dir_of(self, directories: Sequence[Path], controller: str) -> Path | None:
        if self.layout.version == 2:
            return directories[0] if controller in self._v2_controllers() else None
        assert self.layout.v1_mounts is not None
        mount = self.layout.v1_mounts.get(controller)
        if mount is None:
            return None
        return next((d for d in directories if mount in d.parents), None)

    def _limit(self, leaf: Sequence[Path], limits: WorkerLimits) -> None:
        memory = self._memory_dir(leaf)
        if limits.memory_bytes is not None:
            _write(memory / self._memory_limit_file, str(limits.memory_bytes))
            # Swap counted with memory: a worker over its limit is stopped, not swapped.
            swap = "memory.swap.max" if self.layout.version == 2 else "memory.memsw.limit_in_bytes"
            swap_value = "0" if self.layout.version == 2 else str(limits.memory_bytes)
            if (memory / swap).exists():
                _write(memory / swap, swap_value)
        pids = self._dir_of(leaf, "pids")
        if limits.pids is not None and pids is not None:
            _write(pids / "pids.max", str(limits.pids))
        cpu = self._dir_of(leaf, "cpu")
        if limits.cpu_cores is not None and cpu is not None:
            period_us = limits.cpu_period_us
            quota_us = max(1000, round(limits.cpu_cores * period_us))
            if self.layout.version == 2:
                _write(cpu / "cpu.max", f"{quota_us} {period_us}")
            else:
                _write(cpu / "cpu.cfs_period_us", str(period_us))
                _write(cpu / "cpu.cfs_quota_us", str(quota_us))
        devices = self._dir_of(leaf, "devices") if self.layout.version == 1 else None
        if limits.device_rules is not None and devices is not None:
            _write(devices / "devices.deny", "a")
            for rule in limits.device_rules:
                _write(devices / "devices.allow", rule)


def _mkdir(path: Path) -> None:
    try:
        path.mkdir(exist_ok=True)
    except OSError as error:
        raise CgroupError(f"cannot make cgroup {path}: {error.strerror or error}") from None


def _write(path: Path, value: str) -> None:
    try:
        with open(path, "w", encoding="ascii") as file:
            file.write(value)
    except OSError as error:
        raise CgroupError(f"cannot write {value!r} to {path}: {error.strerror or error}") from None


def _enable_controllers(directory: Path, controllers: Sequence[str]) -> None:
    """v2: let `directory`'s children use `controllers` (those it already has are kept)."""
    enabled = set(_read_words(directory / "cgroup.subtree_control"))
    wanted = [c for c in controllers if c not in enabled]
    if wanted:
        _write(directory / "cgroup.subtree_control", " ".join(f"+{c}" for c in wanted))
