"""benchmarks/cpu_quota.py: the CFS quota a benchmark replica is held to, written where
cgroup v1 or v2 keeps it (a fake hierarchy in a temporary directory), and a clear error
where no CPU controller can be configured."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.cpu_quota import CpuQuota, QuotaUnavailable, cpu_quotas


def v1_hierarchy(root: Path) -> Path:
    cpu = root / "cpu"
    cpu.mkdir()
    (cpu / "cpu.cfs_quota_us").write_text("-1")
    return cpu


def test_a_share_of_a_core_is_a_quota_of_that_share_of_each_10_ms_period(tmp_path: Path) -> None:
    cpu = v1_hierarchy(tmp_path)
    quota = CpuQuota("replica-0", 0.5, root=tmp_path)
    assert (cpu / "replica-0" / "cpu.cfs_period_us").read_text() == "10000"
    assert (cpu / "replica-0" / "cpu.cfs_quota_us").read_text() == "5000"
    quota.enter(1234)
    assert (cpu / "replica-0" / "cgroup.procs").read_text() == "1234"


def test_a_share_under_a_tenth_of_a_core_takes_a_longer_period_at_the_least_quota(
    tmp_path: Path,
) -> None:
    cpu = v1_hierarchy(tmp_path)
    CpuQuota("replica-0", 0.03, root=tmp_path)
    period_us = int((cpu / "replica-0" / "cpu.cfs_period_us").read_text())
    quota_us = int((cpu / "replica-0" / "cpu.cfs_quota_us").read_text())
    assert quota_us == 1000  # the kernel refuses less than 1 ms
    assert quota_us / period_us == pytest.approx(0.03, rel=1e-3)


def test_cgroup_v2_takes_quota_and_period_in_cpu_max(tmp_path: Path) -> None:
    (tmp_path / "cgroup.subtree_control").write_text("cpuset cpu io memory pids\n")
    CpuQuota("replica-1", 1.5, root=tmp_path)
    assert (tmp_path / "replica-1" / "cpu.max").read_text() == "15000 10000"


def test_no_cpu_controller_is_a_clear_error_and_no_quota_asked_is_none(tmp_path: Path) -> None:
    (tmp_path / "cgroup.subtree_control").write_text("memory pids\n")
    with pytest.raises(QuotaUnavailable, match="no cgroup CPU controller"):
        CpuQuota("replica-0", 0.1, root=tmp_path)
    with pytest.raises(ValueError, match="above 0"):
        CpuQuota("replica-0", 0.0, root=tmp_path)
    with cpu_quotas("bench", 3, None) as quotas:
        assert quotas == [None, None, None]
