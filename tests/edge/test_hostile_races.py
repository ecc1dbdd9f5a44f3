"""Hostile jobs that race the agent, or name what the sandbox hides, against a real node:
real users, cgroups, bubblewrap and podman (tests/support/sandboxed_node.py).

Root works beside a tenant's running jobs, which share the tenant's uid: whatever root
does by a path a job may change (a link swapped in where root made a directory, a
working_dir swapped for a link after it was checked) must not hand the job a file or a
directory of the host. A working_dir above what the sandbox hides must not bring it
back. And a worker whose wrapper died while no agent ran is cleaned up after all.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from edge.sandbox.bubblewrap import sandbox_argv
from edge.sandbox.users import WorkUser
from edge.training.process import ProcessRun
from edge.training.worker_record import boot_id, is_alive
from shared.sealing import SealedSecrets
from tests.support.sandboxed_node import (
    SandboxedNode,
    build_test_image,
    make_node,
    require_isolation_tools,
    run_record,
)
from tests.support.system_tools import find_tool
from tests.support.waiting import eventually

HIDDEN_TEXT = "what-the-sandbox-hides-5d1c"


def _tenant(node: SandboxedNode, tenant: str = "tenant-a") -> WorkUser:
    assert node.setup.users is not None
    return node.setup.users.for_tenant(tenant)


def _as_user(user: WorkUser, script: str) -> int:
    """Run `script` as the tenant's uid (what its running jobs may do); its exit code."""
    setpriv = find_tool("setpriv")
    assert setpriv is not None
    as_user = [setpriv, f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups", "--"]
    done = subprocess.run(
        [*as_user, "/bin/sh", "-c", script],
        capture_output=True,
        check=False,
        timeout=30,
    )
    return done.returncode


# ---- links a tenant's running job lays where root works ---------------------------------


async def test_root_never_follows_a_link_a_tenants_job_swaps_into_a_new_work_directory(
    node: SandboxedNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent makes w0 and w0/tmp for a new worker and gives them to the tenant's
    uid, which the tenant's other jobs, running already, share. Right after root makes
    `tmp`, such a job swaps it for a link to a host file (the reviewer's racer did it in
    the window between root's mkdir and chown): root must never give it that file."""
    user = _tenant(node)
    target = node.root / "root-only-target"
    target.write_text("root's own\n")
    target.chmod(0o600)
    precious = node.root / "precious"
    precious.mkdir(mode=0o700)
    (precious / "keep").write_text("root's directory\n")
    name = f"JRACE{uuid.uuid4().hex[:6].upper()}-1"
    run_dir = node.data_dir / "work" / name
    # An earlier start of this attempt that never ran left its run directory, with links
    # in the tenant's work directory: removing it must not follow them either.
    (run_dir / "w0").mkdir(parents=True)
    os.chown(run_dir / "w0", user.uid, user.gid)
    (run_dir / "w0" / "tmp").symlink_to(target)
    (run_dir / "w0" / "data").symlink_to(precious)

    swaps: list[int] = []
    real_mkdir = os.mkdir

    def mkdir_then_the_tenant_swaps(path: Any, mode: int = 0o777, *, dir_fd: Any = None) -> None:
        real_mkdir(path, mode, dir_fd=dir_fd)
        made = Path(path)
        if dir_fd is not None:
            made = Path(os.readlink(f"/proc/self/fd/{dir_fd}")) / path
        if made.name == "tmp" and made.parent.parent == run_dir:
            swaps.append(_as_user(user, f"mv {made} {made}.moved && ln -s {target} {made}"))

    monkeypatch.setattr(os, "mkdir", mkdir_then_the_tenant_swaps)
    spec = node.worker("true", job_id=name.removesuffix("-1"))
    try:
        plan = node.launcher.sandbox.plan(
            spec, SealedSecrets(), name=name, started_file=node.data_dir / "jobs" / "s"
        )
    finally:
        monkeypatch.undo()
    assert swaps, "the tenant never got its turn"
    assert os.stat(target).st_uid == 0, "root gave a host file to the tenant"
    assert os.stat(target).st_gid == 0
    assert (precious / "keep").exists()
    assert swaps == [1]  # the work directory was still root's: the swap failed
    tmp = run_dir / "w0" / "tmp"
    assert not tmp.is_symlink()
    assert (tmp.stat().st_uid, (run_dir / "w0").stat().st_uid) == (user.uid, user.uid)
    assert plan["remove_paths"][0] == str(run_dir)


async def test_a_working_dir_swapped_for_a_link_after_its_check_leads_nowhere(
    node: SandboxedNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job's working_dir is checked when the worker is planned (no link, a
    directory its user may reach); a job of the tenant's, running meanwhile, swaps it
    for a link to a directory behind one closed to it. Root must not enter it for the
    worker: the worker enters its working_dir itself, as its user."""
    user = _tenant(node)
    closed = node.root / "closed"
    behind = closed / "open"
    behind.mkdir(parents=True)
    closed.chmod(0o700)
    behind.chmod(0o755)
    (behind / "secret.txt").write_text(f"{HIDDEN_TEXT}\n")
    scratch = node.root / "scratch"  # the tenant's own: its jobs may rename in it
    (scratch / "run").mkdir(parents=True)
    for path in (scratch, scratch / "run"):
        os.chown(path, user.uid, user.gid)
    working_dir = scratch / "run"
    sandbox = node.launcher.sandbox
    real_plan = sandbox.plan

    def plan_then_the_tenant_swaps(*args: Any, **kwargs: Any) -> Any:
        planned = real_plan(*args, **kwargs)
        assert _as_user(user, f"mv {working_dir} {working_dir}.old") == 0
        # Relative: it leads to the same directory inside a sandbox as outside.
        assert _as_user(user, f"ln -s ../closed/open {working_dir}") == 0
        return planned

    monkeypatch.setattr(sandbox, "plan", plan_then_the_tenant_swaps)
    spec = node.worker("cat secret.txt; pwd", working_dir=str(working_dir))
    status, output = await node.run(spec)
    assert HIDDEN_TEXT not in output
    assert status.state == "failed", output
    assert "Permission denied" in output, output  # `env --chdir`, as the work user


# ---- a working_dir above what the sandbox hides ------------------------------------------


async def test_a_job_cannot_read_hidden_files_through_a_parent_working_dir(
    sandbox_node: SandboxedNode,
) -> None:
    """The agent's data directory is replaced by an empty one in a sandbox; a file in
    it anyone may read by its name is then hidden by that alone. Bound writable over
    the view, `/` or a parent of the data directory brought it (and the host's /proc
    and /tmp) back: such a working_dir is refused, saying why."""
    node = sandbox_node
    exposed = node.data_dir / "operator-note.txt"
    exposed.write_text(f"{HIDDEN_TEXT}\n")
    exposed.chmod(0o644)
    script = f"cat {exposed}; ls /proc | grep -c '^[0-9]'"
    status, output = await node.run(node.worker(script))  # no working_dir: hidden
    assert HIDDEN_TEXT not in output
    for working_dir in ("/", "/var/lib", str(node.root)):
        status, output = await node.run(node.worker(script, working_dir=working_dir))
        assert HIDDEN_TEXT not in output
        assert status.state == "failed"
        assert status.reason.startswith(
            f"working_dir {working_dir} holds what a sandbox hides or replaces (the agent's "
            "private files"
        ), status.reason


async def test_the_stand_ins_cover_a_working_dir_of_slash_were_one_let_through(
    sandbox_node: SandboxedNode,
) -> None:
    """Defence in depth: the sandbox itself, given `/` as the job's working_dir, still
    hides the agent's files, /proc and the host's /tmp (every stand-in is mounted over
    the working_dir). Run with bubblewrap directly, past the launcher's refusal."""
    node = sandbox_node
    user = _tenant(node)
    (node.data_dir / "operator-note.txt").write_text(f"{HIDDEN_TEXT}\n")
    (node.data_dir / "operator-note.txt").chmod(0o644)
    host_tmp = Path("/tmp") / f"greenfed-host-tmp-{uuid.uuid4().hex[:8]}"
    host_tmp.write_text(f"{HIDDEN_TEXT}\n")
    host_tmp.chmod(0o644)
    work_dir = node.root / "w0"
    work_dir.mkdir(mode=0o700)
    os.chown(work_dir, user.uid, user.gid)
    assert node.setup.isolation.bubblewrap is not None
    script = (
        f"cat {node.data_dir}/operator-note.txt {host_tmp}; "
        "echo processes=$(ls /proc | grep -c '^[0-9]'); pwd"
    )
    argv = sandbox_argv(
        ("/bin/sh", "-c", script),
        bubblewrap=node.setup.isolation.bubblewrap,
        user=user,
        work_dir=str(work_dir),
        working_dir="/",
        hidden_dirs=[str(d) for d in node.setup.private.directories],
        hidden_files=[str(f) for f in node.setup.private.files],
        devices=(),
        moved_env={},
    )
    try:
        done = await asyncio.to_thread(
            subprocess.run, argv, capture_output=True, text=True, timeout=30, check=False
        )
    finally:
        host_tmp.unlink()
    output = done.stdout + done.stderr
    assert HIDDEN_TEXT not in output
    assert output.count("No such file") == 2, output
    processes = int(output.split("processes=")[1].split()[0])
    assert processes < 10, output  # the sandbox's own /proc, not the host's
    assert done.stdout.splitlines()[-1] == "/", output  # and it did start in `/`


# ---- a wrapper that died while no agent ran -----------------------------------------------


async def test_a_withdrawn_worker_whose_wrapper_died_while_no_agent_ran_is_cleaned_up(
    node: SandboxedNode,
) -> None:
    """Its wrapper was killed (out of memory, kill -9) while no agent ran, and its job
    was withdrawn meanwhile: the next agent, told nothing of it, still kills what it
    left running and removes its cgroups and work directory."""
    spec = node.worker("sleep 300 & echo ready; wait")
    run = node.prepare(spec)
    assert isinstance(run, ProcessRun)
    task = asyncio.create_task(run.run())
    await eventually(lambda: "ready" in node.output(spec), timeout_s=30)
    task.cancel()  # the agent stops: its worker goes on
    with pytest.raises(asyncio.CancelledError):
        await task
    record = run_record(node, spec)
    assert record["boot_id"] == boot_id()
    os.kill(record["pid"], signal.SIGKILL)  # its wrapper dies while no agent runs
    await eventually(
        lambda: not is_alive(record["pid"], record["process_started"], record["boot_id"])
    )
    uid = _tenant(node).uid
    if node.setup.isolation.level == "user":  # a sandbox dies with its wrapper
        assert node.processes_of(uid)  # the worker's processes run on, unwatched
    work_dir = node.data_dir / "work" / f"{spec.job_id}-{spec.attempt}"
    assert work_dir.exists()

    (leftover,) = node.launcher.leftovers(set())  # the next agent's desired lacks it
    following = asyncio.create_task(leftover.run())
    await asyncio.wait_for(leftover.stop("not wanted"), 30)
    await asyncio.wait_for(following, 30)
    assert leftover.status.state == "stopped"
    await eventually(lambda: not node.processes_of(uid), message="its processes stayed")
    assert node.cgroup_dirs_left() == []
    assert not work_dir.exists()
    # Cleaned up once: the agent after that finds nothing left to do.
    assert node.launcher.leftovers(set()) == []


async def test_a_worker_stopped_while_its_wrapper_is_spawned_never_runs(
    sandbox_node: SandboxedNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cloud's withdraw arrives while the wrapper is being spawned: the stop finds
    no process to signal yet. The worker must not then run to its end."""
    node = sandbox_node
    spec = node.worker("echo started; sleep 60; echo RAN-TO-ITS-END")
    run = node.prepare(spec)
    assert isinstance(run, ProcessRun)
    real_spawn = asyncio.create_subprocess_exec
    stops: list[asyncio.Task[None]] = []

    async def spawn_while_stopped(*args: Any, **kwargs: Any) -> Any:
        stops.append(asyncio.create_task(run.stop("withdrawn by the cloud")))
        await asyncio.sleep(0)  # the stop gets its turn at this await
        return await real_spawn(*args, **kwargs)

    monkeypatch.setattr(asyncio, "create_subprocess_exec", spawn_while_stopped)
    task = asyncio.create_task(run.run())
    try:
        await asyncio.wait_for(asyncio.shield(task), 20)
        await asyncio.wait_for(stops[0], 5)
    finally:
        if not task.done() and run.pid is not None:
            os.killpg(run.pid, signal.SIGKILL)
    assert (run.status.state, run.status.reason) == ("stopped", "withdrawn by the cloud")
    assert "started" not in node.output(spec)
    assert node.cgroup_dirs_left() == []
    assert not (node.data_dir / "work" / f"{spec.job_id}-{spec.attempt}").exists()


# ---- a container beside another job of its user -----------------------------------------------


async def test_a_container_starts_while_another_job_of_its_user_runs_more_than_its_pids_limit(
    tmp_path: Path,
) -> None:
    """RLIMIT_NPROC counts every process of the uid on the host: with the pids limit as
    its nproc ulimit, a container of a user whose other job ran more processes could
    not start (`exec /run/podman-init: resource temporarily unavailable`)."""
    require_isolation_tools(containers=True)
    image = build_test_image(tmp_path)
    nodes = make_node("sandbox", worker_user="71234")  # every tenant one uid
    node = next(nodes)
    try:
        busy = node.worker(
            "for i in $(seq 40); do sleep 60 & done; echo ready; wait", tenant="tenant-a"
        )
        run = node.prepare(busy)
        task = asyncio.create_task(run.run())
        await eventually(lambda: "ready" in node.output(busy), timeout_s=30)
        container = node.worker(
            "echo container-ran",
            image=image,
            image_pull_policy="never",
            tenant="tenant-b",
            pids_limit=32,
        )
        status, output = await node.run(container)
        assert (status.state, status.reason) == ("succeeded", ""), output
        assert "container-ran" in output
        await asyncio.wait_for(run.stop("test over"), 30)
        await task
    finally:
        for _ in nodes:
            pass
