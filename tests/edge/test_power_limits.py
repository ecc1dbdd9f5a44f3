"""Carbon-aware power capping on the agent: a training worker's GPUs are held to the
limit the cloud asks for while it runs, through NVML (a fake one at the pynvml seam),
and get their default back when it ends. Workers are real processes
(edge/training/process.py); a limit that cannot be set never stops one."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import msgspec
import pynvml
import pytest
from structlog.testing import CapturingLogger

from edge.discovery.nvidia import NvidiaProbe
from edge.discovery.nvidia_power import NO_PERMISSION, NvmlPowerControl
from edge.probes import GpuPowerControl
from edge.training import power_limits as power_limits_module
from edge.training.power_limits import ON_MIG_SLICES, PowerLimits
from edge.training.reconcile import TrainingReconciler
from edge.training.runs import RunStatus
from shared.messages import Accelerator, DesiredTraining, ReportedTraining
from shared.tasks import stop_task
from tests.support.fake_nvml import FakeGpu, FakeMig, FakeNvml
from tests.support.launchers import plain_launcher
from tests.support.waiting import eventually

GIB = 1024**3
# Runs until its go file appears, then exits with the code it was given.
WAIT_FOR_GO = (
    "import os, sys, time\n"
    "while not os.path.exists(sys.argv[1]):\n"
    "    time.sleep(0.01)\n"
    "raise SystemExit(int(sys.argv[2]))\n"
)


def _gpus() -> list[FakeGpu]:
    """gpu0: an A100 (limits 100-400 W, default 400 W); gpu1: the same in MIG mode with
    three instances, gpu1-mig0 to gpu1-mig2."""
    return [
        FakeGpu(
            name="NVIDIA A100-SXM4-40GB",
            uuid="GPU-a100-0",
            memory_total_bytes=40 * GIB,
            power_limit_mw=400_000,
            min_power_limit_mw=100_000,
        ),
        FakeGpu(
            name="NVIDIA A100-SXM4-40GB",
            uuid="GPU-a100-1",
            memory_total_bytes=40 * GIB,
            power_limit_mw=400_000,
            min_power_limit_mw=100_000,
            mig_enabled=True,
            migs={
                0: FakeMig("NVIDIA A100-SXM4-40GB MIG 3g.20gb", "MIG-aaaa", 20 * GIB, 0, 42),
                1: FakeMig("NVIDIA A100-SXM4-40GB MIG 2g.10gb", "MIG-bbbb", 10 * GIB, 0, 28),
                2: FakeMig("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "MIG-cccc", 5 * GIB, 0, 14),
            },
        ),
    ]


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    nvml = FakeNvml(_gpus())
    nvml.install(monkeypatch)
    return nvml


@pytest.fixture
def inventory(fake_nvml: FakeNvml) -> tuple[Accelerator, ...]:
    """What discovery finds on the fake machine: gpu0, gpu1-mig0 to gpu1-mig2."""
    probe = NvidiaProbe(available_providers=())
    try:
        return tuple(probe.discover())
    finally:
        probe.close()


@pytest.fixture
def captured_log(monkeypatch: pytest.MonkeyPatch) -> CapturingLogger:
    logger = CapturingLogger()
    monkeypatch.setattr(power_limits_module, "log", logger)
    return logger


@pytest.fixture
def go(tmp_path: Path) -> Iterator[Path]:
    """The file that lets the test's workers end; made at the end whatever happens, so
    no worker outlives the test."""
    path = tmp_path / "go"
    yield path
    let_go(path)


def let_go(go: Path) -> None:
    """Let the workers waiting on `go` end."""
    go.touch()


def worker(
    go: Path,
    job_id: str = "job-1",
    *,
    gpus: tuple[str, ...] = ("gpu0",),
    limit_w: float | None = 250.0,
    exit_code: int = 0,
) -> DesiredTraining:
    return DesiredTraining(
        job_id=job_id,
        command=(sys.executable, "-c", WAIT_FOR_GO, str(go), str(exit_code)),
        accelerator_ids=gpus,
        grace_period_s=5.0,
        power_limit_w=limit_w,
    )


@contextlib.asynccontextmanager
async def agent(
    tmp_path: Path, inventory: tuple[Accelerator, ...], control: GpuPowerControl | None
) -> AsyncIterator[TrainingReconciler]:
    """A training reconciler as an agent runs it, with a real launcher, for at most 30 s.
    Leaving the block stops that agent: its workers go on, for the next agent to take back."""
    reconciler = TrainingReconciler(
        plain_launcher(tmp_path, inventory),
        inventory,
        on_change=lambda: None,
        on_event=lambda kind, subject, detail: None,
        power_limits=PowerLimits(control, inventory, state_path=tmp_path / "power_limits.json"),
    )
    bound = asyncio.Event()

    async def run() -> None:
        async with asyncio.TaskGroup() as tasks:
            reconciler.bind(tasks)
            bound.set()
            await asyncio.Event().wait()  # until the agent stops

    task = asyncio.create_task(run())
    try:
        async with asyncio.timeout(30):
            await bound.wait()
            yield reconciler
    finally:
        await stop_task(task)
        if control is not None:
            control.close()


def capped_on_disk(tmp_path: Path) -> list[str]:
    """The GPUs the agent's file says it holds capped."""
    return list(msgspec.json.decode((tmp_path / "power_limits.json").read_bytes()))


