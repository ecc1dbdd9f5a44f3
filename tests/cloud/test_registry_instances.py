"""Which agent instance holds a node (cloud/fleet/registry.py): a copied or forged birth
never takes a node from a running agent; a real restart still switches at once; a node
claimed by two instances is counted as a conflict. Driven by a fake clock."""

from __future__ import annotations

import msgspec
import pytest

from cloud.fleet.liveness import Liveness, LivenessSettings
from cloud.fleet.registry import (
    CANDIDATE_TTL_S,
    MAX_CANDIDATES_PER_NODE,
    NodeRegistry,
    NodeStateChange,
    Rejection,
)
from shared.messages import Accelerator, HostInfo, NodeStatus, OfflineReason, Telemetry

WALL_CLOCK_START_S = 1_700_000_000.0
INTERVAL_S = 5.0


class FakeClock:
    def __init__(self) -> None:
        self.elapsed_s = 0.0

    def monotonic(self) -> float:
        return 500.0 + self.elapsed_s

    def wall(self) -> float:
        return WALL_CLOCK_START_S + self.elapsed_s

    def advance(self, seconds: float) -> None:
        self.elapsed_s += seconds


def birth(instance_id: str, *, gpus: int = 1) -> NodeStatus:
    return NodeStatus(
        node_id="n1",
        state="online",
        instance_id=instance_id,
        agent_version="0.1.0",
        site="cloud",
        zone="DE",
        region="europe-west3",
        host=HostInfo(
            hostname="n1", os="Linux", arch="x86_64", cpu_logical_cores=4, memory_total_bytes=1
        ),
        accelerators=tuple(
            Accelerator(
                id=f"gpu{index}",
                kind="gpu",
                vendor="nvidia",
                model="A100",
                memory_bytes=1024,
                compute_units=108,
            )
            for index in range(gpus)
        ),
        telemetry_interval_s=INTERVAL_S,
        started_at=WALL_CLOCK_START_S,
        sent_at=WALL_CLOCK_START_S,
    )


def offline(instance_id: str, reason: OfflineReason = "connection-lost") -> NodeStatus:
    return msgspec.structs.replace(birth(instance_id), state="offline", offline_reason=reason)


def sample(instance_id: str, seq: int) -> Telemetry:
    return Telemetry(
        node_id="n1",
        instance_id=instance_id,
        seq=seq,
        sampled_at=WALL_CLOCK_START_S + seq,
        interval_s=INTERVAL_S,
        cpu_utilization_pct=10.0,
        memory_used_bytes=1,
        memory_total_bytes=2,
    )


class Harness:
    """A registry, its clock and liveness, and what its listeners heard."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.registry = NodeRegistry(monotonic=self.clock.monotonic, wall_clock=self.clock.wall)
        self.liveness = Liveness(self.registry, LivenessSettings(staleness_intervals=3.0))
        self.instances_heard: list[str] = []
        self.registry.instance_listeners.append(
            lambda _, instance: self.instances_heard.append(instance)
        )
        self._seq: dict[str, int] = {}

    def sample(self, instance_id: str) -> Rejection | NodeStateChange | None:
        """The instance's next sample, one interval after its previous one."""
        self.clock.advance(INTERVAL_S)
        self._seq[instance_id] = self._seq.get(instance_id, 0) + 1
        return self.registry.apply_telemetry(sample(instance_id, self._seq[instance_id]))

    def running(self, instance_id: str) -> None:
        """An agent that announced itself and sends samples."""
        self.registry.apply_status(birth(instance_id))
        assert self.sample(instance_id) is None

    @property
    def current(self) -> str | None:
        return self.registry.current_instance("n1")

    @property
    def state(self) -> tuple[str, str | None]:
        record = self.registry.get("n1")
        assert record is not None
        return record.state, record.offline_reason


@pytest.fixture
def fleet() -> Harness:
    return Harness()


def test_a_forged_birth_never_takes_the_node_from_the_agent_that_sends_samples(
    fleet: Harness,
) -> None:
    fleet.running("real")

    assert fleet.registry.apply_status(birth("forged", gpus=8)) is Rejection.INSTANCE_CONFLICT

    assert fleet.current == "real"
    record = fleet.registry.get("n1")
    assert record is not None
    assert len(record.status.accelerators) == 1  # the forged inventory is not believed
    assert fleet.registry.instance_conflicts == 1
    assert fleet.sample("real") is None  # the real agent keeps its node
    assert fleet.sample("forged") is Rejection.INSTANCE_MISMATCH
    assert fleet.state == ("online", None)
    assert fleet.instances_heard == ["real"]


def test_a_restart_switches_at_the_new_birth_when_the_old_agent_s_will_came_first(
    fleet: Harness,
) -> None:
    fleet.running("old")
    fleet.registry.apply_status(offline("old"))

    assert fleet.registry.apply_status(birth("new")) == NodeStateChange("n1", "online", None)

    assert fleet.current == "new"
    assert fleet.sample("new") is None
    assert fleet.registry.instance_conflicts == 0
    assert fleet.instances_heard == ["old", "new"]


