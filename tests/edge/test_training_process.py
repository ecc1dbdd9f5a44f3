"""Training workers as real subprocesses: environment, outcomes, stopping, logs."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest

from edge.training.environment import process_environment
from edge.training.logs import BoundedLog, tail_lines
from edge.training.process import ProcessRun
from shared.messages import DesiredTraining
from tests.support.inventory import nvidia_gpus
from tests.support.launchers import plain_launcher
from tests.support.waiting import eventually

GPUS = nvidia_gpus(4)


def spec(script: str, **changes: object) -> DesiredTraining:
    fields: dict[str, object] = {
        "job_id": "job-1",
        "attempt": 2,
        "command": (sys.executable, "-c", script),
        "accelerator_ids": ("gpu1", "gpu3"),
        "rank": 1,
        "world_size": 2,
        "master_addr": "10.0.0.5",
        "master_port": 29500,
        "grace_period_s": 0.5,
    }
    fields.update(changes)
    return DesiredTraining(**fields)  # type: ignore[arg-type]


def prepare(
    tmp_path: Path, desired: DesiredTraining, max_log_bytes: int = 1024 * 1024
) -> ProcessRun:
    run = plain_launcher(tmp_path, GPUS, max_log_bytes=max_log_bytes).prepare(desired)
    assert isinstance(run, ProcessRun), getattr(run, "reason", run)
    return run


def environment_of(desired: DesiredTraining, local: int = 0) -> dict[str, str]:
    return process_environment(
        desired, GPUS, local=local, secret_env={}, work_dir="/w", user_name="greenfed-70000"
    )


def test_a_worker_is_told_its_cpu_cores_and_sizes_its_threads_to_them() -> None:
    environment = environment_of(spec("", cpu_cores=6))
    assert environment["GREENFED_CPU_CORES"] == "6"
    assert environment["OMP_NUM_THREADS"] == "6"


def test_a_jobs_own_omp_num_threads_is_kept() -> None:
    environment = environment_of(spec("", cpu_cores=6, env={"OMP_NUM_THREADS": "2"}))
    assert (environment["GREENFED_CPU_CORES"], environment["OMP_NUM_THREADS"]) == ("6", "2")


def test_without_cores_held_nothing_about_cores_is_exported() -> None:
    environment = environment_of(spec(""))
    assert "GREENFED_CPU_CORES" not in environment
    assert "OMP_NUM_THREADS" not in environment


def test_nothing_of_the_agents_environment_reaches_a_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GREENFED_MQTT__PASSWORD", "hunter2")
    monkeypatch.setenv("GREENFED_API", "http://cloud:8700")
    environment = environment_of(spec("", env={"LR": "0.1"}))
    assert "GREENFED_MQTT__PASSWORD" not in environment
    assert "GREENFED_API" not in environment
    assert environment["LR"] == "0.1"
    assert environment["PATH"].startswith("/usr/local/sbin:")
    assert (environment["HOME"], environment["GREENFED_WORK_DIR"]) == ("/w", "/w")


def test_a_gang_of_two_on_one_node_is_two_ranks_with_half_the_devices_each() -> None:
    desired = spec(
        "",
        accelerator_ids=("gpu0", "gpu1", "gpu2", "gpu3"),
        processes=2,
        rank=2,
        world_size=4,
        node_rank=1,
        nodes=2,
        cpu_cores=8,
    )
    first, second = environment_of(desired, 0), environment_of(desired, 1)
    assert [(e["RANK"], e["LOCAL_RANK"], e["CUDA_VISIBLE_DEVICES"]) for e in (first, second)] == [
        ("2", "0", "GPU-0,GPU-1"),
        ("3", "1", "GPU-2,GPU-3"),
    ]
    for environment in (first, second):
        assert environment["WORLD_SIZE"] == "4"
        assert environment["LOCAL_WORLD_SIZE"] == environment["NPROC_PER_NODE"] == "2"
        assert (environment["NODE_RANK"], environment["NNODES"]) == ("1", "2")
        assert environment["GREENFED_CPU_CORES"] == "4"


def test_launched_per_node_one_process_has_every_device_and_torchruns_options() -> None:
    desired = spec(
        "",
        accelerator_ids=("gpu0", "gpu1"),
        processes=2,
        rank=2,
        world_size=4,
        node_rank=1,
        nodes=2,
        launch="per-node",
    )
    environment = environment_of(desired)
    assert environment["CUDA_VISIBLE_DEVICES"] == "GPU-0,GPU-1"
    assert (environment["PET_NNODES"], environment["PET_NPROC_PER_NODE"]) == ("2", "2")
    assert (environment["PET_NODE_RANK"], environment["PET_MASTER_PORT"]) == ("1", "29500")
    assert environment["RANK"] == "2"


async def test_a_worker_sees_its_job_gpus_and_gang_and_succeeds(tmp_path: Path) -> None:
    script = (
        "import os\n"
        "for name in ('GREENFED_JOB_ID', 'GREENFED_ATTEMPT', 'CUDA_VISIBLE_DEVICES', 'RANK',\n"
        "             'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT', 'EXTRA'):\n"
        "    print(name, os.environ.get(name))\n"
    )
    run = prepare(tmp_path, spec(script, env={"EXTRA": "yes", "RANK": "overridden?"}))
    await asyncio.wait_for(run.run(), 30)
    assert (run.status.state, run.status.exit_code, run.status.reason) == ("succeeded", 0, "")
    assert run.status.started_at is not None
    assert run.status.finished_at is not None
    assert run.status.finished_at >= run.status.started_at
    printed = dict(line.split(" ", 1) for line in tail_lines(run.log_path, 100))
    assert printed == {
        "GREENFED_JOB_ID": "job-1",
        "GREENFED_ATTEMPT": "2",
        "CUDA_VISIBLE_DEVICES": "GPU-1,GPU-3",
        "RANK": "1",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "10.0.0.5",
        "MASTER_PORT": "29500",
        "EXTRA": "yes",
    }


@pytest.mark.parametrize(
    ("script", "state", "exit_code", "reason"),
    [
        ("raise SystemExit(3)", "failed", 3, "exit code 3"),
        (
            "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
            "failed",
            -9,
            "killed by SIGKILL (out of memory?)",
        ),
        (
            "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)",
            "failed",
            -11,
            "killed by SIGSEGV",
        ),
    ],
)
async def test_failures_are_reported_with_their_reason(
    tmp_path: Path, script: str, state: str, exit_code: int, reason: str
) -> None:
    run = prepare(tmp_path, spec(script))
    await asyncio.wait_for(run.run(), 30)
    assert (run.status.state, run.status.exit_code, run.status.reason) == (state, exit_code, reason)


async def test_a_command_that_cannot_start_fails_with_why(tmp_path: Path) -> None:
    run = prepare(tmp_path, spec("", command=("/nonexistent/train.sh", "--epochs", "3")))
    await asyncio.wait_for(run.run(), 30)
    assert run.status.state == "failed"
    assert run.status.reason.startswith("cannot start:")
    assert "No such file" in run.status.reason


async def test_stopping_sends_sigterm_and_the_worker_may_clean_up(tmp_path: Path) -> None:
    script = (
        "import signal, sys, time\n"
        "def bye(*_):\n"
        "    print('checkpoint saved', flush=True); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, bye)\n"
        "print('training', flush=True)\n"
        "time.sleep(60)\n"
    )
    run = prepare(tmp_path, spec(script, grace_period_s=10))
    task = asyncio.create_task(run.run())
    await eventually(lambda: "training" in tail_lines(run.log_path, 5))
    started = time.monotonic()
    await asyncio.wait_for(run.stop("cancelled by the tenant"), 30)
    assert time.monotonic() - started < 5  # it left on SIGTERM, long before the grace period
    await task
    assert (run.status.state, run.status.reason) == ("stopped", "cancelled by the tenant")
    assert tail_lines(run.log_path, 1) == ["checkpoint saved"]


async def test_a_worker_ignoring_sigterm_is_killed_with_its_children_after_the_grace_period(
    tmp_path: Path,
) -> None:
    script = (
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    run = prepare(tmp_path, spec(script, grace_period_s=0.5))
    task = asyncio.create_task(run.run())
    await eventually(lambda: bool(tail_lines(run.log_path, 1)))
    child_pid = int(tail_lines(run.log_path, 1)[0])
    started = time.monotonic()
    await asyncio.wait_for(run.stop("preempted"), 30)
    elapsed = time.monotonic() - started
    await task
    assert 0.5 <= elapsed < 5
    assert run.status.state == "stopped"
    await eventually(lambda: not _alive(child_pid))  # the whole process group went


async def test_the_log_is_bounded_and_keeps_the_newest_output(tmp_path: Path) -> None:
    script = "import sys\nfor i in range(40000): print(f'line {i:06d} ' + 'x' * 60)\n"
    run = prepare(tmp_path, spec(script), max_log_bytes=256 * 1024)
    await asyncio.wait_for(run.run(), 30)
    total = sum(p.stat().st_size for p in run.log_path.parent.iterdir())
    assert total <= 2 * 256 * 1024 + 65536
    assert tail_lines(run.log_path, 1)[0].startswith("line 039999 ")


async def test_a_gangs_output_without_line_breaks_is_bounded_like_any_other(
    tmp_path: Path,
) -> None:
    # Labelled output waits for a line's end: a rank that never prints one must not
    # grow the wrapper (root, outside the worker's memory limit) or one log file.
    script = (
        "import sys\n"
        "for _ in range(8): sys.stdout.buffer.write(b'x' * 1024 * 1024); sys.stdout.flush()\n"
        "print(f'\\nend {sys.argv[0]}', flush=True)\n"
    )
    max_log_bytes = 256 * 1024
    desired = spec(script, processes=2, rank=0, world_size=2)
    run = prepare(tmp_path, desired, max_log_bytes=max_log_bytes)
    await asyncio.wait_for(run.run(), 60)
    assert run.status.state == "succeeded", run.status.reason
    parts = list(run.log_path.parent.glob(f"{run.log_path.name}*"))
    piece_bytes = 64 * 1024 + len("[rank 0] \n")  # what the wrapper writes at once
    assert all(part.stat().st_size <= max_log_bytes + 2 * piece_bytes for part in parts)
    lines = tail_lines(run.log_path, 1000)
    assert all(len(line) < piece_bytes for line in lines)
    assert all(line.startswith(("[rank 0] ", "[rank 1] ")) for line in lines)
    # The line that ends the last to finish is kept whole, after its long run of x.
    ends = [line for line in lines if "end" in line]
    assert ends, lines[-3:]
    assert set(ends) <= {"[rank 0] end -c", "[rank 1] end -c"}


def test_bounded_log_rotates_and_tails_across_both_parts(tmp_path: Path) -> None:
    path = tmp_path / "job.log"
    with BoundedLog(path, max_bytes=1024) as log:
        for i in range(100):
            log.write(f"{i:04d} {'.' * 40}\n".encode())
    tail = tail_lines(path, 30)
    assert [line[:4] for line in tail] == [f"{i:04d}" for i in range(70, 100)]
    assert path.stat().st_size < 1024
    assert path.with_name("job.log.1").exists()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still "exists"; it is dead for our purpose.
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


async def test_a_worker_is_done_when_its_command_exits_not_when_the_pipe_closes(
    tmp_path: Path,
) -> None:
    # Something it leaves running in the background keeps its output pipe open.
    script = (
        "import subprocess, sys\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
        "print('trained', flush=True)\n"
    )
    run = prepare(tmp_path, spec(script))
    started = time.monotonic()
    await asyncio.wait_for(run.run(), 30)
    assert time.monotonic() - started < 10
    assert (run.status.state, run.status.exit_code) == ("succeeded", 0)
    assert tail_lines(run.log_path, 1) == ["trained"]


def test_a_process_is_known_by_its_start_in_this_boot_not_by_the_wall_clock() -> None:
    from edge.training.worker_record import boot_id, is_alive, process_started

    started = process_started(os.getpid())
    assert started is not None
    assert started < 1e9  # clock ticks since boot, not a wall-clock time a step would move
    assert is_alive(os.getpid(), started, boot_id())
    assert not is_alive(os.getpid(), started + 1, boot_id())  # another process on this pid
    assert not is_alive(os.getpid(), started, "another-boot")


def test_the_log_is_read_on_across_its_rotation_without_a_gap(tmp_path: Path) -> None:
    from edge.training.log_tail import LogTail

    path = tmp_path / "job.log"
    written = b""
    read = b""
    with BoundedLog(path, max_bytes=1024) as log:
        tail = LogTail(path)
        for number in range(60):  # several rotations, read in small pieces meanwhile
            line = f"{number:04d} {'.' * 40}\n".encode()
            log.write(line)
            log.flush()
            written += line
            if number % 7 == 0:  # a poll: what is there, in pieces smaller than a file
                while chunk := tail.read(max_bytes=128):
                    read += chunk
        while chunk := tail.read(max_bytes=128):
            read += chunk
    assert read == written
    assert tail.lost_rotations == 0


async def test_output_that_ends_inside_a_character_is_shipped_whole(tmp_path: Path) -> None:
    script = "import sys\nsys.stdout.buffer.write('50% █'.encode()[:-1])\n"
    run = prepare(tmp_path, spec(script))
    await asyncio.wait_for(run.run(), 30)
    taken = b""
    while (chunk := run.output.take()) is not None:
        taken += chunk[1]
    assert taken == "50% █".encode()[:-1]
    assert run.output.pending_bytes == 0  # nothing held back for a rest that cannot come