def report(reconciler: TrainingReconciler, job_id: str = "job-1") -> ReportedTraining:
    (found,) = [r for r in reconciler.reported() if r.job_id == job_id]
    return found


async def state_is(reconciler: TrainingReconciler, state: str, job_id: str = "job-1") -> None:
    await eventually(
        lambda: report(reconciler, job_id).state == state,
        message=lambda: f"{job_id}: {report(reconciler, job_id)}",
    )


# -- the NVML side ------------------------------------------------------------------


def test_a_limit_is_clamped_into_the_constraints_and_the_default_comes_back(
    fake_nvml: FakeNvml, inventory: tuple[Accelerator, ...]
) -> None:
    a100 = fake_nvml.gpus[0]
    gpu0 = inventory[0]
    control = NvmlPowerControl()
    try:
        assert control.set_power_limit_w(gpu0, 250.0) == 250.0
        assert a100.power_limit_mw == 250_000
        assert control.set_power_limit_w(gpu0, 40.0) == 100.0  # the driver's minimum
        assert control.set_power_limit_w(gpu0, 999.0) == 400.0  # ... and maximum
        assert control.set_power_limit_w(gpu0, 212.3456) == 212.346  # whole milliwatts
        control.restore_default_power_limit(gpu0)
    finally:
        control.close()
    assert a100.limits_set_mw == [250_000, 100_000, 400_000, 212_346, 400_000]
    assert a100.power_limit_mw == 400_000


def test_a_mig_instance_is_capped_through_its_gpu(
    fake_nvml: FakeNvml, inventory: tuple[Accelerator, ...]
) -> None:
    mig_parent = fake_nvml.gpus[1]
    mig0 = next(a for a in inventory if a.id == "gpu1-mig0")
    control = NvmlPowerControl()
    try:
        assert control.set_power_limit_w(mig0, 300.0) == 300.0
        assert mig_parent.power_limit_mw == 300_000
        control.restore_default_power_limit(mig0)
    finally:
        control.close()
    assert mig_parent.power_limit_mw == 400_000


# -- a worker's life under a limit ------------------------------------------------


@pytest.mark.parametrize(
    ("exit_code", "withdrawn", "state"),
    [(0, False, "succeeded"), (3, False, "failed"), (0, True, "stopped")],
)
async def test_the_limit_is_held_while_the_worker_runs_and_the_default_comes_back_at_its_end(
    tmp_path: Path,
    fake_nvml: FakeNvml,
    inventory: tuple[Accelerator, ...],
    go: Path,
    exit_code: int,
    withdrawn: bool,
    state: str,
) -> None:
    a100 = fake_nvml.gpus[0]
    async with agent(tmp_path, inventory, NvmlPowerControl()) as training:
        training.apply([worker(go, limit_w=50.0, exit_code=exit_code)])
        await state_is(training, "running")
        # 50 W is below what the A100 allows: it is held to its minimum.
        await eventually(lambda: report(training).power_limit_w == 100.0)
        assert a100.power_limit_mw == 100_000
        assert report(training).power_limit_note == ""
        assert fake_nvml.gpus[1].limits_set_mw == []  # not its GPU

        if withdrawn:
            training.apply([])
            await eventually(lambda: a100.power_limit_mw == 400_000)
        else:
            let_go(go)
            await state_is(training, state)
            await eventually(lambda: a100.power_limit_mw == 400_000)
            assert report(training).exit_code == exit_code
            assert report(training).power_limit_w == 100.0  # what it ran under
    assert a100.limits_set_mw == [100_000, 400_000]
    await eventually(lambda: capped_on_disk(tmp_path) == [])  # written after the restore


