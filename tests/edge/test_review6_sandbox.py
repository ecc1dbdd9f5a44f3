"""What a job leaves in temporary directories and IPC at isolation `user` goes with it
(review 6), as it does in a sandbox: a tenant's jobs cannot fill the host's RAM-backed
/dev/shm, /tmp, /var/tmp or SysV shared memory run after run, charged to the workers'
memory, until later workers of every tenant are killed for memory. And a job whose
command or environment holds a NUL byte ends saying so, not "exit code 1"."""

from __future__ import annotations

import asyncio
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from edge.sandbox.launcher import PrivatePaths, Sandbox
from edge.sandbox.probe import NodeIsolation
from edge.sandbox.users import WorkUsers
from edge.training.logs import tail_lines
from edge.training.process import ProcessRun
from shared.messages import DesiredTraining
from shared.sealing import SealedSecrets, public_key_text, seal
from tests.support.launchers import plain_launcher
from tests.support.sandboxed_node import SandboxedNode, make_node, require_isolation_tools

MIB = 1024 * 1024
LEFT_IN_SHM_MIB = 120
SHARED_TMP = ("/tmp", "/var/tmp", "/dev/shm")
# SysV objects made with a key of the test's own, so that the test finds its own only.
SYSV_KINDS = ("shm", "sem", "msg")


@pytest.fixture
def user_node() -> Iterator[SandboxedNode]:
    require_isolation_tools()
    yield from make_node("user")


def leaving_behind(marker: str, key: int) -> str:
    """A job that leaves files in every shared temporary directory (RAM in /dev/shm)
    and a SysV shared memory segment, semaphore set and message queue of `key`."""
    files = "; ".join(f"echo left > {d}/{marker}" for d in SHARED_TMP)
    return (
        f"{files}; "
        f"dd if=/dev/zero of=/dev/shm/{marker}-big bs=1M count={LEFT_IN_SHM_MIB} 2>/dev/null; "
        "/usr/bin/python3 -c 'import ctypes; libc = ctypes.CDLL(None); "
        f"print(libc.shmget({key}, 4 * 1024 * 1024, 0o1666), libc.semget({key}, 1, 0o1666), "
        f"libc.msgget({key}, 0o1666))'; "
        f"ls /tmp/{marker} /var/tmp/{marker} /dev/shm/{marker}"
    )


def sysv_keys() -> dict[str, set[int]]:
    """The keys of the host's SysV IPC objects, by kind (/proc/sysvipc: the host's own
    IPC namespace, which the test runs in)."""
    keys: dict[str, set[int]] = {}
    for kind in SYSV_KINDS:
        lines = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()[1:]
        keys[kind] = {int(line.split()[0]) for line in lines}
    return keys


def files_named(marker: str) -> list[str]:
    """The host's files in its shared temporary directories whose names start so."""
    return [
        str(path)
        for directory in SHARED_TMP
        for path in Path(directory).iterdir()
        if path.name.startswith(marker)
    ]


def workers_memory_bytes(node: SandboxedNode) -> int:
    cgroups = node.setup.isolation.cgroups
    assert cgroups is not None
    for root in cgroups.roots:
        for name in ("memory.current", "memory.usage_in_bytes"):  # cgroup v2, v1
            if (root / name).exists():
                return int((root / name).read_text())
    raise AssertionError("the workers' root group has no memory controller")


async def test_a_job_at_user_level_leaves_nothing_in_the_hosts_tmp_shm_or_ipc(
    user_node: SandboxedNode,
) -> None:
    assert user_node.setup.isolation.private_tmp, user_node.setup.isolation.note
    marker = f"greenfed-review6-{secrets.token_hex(6)}"
    key = 0x6E000000 + secrets.randbelow(0xFFFFFF)
    memory_before = workers_memory_bytes(user_node)
    for attempt in (1, 2, 3):  # run after run, as a tenant would
        status, output = await user_node.run(
            user_node.worker(
                leaving_behind(marker, key), attempt=attempt, host_memory_bytes=512 * MIB
            )
        )
        assert status.state == "succeeded", (status.reason, output)
        assert "-1" not in output.split(), output  # every IPC object was made
        assert f"/dev/shm/{marker}" in output  # it could use them while it ran
    assert await asyncio.to_thread(files_named, marker) == []
    for kind, keys in sysv_keys().items():
        assert key not in keys, f"a SysV {kind} object of the job outlived it"
    # Nothing of it stays charged to the workers, who would be killed for it later.
    assert workers_memory_bytes(user_node) - memory_before < LEFT_IN_SHM_MIB * MIB // 2


