"""A training worker on a node whose disk is full: the worker runs, its output is lost,
and what the wrapper could not write is this node's fault, never the job's.

The disk is real: a tiny tmpfs mounted for each test (out of space, or out of inodes),
unmounted after it. Tests run as root in CI; where mounting is impossible they skip.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from cloud.loop.reports import agent_outcomes
from edge.training import process as process_module
from edge.training import wrapper
from edge.training.launch_plan import LaunchPlan
from edge.training.process import ProcessRun
from edge.training.runs import RunStatus
from shared.messages import DesiredTraining
from tests.loop.builders import allocation, node, work
from tests.support.launchers import plain_launcher

RUN_TIMEOUT_S = 30
NOT_RECORDED = "the greenfed wrapper could not record the worker's exit status: "


def _mount(mount_point: Path, options: str) -> Iterator[Path]:
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tiny tmpfs to fill (root needed): {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        # Lazily: a worker a failing test left in it must not keep it mounted.
        subprocess.run(["umount", "--lazy", str(mount_point)], check=False)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB filesystem with inodes to spare."""
    yield from _mount(tmp_path / "disk", "size=1m")


@pytest.fixture
def few_inodes(tmp_path: Path) -> Iterator[Path]:
    """A filesystem with room to spare but few inodes."""
    yield from _mount(tmp_path / "disk", "size=16m,nr_inodes=64")