async def test_a_worker_taken_back_by_a_restarted_agent_is_capped_again(
    tmp_path: Path, fake_nvml: FakeNvml, inventory: tuple[Accelerator, ...], go: Path
) -> None:
    a100 = fake_nvml.gpus[0]
    spec = worker(go)
    async with agent(tmp_path, inventory, NvmlPowerControl()) as training:
        training.apply([spec])
        await eventually(lambda: report(training).power_limit_w == 250.0)
        await state_is(training, "running")
    # The agent stopped; its worker runs on, still capped, as its file says.
    assert a100.power_limit_mw == 250_000
    assert capped_on_disk(tmp_path) == ["gpu0"]
    a100.power_limit_mw = 400_000  # the driver reloaded meanwhile: the limit is gone

    async with agent(tmp_path, inventory, NvmlPowerControl()) as training:
        training.apply([spec])
        assert report(training).state == "running"  # taken back, not started again
        await eventually(lambda: a100.power_limit_mw == 250_000)
        assert report(training).power_limit_w == 250.0
        let_go(go)
        await state_is(training, "succeeded")
        await eventually(lambda: a100.power_limit_mw == 400_000)
    assert a100.limits_set_mw == [250_000, 250_000, 400_000]


async def test_a_gpu_capped_for_a_worker_that_ended_while_no_agent_ran_gets_its_default_back(
    tmp_path: Path, fake_nvml: FakeNvml, inventory: tuple[Accelerator, ...], go: Path
) -> None:
    a100 = fake_nvml.gpus[0]
    async with agent(tmp_path, inventory, NvmlPowerControl()) as training:
        training.apply([worker(go)])
        await eventually(lambda: a100.power_limit_mw == 250_000)
    let_go(go)  # it ends while no agent runs, and the cloud withdraws it meanwhile
    assert capped_on_disk(tmp_path) == ["gpu0"]

    async with agent(tmp_path, inventory, NvmlPowerControl()) as training:
        training.apply([])
        await eventually(lambda: a100.power_limit_mw == 400_000)
    await eventually(lambda: capped_on_disk(tmp_path) == [])  # written after the restore


async def test_workers_sharing_a_gpu_hold_it_to_the_lowest_limit_asked_while_they_run(
    tmp_path: Path, fake_nvml: FakeNvml, inventory: tuple[Accelerator, ...]
) -> None:
    parent = fake_nvml.gpus[0]  # a whole GPU the three workers share
    go_high, go_low, go_free = tmp_path / "go-high", tmp_path / "go-low", tmp_path / "go-free"
    high = worker(go_high, "high", gpus=("gpu0",), limit_w=300.0)
    low = worker(go_low, "low", gpus=("gpu0",), limit_w=200.0)
    free = worker(go_free, "free", gpus=("gpu0",), limit_w=None)

    def held_w() -> dict[str, float | None]:
        return {r.job_id: r.power_limit_w for r in training.reported() if r.state == "running"}

    try:
        async with agent(tmp_path, inventory, NvmlPowerControl()) as training:
            training.apply([high])
            await eventually(lambda: parent.power_limit_mw == 300_000)
            training.apply([high, low, free])
            await eventually(lambda: parent.power_limit_mw == 200_000)
            # Each reports what its GPU is held to, the one that asked none too.
            await eventually(lambda: held_w() == {"high": 200.0, "low": 200.0, "free": 200.0})

            let_go(go_low)
            await eventually(lambda: parent.power_limit_mw == 300_000)
            await eventually(lambda: held_w() == {"high": 300.0, "free": 300.0})
            let_go(go_high)  # a worker that asks no limit does not keep one
            await eventually(lambda: parent.power_limit_mw == 400_000)
            await eventually(lambda: held_w() == {"free": None})
            let_go(go_free)
            await state_is(training, "succeeded", "free")
    finally:
        for go in (go_high, go_low, go_free):
            let_go(go)
    assert parent.limits_set_mw == [300_000, 200_000, 300_000, 400_000]
    assert fake_nvml.gpus[1].limits_set_mw == []


