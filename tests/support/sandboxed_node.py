"""A real training node for isolation tests: the agent's launcher with the host's own
mechanisms (root, setpriv, bubblewrap, cgroups, podman), its data directory and
settings file where an agent keeps them (outside /tmp, which a sandbox replaces anyway,
so that hiding them is what is tested), and cgroups of its own that are removed after.

These need root and Debian's bubblewrap (and podman for containers): missing, they
skip the test on a laptop and fail it in CI (GREENFED_TEST_REQUIRE_SERVICES=1)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tarfile
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import msgspec

from edge.sandbox import cgroup_files
from edge.sandbox.launcher import Sandbox
from edge.sandbox.setup import JOBS_DIR, TrainingSetup, set_up_training
from edge.training.logs import tail_lines
from edge.training.process import ProcessLauncher
from edge.training.runs import RunStatus, TrainingRun
from shared.messages import Accelerator, DesiredTraining
from shared.settings import AgentSettings, MqttSettings, Settings
from tests.support.brokers import require_or_skip
from tests.support.system_tools import find_tool

TESTS_ROOT: Final = Path("/var/lib/greenfed-tests")
SETTINGS_PASSWORD: Final = "node-mqtt-password-4f1e"
TEST_IMAGE: Final = "localhost/greenfed-test:busybox"
BUSYBOX_COMMANDS: Final = ("sh", "id", "cat", "ls", "sleep", "echo", "env", "dd", "kill", "head")


def require_isolation_tools(*, containers: bool = False) -> None:
    if os.geteuid() != 0:
        require_or_skip("isolation tests need root (the agent's privilege model)")
    for tool, package in (("bwrap", "bubblewrap"), ("setpriv", "util-linux")):
        if find_tool(tool) is None:
            require_or_skip(f"{tool} is not installed (Debian package {package!r})")
    if containers:
        for tool, package in (("podman", "podman"), ("busybox", "busybox-static")):
            if find_tool(tool) is None:
                require_or_skip(f"{tool} is not installed (Debian package {package!r})")


@dataclass
class SandboxedNode:
    root: Path
    settings: Settings
    config_path: Path
    setup: TrainingSetup
    launcher: ProcessLauncher

    @property
    def data_dir(self) -> Path:
        return self.setup.data_dir

    def worker(self, script: str, **fields: Any) -> DesiredTraining:
        values: dict[str, Any] = {
            "job_id": f"J{uuid.uuid4().hex[:12].upper()}",
            "attempt": 1,
            "command": ("sh", "-c", script),
            "tenant": "tenant-a",
            "grace_period_s": 2.0,
        }
        values.update(fields)
        return DesiredTraining(**values)

    def prepare(self, spec: DesiredTraining) -> TrainingRun:
        return self.launcher.prepare(spec)

    async def run(self, spec: DesiredTraining, timeout_s: float = 60.0) -> tuple[RunStatus, str]:
        """Run the worker to its end: (its status, what it printed)."""
        run = self.prepare(spec)
        await asyncio.wait_for(run.run(), timeout_s)
        return run.status, self.output(spec)

    def output(self, spec: DesiredTraining) -> str:
        path = self.launcher.log_path(spec.job_id, spec.attempt)
        return "\n".join(tail_lines(path, 1000))

    def processes_of(self, uid: int) -> list[int]:
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if entry.stat().st_uid == uid:
                        found.append(int(entry.name))
                except FileNotFoundError:
                    continue
        return found

    def cgroup_dirs_left(self) -> list[str]:
        isolation = self.setup.isolation
        assert isolation.cgroups is not None
        return [str(p) for root in isolation.cgroups.roots for p in root.iterdir() if p.is_dir()]


def make_node(
    isolation: str = "sandbox",
    *,
    inventory: Sequence[Accelerator] = (),
    dev_root: Path | None = None,
    **agent: Any,
) -> Iterator[SandboxedNode]:
    """A node of its own under TESTS_ROOT (a generator for a fixture: removed after)."""
    TESTS_ROOT.mkdir(mode=0o755, exist_ok=True)
    root = TESTS_ROOT / uuid.uuid4().hex[:10]
    root.mkdir(mode=0o711)
    config_path = root / "agent.toml"
    # What `greenfed edge enrol` writes: the node's broker password, owner-only.
    config_path.write_text(f'[mqtt]\npassword = "{SETTINGS_PASSWORD}"\n', encoding="utf-8")
    config_path.chmod(0o600)
    settings = Settings(
        mqtt=MqttSettings(password=SETTINGS_PASSWORD),
        agent=AgentSettings(
            data_dir=str(root / "data"),
            isolation=isolation,  # type: ignore[arg-type]
            cgroup_root=f"greenfed-test-{root.name}",
            site="cloud",
            **agent,
        ),
    )
    setup = set_up_training(settings, config_path)
    sandbox = setup.sandbox(tuple(inventory), settings.agent.worker_pids_limit)
    if dev_root is not None:
        sandbox = Sandbox(
            setup.isolation,
            inventory=inventory,
            work_root=setup.work_root,
            credentials_dir=setup.data_dir / "credentials",
            users=setup.users,
            private=setup.private,
            default_pids=settings.agent.worker_pids_limit,
            dev_root=dev_root,
        )
    launcher = ProcessLauncher(
        setup.data_dir / JOBS_DIR,
        sandbox=sandbox,
        node_id="node-1",
        sealing_key=setup.sealing_key,
    )
    try:
        yield SandboxedNode(root, settings, config_path, setup, launcher)
    finally:
        if setup.isolation.cgroups is not None:
            roots = [str(r) for r in setup.isolation.cgroups.roots]
            every = [
                str(mount / f"greenfed-test-{root.name}")
                for mount in setup.isolation.cgroups.layout.every_mount()
            ]
            cgroup_files.kill_all_and_wait(roots)
            cgroup_files.remove_groups([*roots, *every])
        shutil.rmtree(root, ignore_errors=True)


def build_test_image(work: Path) -> str:
    """A tiny image made offline: a rootfs of Debian's busybox-static, `podman import`ed
    (no registry is reachable). Made once per machine; the name is returned."""
    podman = find_tool("podman")
    assert podman is not None
    exists = subprocess.run([podman, "image", "exists", TEST_IMAGE], check=False)
    if exists.returncode == 0:
        return TEST_IMAGE
    busybox = find_tool("busybox")
    assert busybox is not None
    rootfs = work / "rootfs"
    for directory in ("bin", "tmp", "etc", "proc", "sys", "dev"):
        (rootfs / directory).mkdir(parents=True, exist_ok=True)
    shutil.copy(busybox, rootfs / "bin" / "busybox")
    for command in BUSYBOX_COMMANDS:
        (rootfs / "bin" / command).symlink_to("busybox")
    (rootfs / "tmp").chmod(0o1777)
    archive = work / "rootfs.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(rootfs, arcname=".")
    subprocess.run(
        [podman, "import", "--change", "CMD=/bin/sh", str(archive), TEST_IMAGE],
        check=True,
        capture_output=True,
    )
    return TEST_IMAGE


def run_record(node: SandboxedNode, spec: DesiredTraining) -> dict[str, Any]:
    """The worker's record as the agent keeps it on disk (what a restarted agent reads)."""
    path = node.data_dir / JOBS_DIR / f"{spec.job_id}-{spec.attempt}.run"
    decoded: dict[str, Any] = msgspec.json.decode(path.read_bytes())
    return decoded
