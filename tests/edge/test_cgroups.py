"""Where a host's cgroup controllers are, read from its mountinfo, and what a worker's
groups are made of on each layout (edge/sandbox/cgroups.py).

The kernel's own hierarchies are tried by tests/edge/test_hostile_jobs.py on this
machine's layout (v1 controllers beside an empty v2 tree); here the other layouts are
files in a directory shaped like a cgroup tree, so that what is written where, on v2
above all, is checked wherever the tests run."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge.sandbox.cgroup_files import oom_kills
from edge.sandbox.cgroups import (
    CgroupLayout,
    WorkerCgroups,
    WorkerLimits,
    parse_mountinfo,
)

MIB = 1024**2
HYBRID = """\
24 30 0:21 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
25 24 0:22 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec shared:10 - cgroup2 cgroup2 rw
26 24 0:23 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec shared:11 - cgroup cgroup rw,memory
27 24 0:24 / /sys/fs/cgroup/pids rw,nosuid,nodev,noexec shared:12 - cgroup cgroup rw,pids
28 24 0:25 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct
29 24 0:26 / /sys/fs/cgroup/devices rw,nosuid - cgroup cgroup rw,devices
"""


def test_a_hybrid_host_is_read_as_v1_with_every_hierarchy_to_clean(tmp_path: Path) -> None:
    layout = parse_mountinfo(HYBRID)
    assert layout is not None
    assert (layout.version, layout.hybrid) == (1, True)
    assert layout.v1_mounts is not None
    assert layout.v1_mounts["cpu"] == Path("/sys/fs/cgroup/cpu,cpuacct")
    assert Path("/sys/fs/cgroup/unified") in layout.every_mount()


def test_a_unified_host_with_memory_and_pids_is_read_as_v2(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    text = f"30 1 0:26 / {tmp_path} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
    layout = parse_mountinfo(text)
    assert layout == CgroupLayout(version=2, unified=tmp_path)


def test_a_host_without_the_memory_controller_has_no_layout_for_workers(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpu io\n")
    assert parse_mountinfo(f"30 1 0:26 / {tmp_path} rw - cgroup2 cgroup2 rw\n") is None


@pytest.fixture
def unified(tmp_path: Path) -> Path:
    """A v2 tree as files: the root's controllers and its subtree_control."""
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpu memory pids\n")
    (root / "cgroup.subtree_control").write_text("memory\n")
    return root


