"""An agent restarted from its state directory runs the document kept there, and takes a
document from the broker only once the control plane has answered its birth, on the real
Mosquitto (edge/agent/desired.py, rule 3): a signed document issued for the instance
before it, newer than the one on disk, may be a superseded one that someone on the broker
re-published, and must not start the work that the control plane cancelled since."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path

import pytest

from edge.agent import Agent
from edge.training.runs import TrainingLauncher, TrainingRun
from shared.messages import Accelerator, DesiredState, DesiredTraining
from sim_devices.training import SimulatedLauncher
from tests.support.fleet import mqtt_settings, publish_desired, running, simulated_agent
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(60)

NODE = "v100-4"


class PreparedJobs:
    """A simulated launcher that notes every job it is asked to start."""

    def __init__(self, inventory: Sequence[Accelerator], prepared: list[str]) -> None:
        self._launcher = SimulatedLauncher(inventory)
        self._prepared = prepared

    def prepare(self, spec: DesiredTraining) -> TrainingRun:
        self._prepared.append(spec.job_id)
        return self._launcher.prepare(spec)

    def adopt(self, spec: DesiredTraining) -> TrainingRun | None:
        return self._launcher.adopt(spec)

    def leftovers(self, claimed: Collection[tuple[str, int]]) -> Sequence[TrainingRun]:
        return self._launcher.leftovers(claimed)


def worker(job_id: str) -> DesiredTraining:
    return DesiredTraining(job_id=job_id, command=("python", "t.py"), reference_duration_s=3600.0)


def document(
    generation: int,
    for_instance: str | None,
    *job_ids: str,
    cluster_id: str = "c1",
    issued_at: float | None = None,
) -> DesiredState:
    return DesiredState(
        node_id=NODE,
        generation=generation,
        issued_at=1000.0 + generation if issued_at is None else issued_at,
        cluster_id=cluster_id,
        for_instance=for_instance,
        training=tuple(worker(job_id) for job_id in job_ids),
    )


def running_jobs(agent: Agent) -> set[str]:
    if agent.training is None:
        return set()  # not started yet
    return {entry.job_id for entry in agent.training.reported() if entry.state == "running"}


def trainer(url: str, topic_root: str, state_dir: Path, prepared: list[str]) -> Agent:
    def launcher(inventory: Sequence[Accelerator]) -> TrainingLauncher:
        return PreparedJobs(inventory, prepared)

    return simulated_agent(
        NODE,
        mqtt_settings(url, topic_root),
        "v100-8x",
        training_launcher=launcher,
        state_dir=state_dir,
    )


async def test_a_restarted_agent_runs_no_superseded_document_replayed_for_its_earlier_instance(
    mosquitto_root: tuple[str, str], tmp_path: Path
) -> None:
    url, topic_root = mosquitto_root
    prepared: list[str] = []
    first = trainer(url, topic_root, tmp_path / "state", prepared)
    async with running(first):
        await eventually(first.announced.is_set)
        await publish_desired(url, topic_root, document(1, first.instance_id, "keep"))
        await eventually(lambda: running_jobs(first) == {"keep"})
    # While the node is down the control plane places a job (generation 2), then cancels
    # it (3), both issued for the instance it knew. Someone on the broker re-publishes the
    # captured generation 2 over the control plane's newest.
    await publish_desired(url, topic_root, document(3, first.instance_id, "keep"))
    await publish_desired(url, topic_root, document(2, first.instance_id, "keep", "cancelled"))

    second = trainer(url, topic_root, tmp_path / "state", prepared)
    async with running(second):
        await eventually(lambda: second.counters.desired_restored == 1)
        await eventually(
            lambda: (
                second.counters.desired_not_for_this_instance >= 1
                or second.observed_generation != 1
            ),
            message="the replayed document never arrived",
        )
        assert second.observed_generation == 1, "the replayed generation 2 was applied"
        assert "cancelled" not in prepared, "the cancelled job was started"
        assert running_jobs(second) == {"keep"}  # the document on disk still runs
        # Unanswered, the agent announces itself again for the control plane to answer.
        await eventually(lambda: second.counters.births_repeated >= 1, timeout_s=15)

        # The control plane's answer: its newest document, issued for this instance.
        await publish_desired(url, topic_root, document(3, second.instance_id, "keep"))
        await eventually(lambda: second.observed_generation == 3)
        assert running_jobs(second) == {"keep"}
        assert "cancelled" not in prepared


async def test_a_restarted_agent_takes_the_control_plane_s_answer_and_goes_by_generations(
    mosquitto_root: tuple[str, str], tmp_path: Path
) -> None:
    """The ordinary restart: the retained document is the one on disk (nothing to say of
    it), the control plane answers the birth with it again, issued for the new instance,
    and from then on newer documents apply whoever they were issued for; a control plane
    whose store was reset (another cluster, issued later) is adopted as before."""
    url, topic_root = mosquitto_root
    prepared: list[str] = []
    first = trainer(url, topic_root, tmp_path / "state", prepared)
    async with running(first):
        await eventually(first.announced.is_set)
        await publish_desired(url, topic_root, document(5, first.instance_id, "kept"))
        await eventually(lambda: running_jobs(first) == {"kept"})

    second = trainer(url, topic_root, tmp_path / "state", prepared)
    async with running(second):
        await eventually(lambda: second.counters.desired_received >= 1)  # the retained one
        assert second.observed_generation == 5
        assert second.counters.desired_not_for_this_instance == 0  # the same: not news

        await publish_desired(url, topic_root, document(5, second.instance_id, "kept"))
        await eventually(lambda: second.counters.desired_received >= 2)
        await publish_desired(url, topic_root, document(6, first.instance_id, "kept", "more"))
        await eventually(lambda: running_jobs(second) == {"kept", "more"})

        reset = document(1, second.instance_id, "after-reset", cluster_id="c2", issued_at=2000.0)
        await publish_desired(url, topic_root, reset)
        await eventually(lambda: running_jobs(second) == {"after-reset"})
        assert second.observed_generation == 1


async def test_a_restarted_agent_of_an_old_control_plane_applies_its_unbound_documents(
    mosquitto_root: tuple[str, str], tmp_path: Path
) -> None:
    """A control plane older than 1.9 binds nothing: its documents go by generations."""
    url, topic_root = mosquitto_root
    prepared: list[str] = []
    first = trainer(url, topic_root, tmp_path / "state", prepared)
    async with running(first):
        await eventually(first.announced.is_set)
        await publish_desired(url, topic_root, document(1, None, "kept"))
        await eventually(lambda: running_jobs(first) == {"kept"})
    await publish_desired(url, topic_root, document(2, None, "kept", "more"))

    second = trainer(url, topic_root, tmp_path / "state", prepared)
    async with running(second):
        await eventually(lambda: running_jobs(second) == {"kept", "more"})
        assert second.observed_generation == 2