async def test_a_job_at_user_level_gets_empty_private_tmp_sized_by_its_memory(
    user_node: SandboxedNode,
) -> None:
    """The host's files are not there, and each of its temporary directories holds at
    most its memory limit."""
    others = Path("/tmp") / f"greenfed-review6-host-{secrets.token_hex(6)}"
    others.write_text("the host's", encoding="utf-8")
    try:
        script = (
            f"test -e {others} && echo SEES-HOST; "
            "for d in /tmp /var/tmp /dev/shm; do "
            "/usr/bin/python3 -c 'import os, sys; s = os.statvfs(sys.argv[1]); "
            "print(sys.argv[1], s.f_blocks * s.f_frsize)' $d; done"
        )
        status, output = await user_node.run(user_node.worker(script, host_memory_bytes=256 * MIB))
    finally:
        others.unlink()
    assert status.state == "succeeded", (status.reason, output)
    assert "SEES-HOST" not in output
    for directory in SHARED_TMP:
        assert f"{directory} {256 * MIB}" in output, output


def user_sandbox(work_root: Path, *, private_tmp: bool) -> Sandbox:
    """Nothing is made on disk until a worker's plan is."""
    isolation = NodeIsolation("user", "test", private_tmp=private_tmp)
    return Sandbox(
        isolation,
        inventory=(),
        work_root=work_root,
        credentials_dir=work_root.parent / "credentials",
        users=WorkUsers(),
        private=PrivatePaths(directories=(Path("/var/lib/greenfed"),)),
    )


def test_a_working_dir_in_tmp_is_refused_where_workers_get_a_private_one() -> None:
    """Mounted over, the host's /tmp/scratch is not there for the worker."""
    spec = DesiredTraining(
        job_id="J1", attempt=1, command=("python", "train.py"), working_dir="/tmp/scratch"
    )
    work_root = Path("/var/lib/greenfed/work")
    assert user_sandbox(work_root, private_tmp=True).refusal(spec) == (
        "working_dir /tmp/scratch is inside /tmp, which every worker on this node gets a "
        "private one of"
    )
    assert user_sandbox(work_root, private_tmp=False).refusal(spec) == ""


def test_a_work_root_inside_tmp_stays_reachable(tmp_path: Path) -> None:
    """A node whose data directory lies in /tmp (a developer's) keeps /tmp shared: the
    worker could not reach its work directory under a tmpfs laid over it."""
    assert str(tmp_path).startswith("/tmp/")
    sandbox = user_sandbox(tmp_path / "work", private_tmp=True)
    assert (
        sandbox.refusal(
            DesiredTraining(job_id="J1", attempt=1, command=("x",), working_dir="/tmp/scratch")
        )
        == ""
    )


def with_nul(field: str, spec: DesiredTraining, key: X25519PrivateKey) -> DesiredTraining:
    if field == "env":
        return msgspec.structs.replace(spec, env={"GREETING": "a\0b"})
    if field == "command":
        return msgspec.structs.replace(spec, command=(sys.executable, "-c", "print('a\0b')"))
    sealed = seal(
        SealedSecrets(env={"TOKEN": "s3\0cret"}),
        public_key_text(key),
        node_id="node-1",
        job_id=spec.job_id,
        attempt=spec.attempt,
    )
    return msgspec.structs.replace(spec, secret_names=("TOKEN",), sealed_secrets=sealed)


@pytest.mark.parametrize("field", ["env", "command", "secret_env"])
async def test_a_nul_byte_in_the_command_or_environment_ends_the_run_saying_so(
    tmp_path: Path, field: str
) -> None:
    key = X25519PrivateKey.generate()
    launcher = plain_launcher(tmp_path, sealing_key=key, node_id="node-1")
    spec = DesiredTraining(job_id="J1", attempt=1, command=(sys.executable, "-c", "print(1)"))
    run = launcher.prepare(with_nul(field, spec, key))
    assert isinstance(run, ProcessRun), getattr(run, "reason", run)
    await asyncio.wait_for(run.run(), 30)
    assert run.status.state == "failed"
    assert run.status.reason.startswith("cannot start: its command or environment holds"), (
        run.status.reason
    )
    assert "null byte" in run.status.reason
    assert "null byte" in "\n".join(tail_lines(launcher.log_path("J1", 1), 10))
