"""Desired training workers become runs, and runs become reported states and events."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from edge.training.environment import WorkerSpecError, process_environment, visible_devices
from edge.training.reconcile import TrainingReconciler
from shared.messages import Accelerator, DesiredTraining, ReportedTraining
from sim_devices.training import SimulatedLauncher, simulated_runtime_s
from tests.support.waiting import eventually

INVENTORY = (
    Accelerator(
        id="cpu0", kind="cpu", vendor="amd", model="EPYC", memory_bytes=1, compute_units=64
    ),
    Accelerator(
        id="gpu0",
        kind="gpu",
        vendor="nvidia",
        model="H100",
        memory_bytes=1,
        compute_units=132,
        index=0,
        relative_speed=2.5,
    ),
    Accelerator(
        id="gpu1",
        kind="gpu",
        vendor="nvidia",
        model="A100",
        memory_bytes=1,
        compute_units=108,
        index=1,
        relative_speed=1.0,
    ),
    Accelerator(
        id="gpu1-mig0",
        kind="gpu",
        vendor="nvidia",
        model="A100 MIG 3g.20gb",
        memory_bytes=1,
        compute_units=42,
        uuid="MIG-abc",
        parent_id="gpu1",
    ),
)


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []
        self.changes = 0

    def event(self, kind: str, subject: str, detail: str) -> None:
        self.events.append((kind, subject, detail))

    def changed(self) -> None:
        self.changes += 1


@pytest.fixture
async def reconciler() -> AsyncIterator[tuple[TrainingReconciler, Recorder]]:
    recorder = Recorder()
    training = TrainingReconciler(
        SimulatedLauncher(INVENTORY), INVENTORY, on_change=recorder.changed, on_event=recorder.event
    )
    async with asyncio.TaskGroup() as tasks:
        training.bind(tasks)
        yield training, recorder
        await training.stop_all("test over")


def states(training: TrainingReconciler) -> dict[tuple[str, int], str]:
    return {(r.job_id, r.attempt): r.state for r in training.reported()}


def worker(
    job_id: str, attempt: int = 0, seconds: float = 0.05, env: dict[str, str] | None = None
) -> DesiredTraining:
    return DesiredTraining(
        job_id=job_id,
        attempt=attempt,
        accelerator_ids=("gpu1",),
        reference_duration_s=seconds,
        env=env or {},
    )


def test_visible_devices_uses_uuids_indices_without_them_and_ignores_other_kinds() -> None:
    assert visible_devices(("gpu1", "gpu0"), INVENTORY) == "1,0"  # these have no UUID
    assert visible_devices(("gpu1-mig0",), INVENTORY) == "MIG-abc"
    assert visible_devices(("cpu0",), INVENTORY) == ""
    with pytest.raises(WorkerSpecError, match="gpu7"):
        visible_devices(("gpu7",), INVENTORY)


def test_greenfed_variables_win_over_the_jobs_own() -> None:
    spec = DesiredTraining(job_id="j", env={"WORLD_SIZE": "99", "LR": "0.1"}, world_size=4, rank=2)
    env = process_environment(
        spec, INVENTORY, local=0, secret_env={}, work_dir="/w", user_name="greenfed-70000"
    )
    assert (env["WORLD_SIZE"], env["RANK"], env["LR"]) == ("4", "2", "0.1")
    assert env["CUDA_VISIBLE_DEVICES"] == ""  # no GPU assigned: none visible
    assert "MASTER_ADDR" not in env


def test_simulated_runtime_scales_with_the_slowest_assigned_accelerator() -> None:
    both = DesiredTraining(job_id="j", accelerator_ids=("gpu0", "gpu1"), reference_duration_s=100)
    fast = DesiredTraining(job_id="j", accelerator_ids=("gpu0",), reference_duration_s=100)
    assert simulated_runtime_s(both, INVENTORY) == 100.0
    assert simulated_runtime_s(fast, INVENTORY) == 40.0


async def test_a_worker_runs_then_succeeds_and_stays_reported_while_listed(
    reconciler: tuple[TrainingReconciler, Recorder],
) -> None:
    training, recorder = reconciler
    training.apply([worker("j1")])
    await eventually(lambda: states(training) == {("j1", 0): "succeeded"})
    assert [(kind, subject) for kind, subject, _ in recorder.events] == [
        ("started", "j1"),
        ("exited", "j1"),
    ]
    report = training.reported()[0]
    assert isinstance(report, ReportedTraining)
    assert report.exit_code == 0
    assert report.started_at is not None
    assert report.finished_at is not None
    training.apply([worker("j1")])  # the same document again changes nothing
    assert states(training) == {("j1", 0): "succeeded"}
    training.apply([])  # the cloud has seen the outcome and drops it
    assert training.reported() == ()


async def test_withdrawing_a_running_worker_stops_it_and_a_new_attempt_runs_afresh(
    reconciler: tuple[TrainingReconciler, Recorder],
) -> None:
    training, recorder = reconciler
    training.apply([worker("j2", seconds=60)])
    await eventually(lambda: states(training) == {("j2", 0): "running"})
    training.apply([worker("j2", attempt=1, seconds=0.05)])
    await eventually(lambda: states(training) == {("j2", 1): "succeeded"})
    kinds = [(kind, detail) for kind, subject, detail in recorder.events if subject == "j2"]
    assert ("exited", "stopped: withdrawn by the cloud") in kinds
    assert kinds[-1][0] == "exited"


async def test_a_failing_worker_reports_its_exit_code(
    reconciler: tuple[TrainingReconciler, Recorder],
) -> None:
    training, recorder = reconciler
    training.apply([worker("j3", env={"GREENFED_SIM_EXIT_CODE": "3"})])
    await eventually(lambda: states(training) == {("j3", 0): "failed"})
    assert training.reported()[0].exit_code == 3
    assert recorder.events[-1] == ("failed", "j3", "failed: exit code 3")


async def test_a_node_without_training_or_without_the_accelerator_rejects_the_worker() -> None:
    recorder = Recorder()
    no_training = TrainingReconciler(
        None, INVENTORY, on_change=recorder.changed, on_event=recorder.event
    )
    async with asyncio.TaskGroup() as tasks:
        no_training.bind(tasks)
        no_training.apply([worker("j4")])
        await eventually(lambda: states(no_training) == {("j4", 0): "failed"})
        assert no_training.reported()[0].reason == "this node does not run training"
    recorder = Recorder()
    training = TrainingReconciler(
        SimulatedLauncher(INVENTORY), INVENTORY, on_change=recorder.changed, on_event=recorder.event
    )
    async with asyncio.TaskGroup() as tasks:
        training.bind(tasks)
        training.apply([DesiredTraining(job_id="j5", accelerator_ids=("gpu9",))])
        await eventually(lambda: states(training) == {("j5", 0): "failed"})
        assert "gpu9" in training.reported()[0].reason


async def test_stopping_the_agent_stops_every_worker(
    reconciler: tuple[TrainingReconciler, Recorder],
) -> None:
    training, _ = reconciler
    training.apply([worker("a", seconds=60), worker("b", seconds=60)])
    await eventually(lambda: set(states(training).values()) == {"running"})
    await training.stop_all("the agent is stopping")
    assert set(states(training).values()) == {"stopped"}
