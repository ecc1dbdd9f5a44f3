"""Hostile jobs against a real node: real processes, real users, real cgroups, real
bubblewrap sandboxes and podman containers (issue 24).

Every attack a tenant's code can make on the node it runs on is tried at both levels
a node may give (`sandbox` and `user`): reading the agent's settings, keys and data,
another job's files, the agent's environment; signalling or tracing the agent or
another job; a fork bomb; memory past the limit; GPUs it was not given. Then what
must still work through all of it: gangs of several processes, workers taken back by
a restarted agent, containers of the job's own image, secrets opened only on the node.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from edge.sandbox.cgroups import discover_layout
from edge.training.process import ProcessRun
from edge.training.runs import RejectedRun, TrainingRun
from shared.messages import Accelerator
from shared.sealing import RegistryCredentials, SealedSecrets, public_key_text, seal
from tests.support.inventory import nvidia_gpus
from tests.support.sandboxed_node import (
    SETTINGS_PASSWORD,
    TESTS_ROOT,
    SandboxedNode,
    build_test_image,
    make_node,
    require_isolation_tools,
    run_record,
)
from tests.support.waiting import eventually

AGENT_SECRET = "agent-env-secret-77c1"
MIB = 1024**2


def _state(run: TrainingRun) -> str:
    """Its state now (a plain str: it changes under the test's feet)."""
    return run.status.state


def _denied(output: str, *tags: str) -> None:
    for tag in tags:
        assert f"DENIED {tag}" in output, output
        assert f"GOT {tag}" not in output, output


def _try(tag: str, command: str) -> str:
    return f'if {command} >/dev/null 2>&1; then echo "GOT {tag}"; else echo "DENIED {tag}"; fi; '


# ---- the agent's own files, environment and processes ---------------------------------


async def test_a_job_cannot_read_the_agents_settings_keys_state_or_logs(
    node: SandboxedNode,
) -> None:
    data = node.data_dir
    script = (
        _try("settings", f"cat {node.config_path}")
        + _try("sealing-key", f"cat {data}/state/sealing.key")
        + _try("state", f"ls {data}/state")
        + _try("logs", f"ls {data}/jobs")
        + _try("models", f"ls {data}/models")
        + f"grep -rs {SETTINGS_PASSWORD} {node.root} 2>/dev/null | head -1; echo scanned"
    )
    status, output = await node.run(node.worker(script))
    assert status.state == "succeeded", output
    _denied(output, "settings", "sealing-key", "state", "logs", "models")
    assert SETTINGS_PASSWORD not in output


async def test_a_job_sees_neither_the_agents_environment_nor_its_process(
    node: SandboxedNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GREENFED_MQTT__PASSWORD", AGENT_SECRET)
    agent = os.getpid()
    script = (
        "env; "
        + _try("environ", f"cat /proc/{agent}/environ")
        + _try("signal", f"kill -TERM {agent}")
        + _try("kill-all", "kill -KILL -1")  # whatever it may signal: only itself
        + "/usr/bin/python3 -c 'import ctypes, sys; libc = ctypes.CDLL(None, use_errno=True); "
        f'print("GOT ptrace" if libc.ptrace(16, {agent}, 0, 0) == 0 else "DENIED ptrace")\''
    )
    status, output = await node.run(node.worker(script))
    _denied(output, "environ", "signal", "ptrace")
    assert AGENT_SECRET not in output
    assert "GREENFED_MQTT" not in output
    assert status.state in ("succeeded", "failed")  # `kill -KILL -1` may end its own shell


async def test_a_job_cannot_read_or_signal_another_tenants_job(node: SandboxedNode) -> None:
    first = node.worker(
        "echo secret-of-a > $HOME/private.txt; echo ready; sleep 60", tenant="tenant-a"
    )
    run = node.prepare(first)
    task = asyncio.create_task(run.run())
    await eventually(
        lambda: run.status.state == "running" and "ready" in node.output(first), timeout_s=30
    )
    owner = node.setup.users.for_tenant("tenant-a") if node.setup.users else None
    assert owner is not None
    a_home = node.data_dir / "work" / f"{first.job_id}-{first.attempt}" / "w0"
    assert (a_home / "private.txt").read_text() == "secret-of-a\n"  # it is there to steal
    script = _try("files", f"cat {a_home}/private.txt") + _try("list", f"ls {a_home}")
    script += "kill -KILL -1 2>/dev/null; echo unreachable"
    _, output = await node.run(node.worker(script, tenant="tenant-b"))
    _denied(output, "files", "list")
    assert "secret-of-a" not in output
    # The other tenant's worker runs on, untouched by `kill -KILL -1`.
    assert _state(run) == "running"
    assert node.processes_of(owner.uid)
    await asyncio.wait_for(run.stop("test over"), 30)
    await task
    assert _state(run) == "stopped"


async def test_a_working_dir_behind_a_closed_directory_is_refused(node: SandboxedNode) -> None:
    # The agent (root) could change into it; the job's user could not reach it.
    closed = node.root / "closed"
    behind = closed / "open"
    behind.mkdir(parents=True)
    closed.chmod(0o700)
    behind.chmod(0o755)
    (behind / "secret.txt").write_text("behind a closed door\n")
    status, output = await node.run(node.worker("cat secret.txt", working_dir=str(behind)))
    assert status.state == "failed"
    assert status.reason.startswith(f"cannot start: working_dir {behind} is not a directory")
    assert "behind a closed door" not in output


async def test_a_jobs_environment_never_reaches_what_runs_as_root(node: SandboxedNode) -> None:
    """The job chooses its variables: a PATH that would find its own `setpriv` first, a
    library preloaded into every program that loads one. What starts the worker as root
    (bubblewrap, setpriv) must not take them; the worker itself still gets them."""
    shared = node.root / "shared"
    shared.mkdir(mode=0o755)
    marker = node.root / "root-ran-the-jobs-code"
    fake = shared / "setpriv"
    fake.write_text(f'#!/bin/sh\nid -u > {marker}\nexec /usr/bin/setpriv "$@"\n')
    fake.chmod(0o755)
    env = {"PATH": f"{shared}:/usr/bin:/bin", "LD_PRELOAD": f"{shared}/missing.so"}
    script = 'echo "path=$PATH"; echo "preload=$LD_PRELOAD"; id -u'
    status, output = await node.run(node.worker(script, env=env, working_dir=str(shared)))
    assert status.state == "succeeded", output
    assert not marker.exists()  # the job's setpriv never ran, as root or at all
    assert f"path={shared}:/usr/bin:/bin" in output  # the worker has its variables
    assert f"preload={shared}/missing.so" in output
    assert output.split()[-1] != "0"  # and runs as the work user, not root


async def test_a_working_dir_through_a_link_or_dots_is_refused(node: SandboxedNode) -> None:
    """Bound into the sandbox as written, a path through a link (one a job left in its
    own directory, say) or with '..' could lay what the sandbox hides back over it."""
    target = node.root / "target"
    target.mkdir(mode=0o755)
    link = node.root / "link"
    link.symlink_to(target)
    for working_dir, why in (
        (str(link), "goes through a symbolic link"),
        (f"{target}/../target", "has a '..' in it"),
    ):
        status, _ = await node.run(node.worker("pwd", working_dir=working_dir))
        assert status.state == "failed"
        assert why in status.reason, status.reason


async def test_a_job_has_a_temporary_directory_of_its_own(node: SandboxedNode) -> None:
    script = 'echo "tmpdir=$TMPDIR"; echo mine > "$TMPDIR/file"; ls -ld "$TMPDIR" | cut -c1-10'
    status, output = await node.run(node.worker(script))
    assert status.state == "succeeded", output
    if node.setup.isolation.level == "sandbox":
        assert "tmpdir=/tmp" in output  # the sandbox's own /tmp
    else:
        assert f"tmpdir={node.data_dir}/work/" in output  # not the host's shared /tmp
        assert "drwx------" in output


async def test_tenants_get_their_own_unprivileged_users(node: SandboxedNode) -> None:
    one = node.worker("id -u; id -g", tenant="tenant-a")
    other = node.worker("id -u; id -g", tenant="tenant-b")
    (_, first), (_, second) = await node.run(one), await node.run(other)
    low, high = node.settings.agent.worker_uid_range
    uids = {int(first.split()[0]), int(second.split()[0])}
    assert len(uids) == 2
    assert all(low <= uid <= high for uid in uids)
    assert os.getuid() not in uids


# ---- limits ---------------------------------------------------------------------------


async def test_a_fork_bomb_is_stopped_by_the_pids_limit(node: SandboxedNode) -> None:
    spec = node.worker("bomb() { bomb | bomb & }; bomb; sleep 1; echo survived", pids_limit=64)
    started = time.monotonic()
    status, output = await node.run(spec, timeout_s=60)
    assert time.monotonic() - started < 45
    assert "Cannot fork" in output or "fork" in output.lower(), output
    assert node.setup.users is not None
    uid = node.setup.users.for_tenant(spec.tenant).uid
    await eventually(lambda: not node.processes_of(uid), message="the bomb's processes stayed")
    assert node.cgroup_dirs_left() == []
    assert status.finished


async def test_a_gang_launched_per_node_starts_at_the_largest_pids_limit(
    sandbox_node: SandboxedNode,
) -> None:
    # Its leaf holds the processes of the whole node: more than the kernel's most.
    node = sandbox_node
    spec = node.worker(
        "echo ran", pids_limit=4_194_304, processes=2, world_size=2, launch="per-node"
    )
    status, output = await node.run(spec)
    assert (status.state, status.reason) == ("succeeded", ""), output
    assert "ran" in output


async def test_memory_past_the_limit_ends_the_attempt_saying_so(node: SandboxedNode) -> None:
    spec = node.worker(
        "echo allocating; exec dd if=/dev/zero of=/dev/null bs=256M count=1",
        host_memory_bytes=64 * MIB,
    )
    status, output = await node.run(spec)
    assert (status.state, status.reason) == ("failed", "out of memory: limit 64 MiB"), output
    assert node.cgroup_dirs_left() == []


async def test_a_gang_of_two_on_one_node_runs_two_processes_ranked_0_and_1(
    node: SandboxedNode,
) -> None:
    spec = node.worker(
        'echo "rank=$RANK local=$LOCAL_RANK world=$WORLD_SIZE user=$(id -u)"',
        processes=2,
        world_size=2,
    )
    status, output = await node.run(spec)
    assert status.state == "succeeded", output
    lines = sorted(line for line in output.splitlines() if "rank=" in line)
    assert [line.split()[:4] for line in lines] == [
        ["[rank", "0]", "rank=0", "local=0"],
        ["[rank", "1]", "rank=1", "local=1"],
    ]
    assert all("world=2" in line for line in lines)


# ---- stopping ----------------------------------------------------------------------------


async def _stop_once_up(
    node: SandboxedNode, script: str, grace_period_s: float
) -> tuple[float, str]:
    """Run `script` (it says "up" once its SIGTERM trap is set) and stop it: (how long the
    stop took in seconds, what the job printed)."""
    spec = node.worker(script, grace_period_s=grace_period_s)
    run = node.prepare(spec)
    task = asyncio.create_task(run.run())
    await eventually(lambda: _state(run) == "running" and "up" in node.output(spec), timeout_s=30)
    started = time.monotonic()
    await asyncio.wait_for(run.stop("preempted"), grace_period_s + 30)
    elapsed = time.monotonic() - started
    await asyncio.wait_for(task, 30)
    assert _state(run) == "stopped"
    assert node.cgroup_dirs_left() == []
    return elapsed, node.output(spec)


async def test_a_stopped_job_gets_sigterm_and_time_to_save_a_checkpoint(
    node: SandboxedNode,
) -> None:
    # In a sandbox the SIGTERM must reach the job, never bubblewrap's outer process:
    # that one dies of it, and the sandbox with it (--die-with-parent).
    script = (
        "trap 'echo got-TERM; sleep 1; echo checkpoint-saved; exit 0' TERM; "
        "echo up; while :; do sleep 0.1; done"
    )
    elapsed, output = await _stop_once_up(node, script, grace_period_s=30.0)
    assert "got-TERM" in output, output
    assert "checkpoint-saved" in output, output
    assert 1.0 <= elapsed < 25  # the second it took, not the whole grace period


async def test_a_job_ignoring_sigterm_is_killed_once_its_grace_period_is_over(
    node: SandboxedNode,
) -> None:
    script = "trap '' TERM; echo up; while :; do sleep 0.1; done"
    elapsed, _ = await _stop_once_up(node, script, grace_period_s=2.0)
    assert 2.0 <= elapsed < 20
    assert node.setup.users is not None
    uid = node.setup.users.for_tenant("tenant-a").uid
    await eventually(lambda: not node.processes_of(uid), message="the job's processes stayed")


# ---- devices ----------------------------------------------------------------------------


@pytest.fixture
def fake_gpus() -> Iterator[tuple[Path, tuple[Accelerator, ...]]]:
    """Device nodes of four NVIDIA GPUs (character devices 195:0-3 and nvidiactl
    195:255) with no driver behind them: opening an allowed one says "no such device",
    a forbidden one "operation not permitted"."""
    require_isolation_tools()
    TESTS_ROOT.mkdir(mode=0o755, exist_ok=True)
    dev_root = Path(tempfile.mkdtemp(prefix="dev-", dir=TESTS_ROOT))
    dev_root.chmod(0o755)
    for index in range(4):
        os.mknod(dev_root / f"nvidia{index}", 0o666 | stat.S_IFCHR, os.makedev(195, index))
    os.mknod(dev_root / "nvidiactl", 0o666 | stat.S_IFCHR, os.makedev(195, 255))
    for path in dev_root.iterdir():
        path.chmod(0o666)
    inventory = nvidia_gpus(4)
    yield dev_root, inventory
    shutil.rmtree(dev_root, ignore_errors=True)


@pytest.mark.parametrize("isolation", ["sandbox", "user"])
async def test_a_job_sees_only_the_gpus_it_was_given(
    fake_gpus: tuple[Path, tuple[Accelerator, ...]], isolation: str
) -> None:
    dev_root, inventory = fake_gpus
    for node in make_node(isolation, inventory=inventory, dev_root=dev_root):
        devices = "/dev" if isolation == "sandbox" else str(dev_root)
        script = (
            "echo visible=$CUDA_VISIBLE_DEVICES; "
            f"ls {devices} | grep nvidia | tr '\\n' ' '; echo; "
            f"for n in 0 1 2 3; do cat {devices}/nvidia$n 2>&1 | sed 's/^/gpu'$n': /'; done"
        )
        _, output = await node.run(node.worker(script, accelerator_ids=("gpu1", "gpu2")))
        assert "visible=GPU-1,GPU-2" in output, output
        layout = discover_layout()
        device_rules = (
            layout is not None and layout.version == 1 and "devices" in layout.controllers
        )
        if isolation == "sandbox":
            # Only the given GPUs (and the driver's control node) exist in its /dev.
            assert "nvidia1 nvidia2 nvidiactl" in output, output
            assert "nvidia0" not in output.split("visible=")[1].splitlines()[1]
        if device_rules:
            for gpu in ("gpu0", "gpu3"):
                refused = _line(output, gpu)
                assert "Operation not permitted" in refused or "No such file" in refused, output
            for gpu in ("gpu1", "gpu2"):
                assert "No such device" in _line(output, gpu), output


def _command_lines_holding(text: str) -> list[str]:
    """Every process whose command line holds `text` (anyone can read command lines)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(entry.name)
            except (FileNotFoundError, ProcessLookupError):
                continue
    return found


def _line(output: str, prefix: str) -> str:
    return next((line for line in output.splitlines() if line.startswith(prefix)), "")


# ---- through an agent restart -------------------------------------------------------------


async def test_a_sandboxed_worker_outlives_the_agent_and_is_taken_back(
    sandbox_node: SandboxedNode,
) -> None:
    node = sandbox_node
    spec = node.worker("echo up; while [ ! -e $HOME/go ]; do sleep 0.1; done; echo finished")
    first = node.prepare(spec)
    assert isinstance(first, ProcessRun)
    task = asyncio.create_task(first.run())
    await eventually(lambda: first.status.state == "running" and "up" in node.output(spec))
    task.cancel()  # the agent stops: its worker goes on
    with pytest.raises(asyncio.CancelledError):
        await task
    record = run_record(node, spec)
    assert record["protocol"] == 2
    assert record["cgroup_dirs"]

    taken_back = node.launcher.adopt(spec)
    assert taken_back is not None
    assert _state(taken_back) == "running"
    following = asyncio.create_task(taken_back.run())
    work_dir = node.data_dir / "work" / f"{spec.job_id}-{spec.attempt}" / "w0"
    (work_dir / "go").touch()
    await asyncio.wait_for(following, 30)
    assert _state(taken_back) == "succeeded"
    assert "finished" in node.output(spec)
    assert node.cgroup_dirs_left() == []
    assert not work_dir.exists()


# ---- secrets ----------------------------------------------------------------------------


async def test_secrets_open_only_on_their_node_and_never_reach_a_command_line(
    sandbox_node: SandboxedNode,
) -> None:
    node = sandbox_node
    token = "aws-secret-0f9e8d"
    spec = node.worker("echo key=$AWS_SECRET_ACCESS_KEY; sleep 30")
    sealed = seal(
        SealedSecrets(env={"AWS_SECRET_ACCESS_KEY": token}),
        public_key_text(node.setup.sealing_key),
        node_id="node-1",
        job_id=spec.job_id,
        attempt=spec.attempt,
    )
    with_secret = msgspec.structs.replace(
        spec, secret_names=("AWS_SECRET_ACCESS_KEY",), sealed_secrets=sealed
    )
    run = node.prepare(with_secret)
    task = asyncio.create_task(run.run())
    await eventually(lambda: f"key={token}" in node.output(spec), timeout_s=30)
    assert await asyncio.to_thread(_command_lines_holding, token) == []
    for path in await asyncio.to_thread(lambda: list((node.data_dir / "jobs").iterdir())):
        if path.suffix != ".log":  # the job printed it itself: its own log has it
            assert token.encode() not in path.read_bytes(), path
    await asyncio.wait_for(run.stop("test over"), 30)
    await task

    # Sealed for another attempt (a copy replayed into a new document): it does not open.
    replayed = msgspec.structs.replace(with_secret, attempt=2)
    refused = node.prepare(replayed)
    assert isinstance(refused, RejectedRun)
    assert "do not open" in refused.reason
    # Names listed, nothing sealed (the control plane had no key of this node).
    missing = msgspec.structs.replace(with_secret, sealed_secrets=None)
    refused = node.prepare(missing)
    assert isinstance(refused, RejectedRun)
    assert "did not come sealed" in refused.reason


# ---- containers ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def test_image(tmp_path_factory: pytest.TempPathFactory) -> str:
    require_isolation_tools(containers=True)
    return build_test_image(tmp_path_factory.mktemp("image"))


async def test_a_container_job_runs_as_its_user_in_its_image_with_its_limits(
    sandbox_node: SandboxedNode, test_image: str
) -> None:
    node = sandbox_node
    assert node.setup.isolation.runtime is not None, node.setup.isolation.runtime_note
    spec = node.worker(
        'echo "uid=$(id -u) rank=$RANK home=$HOME"; ls /; '
        + _try("settings", f"cat {node.config_path}"),
        image=test_image,
        image_pull_policy="never",
    )
    status, output = await node.run(spec)
    assert status.state == "succeeded", output
    assert node.setup.users is not None
    uid = node.setup.users.for_tenant(spec.tenant).uid
    assert f"uid={uid} rank=0" in output
    assert "bin" in output
    _denied(output, "settings")

    hungry = node.worker(
        "exec dd if=/dev/zero of=/dev/null bs=256M count=1",
        image=test_image,
        image_pull_policy="never",
        host_memory_bytes=64 * MIB,
    )
    status, output = await node.run(hungry)
    assert (status.state, status.reason) == ("failed", "out of memory: limit 64 MiB"), output
    assert node.cgroup_dirs_left() == []
    podman = shutil.which("podman") or "podman"
    listed = await asyncio.to_thread(
        subprocess.run,
        [podman, "ps", "-a", "--format", "{{.Names}}"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert spec.job_id not in listed.stdout  # removed after
    assert hungry.job_id not in listed.stdout


async def test_a_container_may_run_as_many_processes_as_its_pids_limit_says(
    sandbox_node: SandboxedNode, test_image: str
) -> None:
    # More than podman's own default (2048), which held containers below the job's.
    node = sandbox_node
    spec = node.worker(
        "i=0; while [ $i -lt 2100 ]; do sleep 60 & i=$((i+1)); done; echo spawned $i; "
        "kill $(jobs -p)",
        image=test_image,
        image_pull_policy="never",
        pids_limit=2200,
    )
    status, output = await node.run(spec, timeout_s=50)
    assert "can't fork" not in output, output[-300:]
    assert "spawned 2100" in output, output[-300:]
    assert status.state == "succeeded", status.reason


async def test_an_image_that_is_not_there_is_a_clear_reason(
    sandbox_node: SandboxedNode, test_image: str
) -> None:
    node = sandbox_node
    missing = node.worker("true", image="localhost/greenfed-test:absent", image_pull_policy="never")
    status, _ = await node.run(missing)
    assert status.state == "failed"
    assert status.reason == (
        "image localhost/greenfed-test:absent is not on this node (image_pull_policy never)"
    )
    unreachable = node.worker("true", image="127.0.0.1:9/greenfed/absent:1")
    status, _ = await node.run(unreachable, timeout_s=120)
    assert status.state == "failed"
    assert status.reason.startswith("image 127.0.0.1:9/greenfed/absent:1 could not be pulled: ")


PRIVATE_REPOSITORY = "localhost/greenfed-test/private"


async def test_an_image_another_tenants_credentials_pulled_runs_for_no_one_else_by_any_name(
    sandbox_node: SandboxedNode, test_image: str
) -> None:
    node = sandbox_node
    podman = shutil.which("podman") or "podman"
    # tenant-a's private image, as its credentials would have pulled it (no registry is
    # reachable here: the test's own image under that name stands in for it).
    await asyncio.to_thread(
        subprocess.run, [podman, "tag", test_image, PRIVATE_REPOSITORY], check=True
    )
    try:
        pulled = node.worker(
            "echo ran", tenant="tenant-a", image=PRIVATE_REPOSITORY, has_secrets=True
        )
        credentials = RegistryCredentials(registry="localhost", username="ci", password="pw")
        sealed = seal(
            SealedSecrets(registry=credentials),
            public_key_text(node.setup.sealing_key),
            node_id="node-1",
            job_id=pulled.job_id,
            attempt=pulled.attempt,
        )
        # Its pull fails (no registry), once its credentials were used.
        await node.run(msgspec.structs.replace(pulled, sealed_secrets=sealed), timeout_s=120)
        inspected = await asyncio.to_thread(
            subprocess.run,
            [podman, "image", "inspect", "--format", "{{.Digest}}", PRIVATE_REPOSITORY],
            capture_output=True,
            text=True,
            check=True,
        )
        digest = inspected.stdout.strip()
        # The store finds it by its tag spelled out, and by its digest under any name.
        for reference in (
            f"{PRIVATE_REPOSITORY}:latest",
            f"{PRIVATE_REPOSITORY}@{digest}",
            f"localhost/greenfed-test/elsewhere@{digest}",
        ):
            spec = node.worker(
                "echo RAN-IN-ANOTHER-TENANTS-IMAGE",
                tenant="tenant-b",
                image=reference,
                image_pull_policy="never",
            )
            status, output = await node.run(spec, timeout_s=120)
            assert "RAN-IN-ANOTHER-TENANTS-IMAGE" not in output, reference
            assert status.state != "succeeded", reference
            assert "another tenant's registry credentials" in status.reason, status.reason
        # Its own tenant names it as it likes.
        mine = node.worker(
            "echo ran-in-my-image",
            tenant="tenant-a",
            image=f"{PRIVATE_REPOSITORY}:latest",
            image_pull_policy="never",
        )
        status, output = await node.run(mine, timeout_s=120)
        assert status.state == "succeeded", (status.reason, output)
    finally:
        await asyncio.to_thread(
            subprocess.run, [podman, "untag", test_image, PRIVATE_REPOSITORY], check=False
        )
