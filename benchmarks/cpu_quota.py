"""A benchmark process held to a share of one core, as if it had a machine of that
size to itself: a Linux CPU cgroup with a CFS quota (cgroup v1's `cpu` controller,
or cgroup v2's `cpu.max`). Needs root, or a cgroup delegated to the caller.

Why: scaling across processes (control-plane replicas sharing telemetry) cannot be
shown on a machine with fewer cores than the processes need, where every replica added
takes CPU from the others, the broker and the publisher. Held to a fixed share each,
N replicas have N times one replica's CPU, as N small machines would, and the rest of
the machine is left to the broker and the publisher.

The period is short (10 ms) so that a throttled process waits milliseconds, not the
default 100 ms period's tens of milliseconds, between its turns: a socket's buffer
holds what arrives meanwhile.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 10_000


class QuotaUnavailable(RuntimeError):
    """No CPU controller this process may configure."""


def _v1_cpu_root(root: Path) -> Path | None:
    for name in ("cpu", "cpu,cpuacct"):
        if (root / name / "cpu.cfs_quota_us").exists():
            return root / name
    return None


def _v2_root(root: Path) -> Path | None:
    controllers = root / "cgroup.subtree_control"
    if controllers.exists() and "cpu" in controllers.read_text().split():
        return root
    return None


class CpuQuota:
    """A cgroup holding its processes to `cores` of one core (0 < cores)."""

    def __init__(self, name: str, cores: float, *, root: Path = CGROUP_ROOT) -> None:
        if not cores > 0:
            raise ValueError(f"cores must be above 0, not {cores}")
        self.cores = cores
        v1 = _v1_cpu_root(root)
        v2 = None if v1 is not None else _v2_root(root)
        if v1 is None and v2 is None:
            raise QuotaUnavailable(
                f"no cgroup CPU controller under {root}: neither v1's cpu/cpu.cfs_quota_us "
                "nor v2's cgroup.subtree_control with cpu"
            )
        self.path = (v1 or v2 or root) / name
        # The kernel's least quota is 1 ms: a share under 0.1 core takes a longer period.
        period_us = max(PERIOD_US, math.ceil(1000 / cores))
        quota_us = round(cores * period_us)
        try:
            self.path.mkdir(exist_ok=True)
            if v1 is not None:
                (self.path / "cpu.cfs_period_us").write_text(str(period_us))
                (self.path / "cpu.cfs_quota_us").write_text(str(quota_us))
            else:
                (self.path / "cpu.max").write_text(f"{quota_us} {period_us}")
        except OSError as error:
            raise QuotaUnavailable(f"cannot configure {self.path}: {error}") from error

    def enter(self, pid: int | None = None) -> None:
        """Move `pid` (this process by default) and its later threads into the quota."""
        (self.path / "cgroup.procs").write_text(str(pid or os.getpid()))

    def remove(self) -> None:
        """Delete the cgroup (its processes must have ended)."""
        with contextlib.suppress(OSError):
            self.path.rmdir()


@contextlib.contextmanager
def cpu_quotas(prefix: str, count: int, cores: float | None) -> Iterator[list[CpuQuota | None]]:
    """`count` quotas of `cores` each (None: no quota, a list of None), removed after."""
    if cores is None:
        yield [None] * count
        return
    quotas = [CpuQuota(f"{prefix}-{index}", cores) for index in range(count)]
    try:
        yield list(quotas)
    finally:
        for quota in quotas:
            quota.remove()