# -- when no limit can be set --------------------------------------------------------


async def test_without_permission_the_worker_runs_at_the_default_and_says_why(
    tmp_path: Path,
    fake_nvml: FakeNvml,
    inventory: tuple[Accelerator, ...],
    go: Path,
    captured_log: CapturingLogger,
) -> None:
    for gpu in fake_nvml.gpus:  # the agent is not root
        gpu.failing["nvmlDeviceSetPowerManagementLimit"] = pynvml.NVMLError_NoPermission
    expected_note = f"power limit not applied: {NO_PERMISSION}"
    async with agent(tmp_path, inventory, NvmlPowerControl()) as training:
        training.apply([worker(go, "a"), worker(go, "b", gpus=("gpu0",), limit_w=200.0)])
        await state_is(training, "running", "a")
        await state_is(training, "running", "b")
        await eventually(lambda: all(r.power_limit_note for r in training.reported()))
        for reported in training.reported():
            assert (reported.power_limit_w, reported.power_limit_note) == (None, expected_note)
        let_go(go)
        await state_is(training, "succeeded", "a")
        await state_is(training, "succeeded", "b")
    assert all(gpu.power_limit_mw == 400_000 for gpu in fake_nvml.gpus)
    warnings = [call for call in captured_log.calls if call.method_name == "warning"]
    assert [call.kwargs["why"] for call in warnings] == [NO_PERMISSION]  # said once


async def test_without_nvml_the_worker_runs_at_the_default_and_says_why(
    tmp_path: Path, fake_nvml: FakeNvml, inventory: tuple[Accelerator, ...], go: Path
) -> None:
    fake_nvml.init_error = pynvml.NVMLError_DriverNotLoaded
    async with agent(tmp_path, inventory, NvmlPowerControl()) as training:
        training.apply([worker(go)])
        await state_is(training, "running")
        await eventually(lambda: report(training).power_limit_note != "")
        note = report(training).power_limit_note
        assert note.startswith("power limit not applied: NVML is not available (")
        assert report(training).power_limit_w is None
        let_go(go)
        await state_is(training, "succeeded")


async def test_a_node_without_a_power_control_runs_the_worker_and_says_so(
    tmp_path: Path, inventory: tuple[Accelerator, ...], go: Path
) -> None:
    async with agent(tmp_path, inventory, None) as training:
        training.apply([worker(go)])
        await state_is(training, "running")
        await eventually(lambda: report(training).power_limit_note != "")
        assert report(training).power_limit_note == (
            "power limit not applied: this node cannot set GPU power limits"
        )
        let_go(go)
        await state_is(training, "succeeded")


async def test_an_unexpected_control_failure_costs_the_limit_not_the_worker(
    tmp_path: Path, fake_nvml: FakeNvml, inventory: tuple[Accelerator, ...], go: Path
) -> None:
    fake_nvml.gpus[0].failing["nvmlDeviceSetPowerManagementLimit"] = RuntimeError
    async with agent(tmp_path, inventory, NvmlPowerControl()) as training:
        training.apply([worker(go)])
        await state_is(training, "running")
        await eventually(lambda: report(training).power_limit_note != "")
        assert "unexpected error (RuntimeError" in report(training).power_limit_note
        let_go(go)
        await state_is(training, "succeeded")


async def test_a_limit_on_a_worker_without_a_gpu_is_not_applied_and_says_why(
    fake_nvml: FakeNvml, inventory: tuple[Accelerator, ...]
) -> None:
    limits = PowerLimits(NvmlPowerControl(), inventory)
    status = RunStatus("cpu-job", 0)
    limits.hold(DesiredTraining(job_id="cpu-job", power_limit_w=200.0), status)
    async with asyncio.timeout(5):
        assert await limits.settle()
    assert status.power_limit_note == "power limit not applied: the worker has no GPU"
    assert [gpu.limits_set_mw for gpu in fake_nvml.gpus] == [[], []]