def test_a_clean_restart_switches_and_the_old_instance_cannot_come_back(fleet: Harness) -> None:
    fleet.running("old")
    fleet.registry.apply_status(offline("old", "shutdown"))
    fleet.registry.apply_status(birth("new"))

    assert fleet.current == "new"
    # It said goodbye: a sample in its name is a forgery, or a straggler, either way no claim.
    assert fleet.sample("old") is Rejection.INSTANCE_MISMATCH
    assert fleet.current == "new"


def test_a_restart_whose_old_agent_went_silent_switches_once_it_is_stale(fleet: Harness) -> None:
    fleet.running("old")
    fleet.clock.advance(3 * INTERVAL_S + 1)
    assert fleet.liveness.expire_stale() == [NodeStateChange("n1", "offline", "telemetry-stale")]

    fleet.registry.apply_status(birth("new"))

    assert fleet.current == "new"
    assert fleet.state == ("online", None)


def test_a_candidate_proves_itself_with_a_sample_once_the_current_instance_is_gone(
    fleet: Harness,
) -> None:
    # The new agent's birth overtook the old one's will (both reached us late).
    fleet.running("old")
    assert fleet.registry.apply_status(birth("new")) is Rejection.INSTANCE_CONFLICT
    assert fleet.sample("new") is Rejection.INSTANCE_MISMATCH  # the old one still holds it
    fleet.registry.apply_status(offline("old"))

    assert fleet.sample("new") == NodeStateChange("n1", "online", None)

    assert fleet.current == "new"


def test_a_retained_birth_that_never_sent_a_sample_gives_way_to_a_running_agent(
    fleet: Harness,
) -> None:
    # A control plane starting finds a forged birth retained: it is all it knows.
    fleet.registry.apply_status(birth("forged"))

    assert fleet.registry.apply_status(birth("real")) is None  # online before and after

    assert fleet.current == "real"
    assert fleet.sample("real") is None
    assert fleet.registry.instance_conflicts == 0


def test_a_copied_will_and_a_forged_birth_are_undone_by_the_real_agent_s_next_sample(
    fleet: Harness,
) -> None:
    fleet.running("real")
    fleet.registry.apply_status(offline("real"))  # a copy of the real agent's will
    fleet.registry.apply_status(birth("forged"))
    assert fleet.current == "forged"

    assert fleet.sample("real") is None  # online throughout: no state change

    assert fleet.current == "real"
    assert fleet.state == ("online", None)
    assert fleet.registry.instance_conflicts == 1
    assert fleet.instances_heard == ["real", "forged", "real"]
    # The forged instance cannot win it back with a birth: the real one holds the node.
    assert fleet.registry.apply_status(birth("forged")) is Rejection.INSTANCE_CONFLICT


def test_a_copied_will_keeps_a_running_agent_offline_only_until_its_next_sample(
    fleet: Harness,
) -> None:
    fleet.running("real")
    assert fleet.registry.apply_status(offline("real")) == NodeStateChange(
        "n1", "offline", "connection-lost"
    )

    assert fleet.sample("real") == NodeStateChange("n1", "online", None)

    assert fleet.state == ("online", None)


def test_copies_of_the_current_birth_do_not_keep_a_silent_agent_online(fleet: Harness) -> None:
    fleet.running("real")
    for _ in range(4):
        fleet.clock.advance(INTERVAL_S)
        fleet.registry.apply_status(birth("real"))  # copied: the agent itself died

    assert fleet.liveness.expire_stale() == [NodeStateChange("n1", "offline", "telemetry-stale")]


def test_after_ingestion_subscribes_again_old_samples_prove_nothing(fleet: Harness) -> None:
    """The old agent died while the control plane was cut off; its will was overwritten
    by its successor's retained birth before ingestion could hear it."""
    fleet.running("old")
    fleet.clock.advance(1.0)
    fleet.registry.resubscribed()

    fleet.registry.apply_status(birth("new"))

    assert fleet.current == "new"
    assert fleet.registry.instance_conflicts == 0


def test_forged_births_keep_a_bounded_number_of_candidates_for_a_while(fleet: Harness) -> None:
    fleet.running("real")
    for index in range(50):
        fleet.registry.apply_status(birth(f"forged-{index}"))
    record = fleet.registry.get("n1")
    assert record is not None
    assert list(record.candidates) == [f"forged-{index}" for index in range(47, 50)]
    assert len(record.candidates) == MAX_CANDIDATES_PER_NODE
    assert fleet.registry.instance_conflicts == 50

    fleet.registry.apply_status(offline("forged-49"))  # a candidate's will: it is gone
    assert list(record.candidates) == ["forged-47", "forged-48"]

    fleet.registry.apply_status(offline("real"))
    fleet.clock.advance(CANDIDATE_TTL_S + 1)
    assert fleet.sample("forged-48") is Rejection.INSTANCE_MISMATCH  # expired
    assert fleet.current == "real"


def test_a_candidate_s_sample_far_ahead_of_its_age_is_refused_and_switches_nothing(
    fleet: Harness,
) -> None:
    fleet.running("real")
    fleet.registry.apply_status(birth("forged"))
    fleet.registry.apply_status(offline("real"))

    forged = sample("forged", 2**62)
    assert fleet.registry.apply_telemetry(forged) is Rejection.SEQ_JUMP

    assert fleet.current == "real"