def test_on_v2_a_worker_gets_memory_cpu_and_pids_in_its_leaf(unified: Path) -> None:
    cgroups = WorkerCgroups(CgroupLayout(version=2, unified=unified), "greenfed")
    assert cgroups.limits == ("memory", "pids", "cpu")  # no devices file on v2
    cgroups.prepare_root(workers_memory_bytes=8000 * MIB)
    root = unified / "greenfed"
    assert (root / "memory.max").read_text() == str(8000 * MIB)
    # Controllers are handed down from the top: only those not yet enabled are asked.
    assert (unified / "cgroup.subtree_control").read_text() == "+pids +cpu"
    assert (root / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"

    groups = cgroups.create_run(
        "job-1", [WorkerLimits(memory_bytes=64 * MIB, cpu_cores=1.5, pids=100)]
    )
    leaf = root / "job-1" / "w0"
    assert (leaf / "memory.max").read_text() == str(64 * MIB)
    assert (leaf / "cpu.max").read_text() == "150000 100000"
    assert (leaf / "pids.max").read_text() == "100"
    assert groups.procs_files(0) == (f"{leaf}/cgroup.procs",)
    assert groups.oom_file(0) == f"{leaf}/memory.events"
    assert groups.memory_peak_file(0) is None  # memory.events counts kills below it too
    assert groups.container_parents == ("/greenfed/job-1/w0",)


def test_on_v1_each_controller_has_its_own_leaf_and_devices_are_ruled(tmp_path: Path) -> None:
    mounts = {name: tmp_path / name for name in ("memory", "pids", "cpu", "devices")}
    for mount in mounts.values():
        mount.mkdir()
    layout = CgroupLayout(version=1, v1_mounts=mounts, v1_all_mounts=tuple(mounts.values()))
    cgroups = WorkerCgroups(layout)
    cgroups.prepare_root(workers_memory_bytes=None)
    groups = cgroups.create_run(
        "job-2",
        [
            WorkerLimits(
                memory_bytes=MIB * 512, cpu_cores=2.0, pids=64, device_rules=("c 195:1 rwm",)
            ),
            WorkerLimits(memory_bytes=None, cpu_cores=None, pids=64),
        ],
    )
    first = {name: mount / "greenfed" / "job-2" / "w0" for name, mount in mounts.items()}
    assert (first["memory"] / "memory.limit_in_bytes").read_text() == str(512 * MIB)
    assert (first["cpu"] / "cpu.cfs_quota_us").read_text() == "200000"
    assert (first["pids"] / "pids.max").read_text() == "64"
    assert (first["devices"] / "devices.deny").read_text() == "a"
    assert (first["devices"] / "devices.allow").read_text() == "c 195:1 rwm"  # the last rule
    second = mounts["memory"] / "greenfed" / "job-2" / "w1"
    assert not (second / "memory.limit_in_bytes").exists()  # asked nothing: not limited
    assert set(groups.procs_files(1)) == {
        f"{mount}/greenfed/job-2/w1/cgroup.procs" for mount in mounts.values()
    }
    assert groups.memory_peak_file(0) == f"{first['memory']}/memory.max_usage_in_bytes"


@pytest.mark.parametrize(("version", "file"), [(1, "cpu.cfs_quota_us"), (2, "cpu.max")])
def test_a_share_of_a_core_can_be_held_over_a_shorter_period(
    tmp_path: Path, version: int, file: str
) -> None:
    # What benchmarks/ingest.py holds each replica to: 3 % of a core, 1 ms every 33 ms
    # (the kernel's least quota), a share of a 10 ms period above a tenth of a core.
    if version == 2:
        (tmp_path / "cgroup.controllers").write_text("cpu memory pids\n")
        (tmp_path / "cgroup.subtree_control").write_text("")
        layout = CgroupLayout(version=2, unified=tmp_path)
        leaves = [tmp_path / "greenfed" / "bench" / f"w{index}" for index in range(2)]
    else:
        mounts = {name: tmp_path / name for name in ("memory", "pids", "cpu")}
        for mount in mounts.values():
            mount.mkdir()
        layout = CgroupLayout(version=1, v1_mounts=mounts, v1_all_mounts=tuple(mounts.values()))
        leaves = [mounts["cpu"] / "greenfed" / "bench" / f"w{index}" for index in range(2)]
    cgroups = WorkerCgroups(layout)
    cgroups.prepare_root(workers_memory_bytes=None)
    cgroups.create_run(
        "bench",
        [
            WorkerLimits(memory_bytes=None, cpu_cores=0.03, pids=None, cpu_period_us=33_334),
            WorkerLimits(memory_bytes=None, cpu_cores=0.5, pids=None, cpu_period_us=10_000),
        ],
    )
    written = [(leaf / file).read_text() for leaf in leaves]
    if version == 1:
        periods = [(leaf / "cpu.cfs_period_us").read_text() for leaf in leaves]
        assert (written, periods) == (["1000", "5000"], ["33334", "10000"])
    else:
        assert written == ["1000 33334", "5000 10000"]


def test_out_of_memory_kills_are_counted_from_either_file(tmp_path: Path) -> None:
    v2 = tmp_path / "memory.events"
    v2.write_text("low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n")
    v1 = tmp_path / "memory.oom_control"
    v1.write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert (oom_kills(str(v2)), oom_kills(str(v1)), oom_kills(str(tmp_path / "gone"))) == (1, 2, 0)