def fill_space(directory: Path) -> None:
    """Writes until the filesystem has no room left."""
    descriptor = os.open(directory / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    refused: OSError | None = None
    try:
        while refused is None:
            try:
                os.write(descriptor, b"\0" * 4096)
            except OSError as error:
                refused = error
    finally:
        os.close(descriptor)
    assert refused.errno == errno.ENOSPC


def fill_inodes(directory: Path) -> list[Path]:
    """Creates files until the filesystem has no inode left; the files made."""
    made: list[Path] = []
    refused: OSError | None = None
    while refused is None:
        path = directory / f"inode-{len(made)}"
        try:
            path.touch()
            made.append(path)
        except OSError as error:
            refused = error
    assert refused.errno == errno.ENOSPC
    return made


def spec(script: str) -> DesiredTraining:
    return DesiredTraining(
        job_id="job-1", attempt=1, command=(sys.executable, "-c", script), grace_period_s=1
    )


def prepare(node_dir: Path, desired: DesiredTraining) -> tuple[ProcessRun, list[str]]:
    """The run, and the states it went through."""
    run = plain_launcher(node_dir).prepare(desired)
    assert isinstance(run, ProcessRun), getattr(run, "reason", run)
    states: list[str] = []

    def note(status: RunStatus) -> None:
        states.append(status.state)

    run.status.on_change = note
    return run, states


# ---- the agent and its wrapper on a full disk -------------------------------------------


async def test_a_worker_on_a_full_disk_runs_and_its_lost_status_is_the_nodes_fault(
    small_disk: Path, tmp_path: Path
) -> None:
    """No started file, no log, no exit status: the worker still runs, the agent hears
    of its start from the wrapper, and its end is reported `stopped` (requeued by the
    cloud, not counted against the job's retries) with the wrapper's own error."""
    marker = tmp_path / "worker-ran"
    (small_disk / "jobs").mkdir()
    fill_space(small_disk)
    run, states = prepare(small_disk, spec(f"open({str(marker)!r}, 'w').write('ran')"))
    with capture_logs() as logs:
        await asyncio.wait_for(run.run(), RUN_TIMEOUT_S)
    assert marker.read_text() == "ran"
    assert states == ["running", "stopped"]
    assert run.status.exit_code is None  # the worker's code never reached the agent
    assert run.status.reason.startswith(NOT_RECORDED), run.status.reason
    assert "No space left on device" in run.status.reason
    said = [entry["line"] for entry in logs if entry["event"] == "training worker's wrapper said"]
    assert any("cannot write the started file" in line for line in said), said
    assert any("the worker ended (exit code 0)" in line for line in said), said
    # The control plane queues the job again, its own retries (none) untouched.
    outcome = agent_outcomes(
        {"job-1": work("job-1", attempts=1)},
        {"job-1": (allocation("job-1", 0, "n1"),)},
        {"n1": node("n1", training=(run.status.reported(),))},
        {},
        now=0.0,
    )
    (requeued,) = outcome.evictions
    assert requeued.retry_not_before is None  # not one of the job's own failures
    assert not outcome.state_changes


async def test_a_wrapper_that_dies_on_its_own_is_the_nodes_fault_not_the_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wrapper that crashes (exit code 1, no status) says nothing of the worker: the
    run is `stopped` with the wrapper's last words, never `failed` with "exit code 1"."""
    crashing = tmp_path / "crashing_wrapper.py"
    crashing.write_text(
        "import sys\nsys.stdin.buffer.read()\nraise RuntimeError('the wrapper broke')\n"
    )
    monkeypatch.setattr(process_module, "WRAPPER_SCRIPT", str(crashing))
    run, states = prepare(tmp_path / "node", spec("pass"))
    with capture_logs() as logs:
        await asyncio.wait_for(run.run(), RUN_TIMEOUT_S)
    assert states == ["stopped"]
    assert run.status.reason == (
        "the greenfed wrapper failed (exit code 1) before it recorded the worker's exit "
        "status: RuntimeError: the wrapper broke"
    )
    said = [entry["line"] for entry in logs if entry["event"] == "training worker's wrapper said"]
    assert said[0] == "Traceback (most recent call last):"


async def test_a_work_directory_the_full_disk_refuses_is_the_nodes_fault(
    few_inodes: Path,
) -> None:
    (few_inodes / "jobs").mkdir()
    (few_inodes / "work").mkdir()
    fill_inodes(few_inodes)
    run, states = prepare(few_inodes, spec("pass"))
    await asyncio.wait_for(run.run(), RUN_TIMEOUT_S)
    assert states == ["stopped"]
    assert run.status.reason.startswith("cannot start on this node: [Errno 28]")


# ---- the wrapper alone ------------------------------------------------------------------


def test_an_exit_status_is_written_once_the_disk_has_room_again(small_disk: Path) -> None:
    """The disk refuses the status, then something frees room (here, the first pause
    between tries does): the status is written, and nothing half-written stays."""
    fill_space(small_disk)
    pauses: list[float] = []

    def room_comes_back(delay_s: float) -> None:
        pauses.append(delay_s)
        (small_disk / "filler").unlink(missing_ok=True)

    exit_file = small_disk / "job-1-1.exit"
    status = wrapper._exit_status(0)
    assert wrapper.record_exit_status(exit_file, status, pause=room_comes_back) is None
    assert json.loads(exit_file.read_text())["returncode"] == 0
    assert len(pauses) == 1
    assert sorted(path.name for path in small_disk.iterdir()) == ["job-1-1.exit"]


def _plan(argv: list[str], started_file: Path) -> LaunchPlan:
    return LaunchPlan(
        processes=[
            {
                "rank": 0,
                "argv": argv,
                "env": {"PATH": "/usr/bin:/bin"},
                "cwd": "/",
                "cgroup_procs": [],
                "oom_file": None,
                "memory_peak_file": None,
                "oom_query": [],
                "memory_limit_bytes": None,
            }
        ],
        grace_period_s=1,
        started_file=str(started_file),
        prepare=[],
        cgroup_dirs=[],
        cleanup=[],
        remove_paths=[],
        remove_after_prepare=[],
        label_output=False,
    )


def _run_wrapper(directory: Path, plan: LaunchPlan) -> subprocess.CompletedProcess[bytes]:
    """The wrapper as the agent starts it; killed with its worker should it hang."""
    started = subprocess.Popen(
        [
            sys.executable,
            "-I",
            wrapper.__file__,
            "--log",
            str(directory / "job.log"),
            "--max-log-bytes",
            "4096",
            "--exit-file",
            str(directory / "job.exit"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = started.communicate(json.dumps(plan).encode(), timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(started.pid, signal.SIGKILL)
        started.communicate()
        raise
    return subprocess.CompletedProcess(started.args, started.returncode, out, err)


def _chatty_worker(marker: Path) -> list[str]:
    """Prints far more than the log keeps (and a pipe holds), then says it finished."""
    script = (
        "import sys\n"
        "for n in range(20000): print('step', n, 'loss 0.1234567890')\n"
        f"open({str(marker)!r}, 'w').write('finished')\n"
    )
    return [sys.executable, "-c", script]


def test_a_log_that_cannot_even_be_opened_costs_the_output_not_the_run(
    few_inodes: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "finished"
    fill_inodes(few_inodes)
    ended = _run_wrapper(few_inodes, _plan(_chatty_worker(marker), few_inodes / "job.started"))
    assert marker.read_text() == "finished"
    assert ended.returncode == wrapper.STATUS_NOT_RECORDED_EXIT_CODE, ended.stderr
    assert ended.stdout == b"started\n"
    last_words = ended.stderr.decode().splitlines()
    assert "cannot open the log" in last_words[0]
    assert last_words[-1].startswith("[Errno 28] No space left on device")


def test_a_log_that_cannot_rotate_drops_the_rest_and_the_worker_runs_on(
    few_inodes: Path, tmp_path: Path
) -> None:
    """The log and the started file take the last two inodes, so the log's first
    rotation cannot make a new file: the output that follows is lost, yet still read,
    so the worker never blocks on it."""
    marker = tmp_path / "finished"
    for filler in fill_inodes(few_inodes)[-2:]:
        filler.unlink()
    ended = _run_wrapper(few_inodes, _plan(_chatty_worker(marker), few_inodes / "job.started"))
    assert marker.read_text() == "finished"
    assert ended.returncode == wrapper.STATUS_NOT_RECORDED_EXIT_CODE, ended.stderr
    assert (few_inodes / "job.log.1").stat().st_size >= 4096  # what it kept before
    assert json.loads((few_inodes / "job.started").read_text())["process_groups"]
