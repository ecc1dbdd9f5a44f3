"""The applied `desired` document kept in the agent's state directory, on the real
Mosquitto: written before it is applied, so that an agent restarted without its broker
never restores a document older than what ran; written again when a save failed; one
that cannot be read back is passed over for the broker's."""

from __future__ import annotations

import errno
from collections.abc import Collection, Sequence
from pathlib import Path

import pytest

from edge.agent import Agent
from edge.agent.state_files import DESIRED_FILE, AgentStateFiles
from edge.atomic_files import write_atomically
from edge.training.runs import TrainingLauncher, TrainingRun
from shared.messages import DESIRED_DECODER, Accelerator, DesiredState, DesiredTraining
from sim_devices.training import SimulatedLauncher
from tests.support.fleet import mqtt_settings, publish_desired, running, simulated_agent
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(60)

NODE = "v100-3"
UNREACHABLE_BROKER = "mqtt://127.0.0.1:1"


def worker(job_id: str) -> DesiredTraining:
    return DesiredTraining(job_id=job_id, command=("python", "t.py"), reference_duration_s=3600.0)


def document(agent: Agent, generation: int, *job_ids: str) -> DesiredState:
    return DesiredState(
        node_id=NODE,
        generation=generation,
        issued_at=float(generation),
        cluster_id="c1",
        for_instance=agent.instance_id,
        training=tuple(worker(job_id) for job_id in job_ids),
    )


def generation_on_disk(state_dir: Path) -> int | None:
    path = state_dir / DESIRED_FILE
    return DESIRED_DECODER.decode(path.read_bytes()).generation if path.exists() else None


def running_jobs(agent: Agent) -> set[str]:
    training = agent.training
    if training is None:
        return set()
    return {entry.job_id for entry in training.reported() if entry.state == "running"}


async def test_a_document_whose_save_failed_is_saved_when_it_comes_again(
    mosquitto_root: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, topic_root = mosquitto_root
    state_dir = tmp_path / "state"
    refused: list[Path] = []
    disk_full = False

    def write(path: Path, data: bytes) -> None:
        if disk_full:
            refused.append(path)
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        write_atomically(path, data)

    monkeypatch.setattr("edge.agent.state_files.write_atomically", write)
    agent = simulated_agent(
        NODE, mqtt_settings(url, topic_root), "v100-8x", trains=True, state_dir=state_dir
    )
    async with running(agent):
        await eventually(agent.announced.is_set)
        await publish_desired(url, topic_root, document(agent, 1, "keep", "cancelled"))
        await eventually(lambda: running_jobs(agent) == {"keep", "cancelled"})

        disk_full = True  # for a moment: the cancellation is applied, not saved
        withdrawn = document(agent, 2, "keep")
        await publish_desired(url, topic_root, withdrawn)
        await eventually(lambda: agent.observed_generation == 2)
        await eventually(lambda: any(path.name == DESIRED_FILE for path in refused))
        assert generation_on_disk(state_dir) == 1

        disk_full = False  # space again; the control plane sends the same document again
        await publish_desired(url, topic_root, withdrawn)
        await eventually(
            lambda: generation_on_disk(state_dir) == 2,
            message=lambda: f"desired.json still holds generation {generation_on_disk(state_dir)}",
        )

    # Restarted while its broker is unreachable: what the control plane withdrew stays so.
    again = simulated_agent(
        NODE,
        mqtt_settings(UNREACHABLE_BROKER, topic_root),
        "v100-8x",
        trains=True,
        state_dir=state_dir,
    )
    async with running(again):
        await eventually(lambda: again.counters.desired_restored == 1)
        await eventually(lambda: running_jobs(again) == {"keep"})
        assert again.observed_generation == 2


class DiskWitness:
    """A launcher that notes, as each worker is prepared, which generation is on disk."""

    def __init__(self, launcher: TrainingLauncher, state_dir: Path) -> None:
        self._launcher = launcher
        self._state_dir = state_dir
        self.on_disk_at_start: dict[str, int | None] = {}

    def prepare(self, spec: DesiredTraining) -> TrainingRun:
        self.on_disk_at_start[spec.job_id] = generation_on_disk(self._state_dir)
        return self._launcher.prepare(spec)

    def adopt(self, spec: DesiredTraining) -> TrainingRun | None:
        return self._launcher.adopt(spec)

    def leftovers(self, claimed: Collection[tuple[str, int]]) -> Sequence[TrainingRun]:
        return self._launcher.leftovers(claimed)


async def test_a_worker_starts_only_once_the_document_listing_it_is_on_disk(
    mosquitto_root: tuple[str, str], tmp_path: Path
) -> None:
    """Else an agent that ends just after starting it restores the older document, which
    does not list the worker: the next agent would stop it as not wanted."""
    url, topic_root = mosquitto_root
    state_dir = tmp_path / "state"
    witnesses: list[DiskWitness] = []

    def launcher(inventory: Sequence[Accelerator]) -> TrainingLauncher:
        witnesses.append(DiskWitness(SimulatedLauncher(inventory), state_dir))
        return witnesses[-1]

    agent = simulated_agent(
        NODE,
        mqtt_settings(url, topic_root),
        "v100-8x",
        training_launcher=launcher,
        state_dir=state_dir,
    )
    async with running(agent):
        await eventually(agent.announced.is_set)
        await publish_desired(url, topic_root, document(agent, 1, "first"))
        await eventually(lambda: running_jobs(agent) == {"first"})
        await publish_desired(url, topic_root, document(agent, 2, "first", "second"))
        await eventually(lambda: running_jobs(agent) == {"first", "second"})
    assert witnesses[-1].on_disk_at_start == {"first": 1, "second": 2}


def test_a_saved_document_that_cannot_be_read_is_counted_and_passed_over(
    tmp_path: Path,
) -> None:
    (tmp_path / DESIRED_FILE).mkdir()  # whatever is there, it cannot be read as a file
    state = AgentStateFiles(tmp_path)
    assert state.load_desired() is None
    assert state.read_errors == 1


@pytest.mark.parametrize("cause", ["failing disk", "not a file"])
async def test_an_agent_whose_saved_document_cannot_be_read_applies_the_brokers(
    mosquitto_root: tuple[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cause: str,
) -> None:
    """A failing SD card (EIO) or a damaged state directory must not stop the agent at
    every start: it goes on without the saved copy, and the retained document on the
    broker reconciles."""
    url, topic_root = mosquitto_root
    state_dir = tmp_path / "state"
    saved = state_dir / DESIRED_FILE
    if cause == "not a file":
        saved.mkdir(parents=True)
    else:
        state_dir.mkdir()
        saved.write_bytes(b"{}")
        read_bytes = Path.read_bytes

        def failing_read(path: Path) -> bytes:
            if path == saved:
                raise OSError(errno.EIO, "Input/output error", str(path))
            return read_bytes(path)

        monkeypatch.setattr(Path, "read_bytes", failing_read)
    agent = simulated_agent(
        NODE, mqtt_settings(url, topic_root), "v100-8x", trains=True, state_dir=state_dir
    )
    async with running(agent) as task:
        await eventually(
            lambda: agent.announced.is_set() or task.done(),
            message="the agent never announced itself",
        )
        assert not task.done(), f"the agent ended: {task.exception()!r}"
        await publish_desired(url, topic_root, document(agent, 1, "after"))
        await eventually(lambda: running_jobs(agent) == {"after"})