# MIG slices: NVML limits power per physical GPU, so the parent's limit would hold its
# sibling instances, other tenants' work among them, too. A control plane of an older
# version may still ask: the worker runs at the default, reports nothing capped and says
# why, and the agent logs it once.
REFUSED_NOTE = f"power limit not applied: {ON_MIG_SLICES}"


async def test_a_limit_asked_for_mig_slices_is_never_applied_to_their_gpu(
    tmp_path: Path,
    fake_nvml: FakeNvml,
    inventory: tuple[Accelerator, ...],
    go: Path,
    captured_log: CapturingLogger,
) -> None:
    whole, mig_parent = fake_nvml.gpus
    async with agent(tmp_path, inventory, NvmlPowerControl()) as training:
        # An older control plane caps two tenants' workers on slices, and one on a
        # whole GPU; a third tenant's worker on a sibling slice asks nothing.
        training.apply(
            [
                worker(go, "slice-a", gpus=("gpu1-mig0",), limit_w=200.0),
                worker(go, "slice-b", gpus=("gpu1-mig1",), limit_w=150.0),
                worker(go, "sibling", gpus=("gpu1-mig2",), limit_w=None),
                worker(go, "whole", gpus=("gpu0",), limit_w=250.0),
            ]
        )
        for job_id in ("slice-a", "slice-b", "sibling", "whole"):
            await state_is(training, "running", job_id)
        # One settle brings every held GPU to what is asked and tells every run.
        await eventually(lambda: report(training, "whole").power_limit_w == 250.0)
        for job_id in ("slice-a", "slice-b"):
            reported = report(training, job_id)
            assert (reported.power_limit_w, reported.power_limit_note) == (None, REFUSED_NOTE)
        sibling = report(training, "sibling")
        assert (sibling.power_limit_w, sibling.power_limit_note) == (None, "")
        assert mig_parent.limits_set_mw == []  # the sibling's GPU runs at its default
        assert mig_parent.power_limit_mw == 400_000
        assert whole.power_limit_mw == 250_000  # a whole GPU is still capped
        let_go(go)
        for job_id in ("slice-a", "slice-b", "sibling", "whole"):
            await state_is(training, "succeeded", job_id)
        await eventually(lambda: whole.power_limit_mw == 400_000)
    assert mig_parent.limits_set_mw == []
    refusals = [
        call.kwargs
        for call in captured_log.calls
        if call.method_name == "warning" and call.kwargs.get("why") == ON_MIG_SLICES
    ]
    assert len(refusals) == 1  # said once, for the first such worker
    assert refusals[0]["limit_w"] in (200.0, 150.0)


async def test_a_gpu_an_older_agent_capped_for_a_slice_gets_its_default_back(
    tmp_path: Path, fake_nvml: FakeNvml, inventory: tuple[Accelerator, ...], go: Path
) -> None:
    mig_parent = fake_nvml.gpus[1]
    # An agent of an older version capped the parent for a worker on a slice, and said
    # so in its file; the worker runs on (taken back, or started again: the same ask).
    mig_parent.power_limit_mw = 200_000
    (tmp_path / "power_limits.json").write_bytes(msgspec.json.encode(["gpu1"]))
    async with agent(tmp_path, inventory, NvmlPowerControl()) as training:
        training.apply([worker(go, "slice-a", gpus=("gpu1-mig0",), limit_w=200.0)])
        await state_is(training, "running", "slice-a")
        # Settled: the report says what the GPU is held to, or why it is not.
        await eventually(
            lambda: (
                report(training, "slice-a").power_limit_w is not None
                or report(training, "slice-a").power_limit_note != ""
            )
        )
        reported = report(training, "slice-a")
        assert (reported.power_limit_w, reported.power_limit_note) == (None, REFUSED_NOTE)
        assert mig_parent.power_limit_mw == 400_000
        let_go(go)
        await state_is(training, "succeeded", "slice-a")
    assert mig_parent.limits_set_mw == [400_000]
    assert msgspec.json.decode((tmp_path / "power_limits.json").read_bytes()) == []
