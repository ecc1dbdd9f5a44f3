"""The node registry (membership, filters) and node liveness (cloud/fleet/liveness.py:
staleness, the grace before work is lost, the timer), driven by fake clocks."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from cloud.fleet.liveness import STALL_S, Liveness, LivenessSettings
from cloud.fleet.registry import NodeFilter, NodeRecord, NodeRegistry, NodeStateChange, Rejection
from shared.messages import (
    Accelerator,
    AcceleratorKind,
    HostInfo,
    NodeState,
    NodeStatus,
    OfflineReason,
    ReportedState,
    Site,
    Telemetry,
)
from shared.settings import CloudSettings, MqttSettings, SchedulingSettings, Settings
from shared.tasks import stop_task
from tests.support.waiting import eventually

WALL_CLOCK_START_S = 1_700_000_000.0


class FakeClock:
    """A clock a test moves by hand; `monotonic` and `wall` advance together."""

    def __init__(self) -> None:
        self.elapsed_s = 0.0

    def monotonic(self) -> float:
        return 500.0 + self.elapsed_s

    def wall(self) -> float:
        return WALL_CLOCK_START_S + self.elapsed_s

    def advance(self, seconds: float) -> None:
        self.elapsed_s += seconds


def accelerator(kind: AcceleratorKind, index: int = 0) -> Accelerator:
    return Accelerator(
        id=f"{kind}{index}",
        kind=kind,
        vendor="vendor",
        model="model",
        memory_bytes=1024,
        compute_units=1,
    )


def status(
    node_id: str = "n1",
    *,
    instance_id: str = "i1",
    state: NodeState = "online",
    offline_reason: OfflineReason | None = None,
    site: Site = "edge",
    zone: str = "CA-ON",
    region: str = "northamerica-northeast2",
    kinds: tuple[AcceleratorKind, ...] = ("cpu",),
    telemetry_interval_s: float = 5.0,
) -> NodeStatus:
    return NodeStatus(
        node_id=node_id,
        state=state,
        offline_reason=offline_reason,
        instance_id=instance_id,
        agent_version="0.1.0",
        site=site,
        zone=zone,
        region=region,
        host=HostInfo(
            hostname=node_id, os="Linux", arch="x86_64", cpu_logical_cores=4, memory_total_bytes=1
        ),
        accelerators=tuple(accelerator(kind, index) for index, kind in enumerate(kinds)),
        telemetry_interval_s=telemetry_interval_s,
        started_at=WALL_CLOCK_START_S,
        sent_at=WALL_CLOCK_START_S,
    )


def will(node_id: str = "n1", *, instance_id: str = "i1") -> NodeStatus:
    return status(
        node_id, instance_id=instance_id, state="offline", offline_reason="connection-lost"
    )


def telemetry(node_id: str = "n1", *, instance_id: str = "i1", seq: int = 0) -> Telemetry:
    return Telemetry(
        node_id=node_id,
        instance_id=instance_id,
        seq=seq,
        sampled_at=WALL_CLOCK_START_S + seq,
        interval_s=5.0,
        cpu_utilization_pct=10.0,
        memory_used_bytes=1,
        memory_total_bytes=2,
    )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def registry(clock: FakeClock) -> NodeRegistry:
    return NodeRegistry(monotonic=clock.monotonic, wall_clock=clock.wall)


@pytest.fixture
def liveness(registry: NodeRegistry) -> Liveness:
    return Liveness(registry, LivenessSettings(staleness_intervals=3.0))


def state_of(registry: NodeRegistry, node_id: str = "n1") -> tuple[str, str | None]:
    record = registry.get(node_id)
    assert record is not None, f"{node_id} is not registered"
    return record.state, record.offline_reason


def test_a_birth_registers_an_online_node_seen_now(
    registry: NodeRegistry, clock: FakeClock
) -> None:
    clock.advance(12.0)
    change = registry.apply_status(status("n1"))

    assert change == NodeStateChange("n1", "online", None)
    assert len(registry) == 1
    record = registry.get("n1")
    assert record is not None
    assert (record.state, record.offline_reason) == ("online", None)
    assert record.last_seen_at == WALL_CLOCK_START_S + 12.0
    assert record.status.instance_id == "i1"


def test_an_unknown_node_is_absent(registry: NodeRegistry) -> None:
    assert registry.get("ghost") is None
    assert len(registry) == 0


def test_a_will_marks_the_node_offline_with_connection_lost(registry: NodeRegistry) -> None:
    registry.apply_status(status("n1"))

    change = registry.apply_status(will("n1"))

    assert change == NodeStateChange("n1", "offline", "connection-lost")
    assert state_of(registry) == ("offline", "connection-lost")


def test_a_goodbye_marks_the_node_offline_with_shutdown(registry: NodeRegistry) -> None:
    registry.apply_status(status("n1"))
    change = registry.apply_status(
        status("n1", state="offline", offline_reason="shutdown"),
    )
    assert change == NodeStateChange("n1", "offline", "shutdown")


def test_a_retained_will_seen_first_registers_an_offline_node(registry: NodeRegistry) -> None:
    assert registry.apply_status(will("n1")) == NodeStateChange("n1", "offline", "connection-lost")
    assert state_of(registry) == ("offline", "connection-lost")


def test_the_will_of_an_older_instance_after_its_successors_birth_is_ignored(
    registry: NodeRegistry,
) -> None:
    registry.apply_status(status("n1", instance_id="old"))
    registry.apply_status(status("n1", instance_id="new"))
    version = registry.version

    change = registry.apply_status(will("n1", instance_id="old"))

    assert change is None
    assert state_of(registry) == ("online", None)
    record = registry.get("n1")
    assert record is not None
    assert record.status.instance_id == "new"
    assert registry.version == version


def test_a_repeated_birth_changes_no_state(registry: NodeRegistry) -> None:
    registry.apply_status(status("n1"))
    assert registry.apply_status(status("n1")) is None
    assert state_of(registry) == ("online", None)


def test_a_birth_after_a_will_brings_the_node_back_online(registry: NodeRegistry) -> None:
    registry.apply_status(status("n1", instance_id="i1"))
    registry.apply_status(will("n1", instance_id="i1"))

    change = registry.apply_status(status("n1", instance_id="i2"))

    assert change == NodeStateChange("n1", "online", None)


def test_telemetry_is_stored_on_the_node(registry: NodeRegistry, clock: FakeClock) -> None:
    registry.apply_status(status("n1"))
    clock.advance(4.0)

    assert registry.apply_telemetry(telemetry("n1", seq=1)) is None

    record = registry.get("n1")
    assert record is not None
    assert record.telemetry == telemetry("n1", seq=1)
    assert record.last_seen_at == WALL_CLOCK_START_S + 4.0


def test_telemetry_for_an_unknown_node_is_rejected(registry: NodeRegistry) -> None:
    assert registry.apply_telemetry(telemetry("ghost")) is Rejection.UNKNOWN_NODE
    assert len(registry) == 0


def test_telemetry_from_another_agent_instance_is_rejected(registry: NodeRegistry) -> None:
    registry.apply_status(status("n1", instance_id="current"))

    outcome = registry.apply_telemetry(telemetry("n1", instance_id="previous", seq=99))

    assert outcome is Rejection.INSTANCE_MISMATCH
    record = registry.get("n1")
    assert record is not None
    assert record.telemetry is None


@pytest.mark.parametrize("late_seq", [7, 6, 0])
def test_telemetry_whose_sequence_does_not_increase_is_rejected(
    registry: NodeRegistry, late_seq: int
) -> None:
    registry.apply_status(status("n1"))
    registry.apply_telemetry(telemetry("n1", seq=7))

    assert registry.apply_telemetry(telemetry("n1", seq=late_seq)) is Rejection.OUT_OF_ORDER
    record = registry.get("n1")
    assert record is not None
    assert record.telemetry is not None
    assert record.telemetry.seq == 7


def test_gaps_in_the_sequence_are_accepted_because_qos_0_may_lose_samples(
    registry: NodeRegistry,
) -> None:
    registry.apply_status(status("n1"))
    registry.apply_telemetry(telemetry("n1", seq=1))
    assert registry.apply_telemetry(telemetry("n1", seq=5)) is None


def test_a_new_birth_resets_the_telemetry_sequence(
    registry: NodeRegistry, clock: FakeClock
) -> None:
    registry.apply_status(status("n1", instance_id="i1"))
    clock.advance(2500.0)  # 500 samples of 5 s
    assert registry.apply_telemetry(telemetry("n1", instance_id="i1", seq=500)) is None

    # A restart: the broker publishes the old agent's will before its successor's birth.
    registry.apply_status(will("n1", instance_id="i1"))
    registry.apply_status(status("n1", instance_id="i2"))

    assert registry.apply_telemetry(telemetry("n1", instance_id="i2", seq=0)) is None


def test_a_rebirth_of_the_same_instance_after_a_reconnect_keeps_the_sequence(
    registry: NodeRegistry,
) -> None:
    registry.apply_status(status("n1", instance_id="i1"))
    registry.apply_telemetry(telemetry("n1", seq=10))
    registry.apply_status(status("n1", instance_id="i1"))

    assert registry.apply_telemetry(telemetry("n1", seq=9)) is Rejection.OUT_OF_ORDER
    assert registry.apply_telemetry(telemetry("n1", seq=11)) is None


def test_a_sequence_number_far_ahead_of_elapsed_time_is_refused_and_the_node_stays_online(
    registry: NodeRegistry, liveness: Liveness, clock: FakeClock
) -> None:
    registry.apply_status(status("n1", telemetry_interval_s=5.0))
    clock.advance(5.0)
    registry.apply_telemetry(telemetry("n1", seq=1))

    assert registry.apply_telemetry(telemetry("n1", seq=2**62)) is Rejection.SEQ_JUMP
    # Within what elapsed time allows (twice the rate, plus 100): still believed.
    assert registry.apply_telemetry(telemetry("n1", seq=101)) is None
    assert registry.apply_telemetry(telemetry("n1", seq=300)) is Rejection.SEQ_JUMP
    for seq in range(102, 110):  # the real node's samples follow
        clock.advance(5.0)
        assert registry.apply_telemetry(telemetry("n1", seq=seq)) is None
        assert liveness.expire_stale() == []
    assert state_of(registry) == ("online", None)


def test_a_burst_of_forged_jumps_cannot_ratchet_past_the_agents_age(
    registry: NodeRegistry, clock: FakeClock
) -> None:
    # Started 1000 s ago at 5 s: at most 2 * (1000 + 300 s of clock skew) / 5 + 100 = 620.
    registry.apply_status(status("n1", telemetry_interval_s=5.0))
    clock.advance(1000.0)
    registry.apply_telemetry(telemetry("n1", seq=200))
    accepted = [
        seq
        for seq in range(300, 2000, 100)
        if registry.apply_telemetry(telemetry("n1", seq=seq)) is None
    ]
    assert accepted == [300, 400, 500, 600]


def test_the_first_sample_of_an_agent_that_started_long_ago_is_believed(
    registry: NodeRegistry, clock: FakeClock
) -> None:
    registry.apply_status(status("n1", telemetry_interval_s=5.0))
    clock.advance(365 * 86400.0)  # a control plane restarted after a year

    assert registry.apply_telemetry(telemetry("n1", seq=6_000_000)) is None


def test_a_birth_beyond_max_nodes_is_refused(clock: FakeClock) -> None:
    registry = NodeRegistry(monotonic=clock.monotonic, wall_clock=clock.wall, max_nodes=2)
    registry.apply_status(status("n1"))
    registry.apply_status(status("n2"))

    assert registry.apply_status(status("n3")) is Rejection.REGISTRY_FULL
    assert registry.get("n3") is None
    # Known nodes keep updating: a will, a new instance.
    assert registry.apply_status(will("n1")) == NodeStateChange("n1", "offline", "connection-lost")
    assert registry.apply_status(status("n2", instance_id="i2")) is None
    registry.forget("n1")
    assert registry.apply_status(status("n3")) == NodeStateChange("n3", "online", None)


def test_a_report_from_another_agent_instance_is_refused(registry: NodeRegistry) -> None:
    registry.apply_status(status("n1", instance_id="current"))
    stale = ReportedState(
        node_id="n1", instance_id="previous", observed_generation=4, reported_at=1.0
    )

    assert registry.apply_reported(stale) is Rejection.INSTANCE_MISMATCH
    assert registry.get("n1").reported is None  # type: ignore[union-attr]


def test_a_node_goes_stale_after_its_staleness_window_and_not_before(
    registry: NodeRegistry, liveness: Liveness, clock: FakeClock
) -> None:
    # 3 intervals of 5 s: offline once more than 15 s pass without telemetry.
    registry.apply_status(status("n1", telemetry_interval_s=5.0))

    clock.advance(14.99)
    assert liveness.expire_stale() == []
    assert state_of(registry) == ("online", None)

    clock.advance(0.02)
    assert liveness.expire_stale() == [NodeStateChange("n1", "offline", "telemetry-stale")]
    assert state_of(registry) == ("offline", "telemetry-stale")


def test_telemetry_restarts_the_staleness_window(
    registry: NodeRegistry, liveness: Liveness, clock: FakeClock
) -> None:
    registry.apply_status(status("n1", telemetry_interval_s=5.0))
    for seq in range(1, 6):
        clock.advance(10.0)
        registry.apply_telemetry(telemetry("n1", seq=seq))
        assert liveness.expire_stale() == []
    assert state_of(registry) == ("online", None)


def test_each_node_goes_stale_on_its_own_telemetry_interval(
    registry: NodeRegistry, liveness: Liveness, clock: FakeClock
) -> None:
    registry.apply_status(status("fast", telemetry_interval_s=1.0))
    registry.apply_status(status("slow", telemetry_interval_s=10.0))

    clock.advance(5.0)

    assert liveness.expire_stale() == [NodeStateChange("fast", "offline", "telemetry-stale")]
    assert state_of(registry, "slow") == ("online", None)


def test_the_staleness_multiple_is_configurable(registry: NodeRegistry, clock: FakeClock) -> None:
    liveness = Liveness(registry, LivenessSettings(staleness_intervals=1.5))
    registry.apply_status(status("n1", telemetry_interval_s=2.0))
    clock.advance(2.9)
    assert liveness.expire_stale() == []
    clock.advance(0.2)
    assert len(liveness.expire_stale()) == 1


def test_replicas_sharing_telemetry_wait_for_a_digest_before_a_fast_node_is_stale(
    registry: NodeRegistry, clock: FakeClock
) -> None:
    """Another replica's share of a node's samples arrives once per digest (1 s): a node
    sampling every 0.1 s is stale after 3 digest intervals, not 3 of its own."""
    settings = Settings(mqtt=MqttSettings(shared_group="cloud", digest_interval_s=1.0))
    liveness = Liveness(registry, LivenessSettings.of(settings))
    registry.apply_status(status("fast", telemetry_interval_s=0.1))
    clock.advance(2.9)
    assert liveness.expire_stale() == []
    clock.advance(0.2)
    assert liveness.expire_stale() == [NodeStateChange("fast", "offline", "telemetry-stale")]
    assert LivenessSettings.of(Settings()).min_staleness_s == 0.0  # without: its own


def test_a_stale_node_is_reported_offline_only_once(
    registry: NodeRegistry, liveness: Liveness, clock: FakeClock
) -> None:
    registry.apply_status(status("n1"))
    clock.advance(60.0)
    assert len(liveness.expire_stale()) == 1
    clock.advance(60.0)
    assert liveness.expire_stale() == []


def test_nodes_offline_by_will_are_not_expired_again(
    registry: NodeRegistry, liveness: Liveness, clock: FakeClock
) -> None:
    registry.apply_status(status("n1"))
    registry.apply_status(will("n1"))
    clock.advance(3600.0)
    assert liveness.expire_stale() == []
    assert state_of(registry) == ("offline", "connection-lost")


def test_fresh_telemetry_from_the_same_instance_brings_a_stale_node_back_online(
    registry: NodeRegistry, liveness: Liveness, clock: FakeClock
) -> None:
    registry.apply_status(status("n1"))
    registry.apply_telemetry(telemetry("n1", seq=1))
    clock.advance(60.0)
    liveness.expire_stale()

    change = registry.apply_telemetry(telemetry("n1", seq=2))

    assert change == NodeStateChange("n1", "online", None)
    assert state_of(registry) == ("online", None)
    clock.advance(10.0)
    assert liveness.expire_stale() == []


def test_telemetry_from_another_instance_does_not_revive_a_stale_node(
    registry: NodeRegistry, liveness: Liveness, clock: FakeClock
) -> None:
    registry.apply_status(status("n1", instance_id="i1"))
    clock.advance(60.0)
    liveness.expire_stale()

    assert registry.apply_telemetry(telemetry("n1", instance_id="i0", seq=1)) is (
        Rejection.INSTANCE_MISMATCH
    )
    assert state_of(registry) == ("offline", "telemetry-stale")


def test_a_sample_from_the_current_instance_after_its_will_brings_the_node_back_online(
    registry: NodeRegistry,
) -> None:
    # Only a running agent sends samples: the will was a copy (anyone who can write the
    # node's status can publish one), or the agent is back before its birth arrived.
    registry.apply_status(status("n1"))
    registry.apply_status(will("n1"))

    assert registry.apply_telemetry(telemetry("n1", seq=3)) == NodeStateChange("n1", "online", None)
    assert state_of(registry) == ("online", None)


def test_forget_removes_a_node(registry: NodeRegistry) -> None:
    registry.apply_status(status("n1"))
    registry.apply_status(status("n2"))

    assert registry.forget("n1") is True

    assert registry.get("n1") is None
    assert [record.node_id for record in registry.nodes()] == ["n2"]
    assert registry.forget("n1") is False


def test_reported_state_is_kept_for_known_nodes_only(registry: NodeRegistry) -> None:
    reported = ReportedState(
        node_id="n1", instance_id="i1", observed_generation=4, reported_at=WALL_CLOCK_START_S
    )
    assert registry.apply_reported(reported) is Rejection.UNKNOWN_NODE

    registry.apply_status(status("n1"))
    assert registry.apply_reported(reported) is None
    record = registry.get("n1")
    assert record is not None
    assert record.reported == reported


@pytest.fixture
def fleet(registry: NodeRegistry, liveness: Liveness, clock: FakeClock) -> NodeRegistry:
    registry.apply_status(
        status("gpu-toronto", site="cloud", zone="CA-ON", region="na-ne2", kinds=("cpu", "gpu"))
    )
    registry.apply_status(
        status("npu-frankfurt", site="edge", zone="DE", region="eu-w3", kinds=("cpu", "npu"))
    )
    registry.apply_status(status("rpi-frankfurt", site="edge", zone="DE", region="eu-w3"))
    registry.apply_status(
        status(
            "gpu-joburg",
            site="edge",
            zone="ZA",
            region="af-s1",
            kinds=("cpu", "gpu", "gpu"),
            telemetry_interval_s=1.0,
        )
    )
    clock.advance(4.0)
    liveness.expire_stale()  # gpu-joburg (1 s interval) goes stale
    return registry


@pytest.mark.parametrize(
    ("node_filter", "expected"),
    [
        (None, ["gpu-joburg", "gpu-toronto", "npu-frankfurt", "rpi-frankfurt"]),
        (NodeFilter(), ["gpu-joburg", "gpu-toronto", "npu-frankfurt", "rpi-frankfurt"]),
        (NodeFilter(site="cloud"), ["gpu-toronto"]),
        (NodeFilter(site="edge"), ["gpu-joburg", "npu-frankfurt", "rpi-frankfurt"]),
        (NodeFilter(zone="DE"), ["npu-frankfurt", "rpi-frankfurt"]),
        (NodeFilter(region="af-s1"), ["gpu-joburg"]),
        (NodeFilter(kind="gpu"), ["gpu-joburg", "gpu-toronto"]),
        (NodeFilter(kind="npu"), ["npu-frankfurt"]),
        (
            NodeFilter(kind="cpu"),
            ["gpu-joburg", "gpu-toronto", "npu-frankfurt", "rpi-frankfurt"],
        ),
        (NodeFilter(state="offline"), ["gpu-joburg"]),
        (NodeFilter(state="online"), ["gpu-toronto", "npu-frankfurt", "rpi-frankfurt"]),
        (NodeFilter(site="edge", kind="gpu"), ["gpu-joburg"]),
        (NodeFilter(kind="gpu", state="online"), ["gpu-toronto"]),
        (NodeFilter(zone="DE", kind="npu", state="online"), ["npu-frankfurt"]),
        (NodeFilter(zone="DE", site="cloud"), []),
        (NodeFilter(zone="XX"), []),
    ],
)
def test_nodes_can_be_filtered_by_site_zone_region_kind_and_state(
    fleet: NodeRegistry, node_filter: NodeFilter | None, expected: list[str]
) -> None:
    assert [record.node_id for record in fleet.nodes(node_filter)] == expected


def test_counts_aggregate_nodes_by_state_and_site_and_by_accelerator_kind(
    fleet: NodeRegistry,
) -> None:
    counts = fleet.counts()

    assert counts.nodes_by_state_site == {
        ("online", "cloud"): 1,
        ("online", "edge"): 2,
        ("offline", "edge"): 1,
    }
    # A node with two GPUs counts once among nodes with GPUs, twice among GPUs.
    assert counts.nodes_by_kind_state == {
        ("cpu", "online"): 3,
        ("cpu", "offline"): 1,
        ("gpu", "online"): 1,
        ("gpu", "offline"): 1,
        ("npu", "online"): 1,
    }
    assert counts.accelerators_by_kind_state == {
        ("cpu", "online"): 3,
        ("cpu", "offline"): 1,
        ("gpu", "online"): 1,
        ("gpu", "offline"): 2,
        ("npu", "online"): 1,
    }


def test_counts_of_an_empty_registry_are_empty(registry: NodeRegistry) -> None:
    counts = registry.counts()
    assert counts.nodes_by_state_site == {}
    assert counts.nodes_by_kind_state == {}
    assert counts.accelerators_by_kind_state == {}


def test_the_version_moves_on_every_membership_or_state_change(
    registry: NodeRegistry, liveness: Liveness, clock: FakeClock
) -> None:
    versions = [registry.version]

    def changed() -> None:
        assert registry.version > versions[-1]
        versions.append(registry.version)

    registry.apply_status(status("n1"))  # joins
    changed()
    registry.apply_status(will("n1"))  # connection lost
    changed()
    registry.apply_status(status("n1", instance_id="i2"))  # back
    changed()
    clock.advance(60.0)
    liveness.expire_stale()  # stale
    changed()
    registry.apply_telemetry(telemetry("n1", instance_id="i2", seq=1))  # revived
    changed()
    registry.forget("n1")  # leaves
    changed()


def test_the_version_stays_put_when_nothing_changes(
    registry: NodeRegistry, liveness: Liveness, clock: FakeClock
) -> None:
    registry.apply_status(status("n1", instance_id="new"))
    registry.apply_telemetry(telemetry("n1", instance_id="new", seq=1))
    version = registry.version

    registry.apply_telemetry(telemetry("n1", instance_id="new", seq=1))  # out of order
    registry.apply_telemetry(telemetry("n1", instance_id="old", seq=2))  # wrong instance
    registry.apply_telemetry(telemetry("ghost", seq=2))  # unknown
    registry.apply_status(will("n1", instance_id="old"))  # stale will
    registry.forget("ghost")
    clock.advance(1.0)
    liveness.expire_stale()  # nothing is stale yet

    assert registry.version == version


# ---- liveness: settings, the grace before work is lost, the timer -------------------


def test_liveness_settings_gather_the_cloud_and_scheduling_keys() -> None:
    settings = Settings(
        cloud=CloudSettings(staleness_intervals=2.5, liveness_check_interval_s=0.5),
        scheduling=SchedulingSettings(node_lost_grace_s=12.0),
    )
    assert LivenessSettings.of(settings) == LivenessSettings(
        staleness_intervals=2.5, liveness_check_interval_s=0.5, node_lost_grace_s=12.0
    )
    assert LivenessSettings.of(Settings()) == LivenessSettings()


@pytest.mark.parametrize(
    "fields",
    [{"staleness_intervals": 0.5}, {"liveness_check_interval_s": 0.0}, {"node_lost_grace_s": -1}],
)
def test_liveness_settings_refuse_values_the_settings_file_refuses(
    fields: dict[str, float],
) -> None:
    with pytest.raises(ValueError, match=next(iter(fields))):
        LivenessSettings(**fields)


def test_marking_offline_leaves_nodes_that_are_not_online_alone(registry: NodeRegistry) -> None:
    registry.apply_status(status("n1"))
    registry.apply_status(status("n2"))
    registry.apply_status(will("n2"))
    version = registry.version

    changes = registry.mark_offline(["n1", "n2", "ghost"], "telemetry-stale")

    assert changes == [NodeStateChange("n1", "offline", "telemetry-stale")]
    assert state_of(registry, "n2") == ("offline", "connection-lost")
    assert registry.version == version + 1
    assert registry.mark_offline(["n1"], "telemetry-stale") == []
    assert registry.version == version + 1


def graced(registry: NodeRegistry, grace_s: float = 30.0) -> Liveness:
    return Liveness(registry, LivenessSettings(node_lost_grace_s=grace_s))


def by_id(registry: NodeRegistry) -> dict[str, NodeRecord]:
    return {record.node_id: record for record in registry.nodes()}


def test_an_offline_node_is_lost_after_the_grace_period_and_not_before(
    registry: NodeRegistry, clock: FakeClock
) -> None:
    liveness = graced(registry)
    registry.apply_status(status("n1"))
    registry.apply_status(status("n2"))
    registry.apply_status(will("n1"))

    assert liveness.lost_nodes(["n1", "n2"], by_id(registry)) == {}  # the clock starts
    clock.advance(29.9)
    assert liveness.lost_nodes(["n1", "n2"], by_id(registry)) == {}
    clock.advance(0.1)
    assert liveness.lost_nodes(["n1", "n2"], by_id(registry)) == {"n1": "offline: connection-lost"}


def test_an_unknown_node_holding_work_is_lost_after_the_grace_period(
    registry: NodeRegistry, clock: FakeClock
) -> None:
    liveness = graced(registry, grace_s=5.0)
    assert liveness.lost_nodes(["ghost"], {}) == {}
    clock.advance(5.0)
    assert liveness.lost_nodes(["ghost"], {}) == {"ghost": "not seen by this control plane"}


def test_a_node_back_online_within_the_grace_period_starts_it_afresh(
    registry: NodeRegistry, clock: FakeClock
) -> None:
    liveness = graced(registry, grace_s=10.0)
    registry.apply_status(status("n1"))
    registry.apply_status(will("n1"))
    liveness.lost_nodes(["n1"], by_id(registry))
    clock.advance(8.0)
    registry.apply_status(status("n1", instance_id="i2"))  # back
    assert liveness.lost_nodes(["n1"], by_id(registry)) == {}
    registry.apply_status(will("n1", instance_id="i2"))  # gone again
    liveness.lost_nodes(["n1"], by_id(registry))
    clock.advance(8.0)
    assert liveness.lost_nodes(["n1"], by_id(registry)) == {}
    clock.advance(2.0)
    assert liveness.lost_nodes(["n1"], by_id(registry)) == {"n1": "offline: connection-lost"}


def test_grace_clocks_are_forgotten_when_a_node_holds_nothing_or_leadership_ends(
    registry: NodeRegistry, clock: FakeClock
) -> None:
    liveness = graced(registry, grace_s=10.0)
    liveness.lost_nodes(["a", "b"], {})
    clock.advance(6.0)
    liveness.lost_nodes(["b"], {})  # a holds nothing now
    liveness.reset_grace()  # and b's clock goes with leadership
    assert liveness.lost_nodes(["a", "b"], {}) == {}
    clock.advance(6.0)
    assert liveness.lost_nodes(["a", "b"], {}) == {}
    clock.advance(4.0)
    assert liveness.lost_nodes(["a", "b"], {}) == {
        "a": "not seen by this control plane",
        "b": "not seen by this control plane",
    }


async def test_the_timer_expires_stale_nodes_and_reports_the_change(
    registry: NodeRegistry, clock: FakeClock
) -> None:
    liveness = Liveness(registry, LivenessSettings(liveness_check_interval_s=0.01))
    registry.apply_status(status("n1", telemetry_interval_s=1.0))
    registry.apply_status(status("n2", telemetry_interval_s=60.0))
    changed = asyncio.Event()
    timer = asyncio.create_task(liveness.run(changed.set))
    try:
        await asyncio.sleep(0.05)
        assert not changed.is_set()  # nothing stale: no trigger
        clock.advance(3.5)
        async with asyncio.timeout(5):
            await changed.wait()
    finally:
        await stop_task(timer)
    assert state_of(registry, "n1") == ("offline", "telemetry-stale")
    assert state_of(registry, "n2") == ("online", None)


class Link:
    """Whether the control plane hears the broker, as a test sets it."""

    def __init__(self) -> None:
        self.up = True

    def __call__(self) -> bool:
        return self.up


def test_no_node_is_judged_while_the_control_plane_is_off_the_broker(
    registry: NodeRegistry, clock: FakeClock
) -> None:
    link = Link()
    liveness = Liveness(
        registry, LivenessSettings(staleness_intervals=3.0, node_lost_grace_s=30.0), link_up=link
    )
    registry.apply_status(status("n1"))  # telemetry every 5 s: stale after 15 s
    registry.apply_status(status("n2"))
    registry.apply_status(will("n2"))  # offline before the outage
    assert liveness.lost_nodes(["n2"], by_id(registry)) == {}  # its grace clock starts
    link.up = False
    clock.advance(120.0)  # far past staleness and grace
    assert liveness.expire_stale() == []
    assert liveness.lost_nodes(["n1", "n2"], by_id(registry)) == {}
    assert state_of(registry, "n1") == ("online", None)
    link.up = True
    # Back: each node's silence counts from now, not from before the outage.
    assert liveness.expire_stale() == []
    assert liveness.lost_nodes(["n1", "n2"], by_id(registry)) == {}
    clock.advance(14.0)
    assert liveness.expire_stale() == []
    clock.advance(1.5)
    assert liveness.expire_stale() == [NodeStateChange("n1", "offline", "telemetry-stale")]
    clock.advance(14.5)  # 30 s since the link came back
    assert liveness.lost_nodes(["n1", "n2"], by_id(registry)) == {"n2": "offline: connection-lost"}


def test_a_node_that_speaks_after_the_outage_stays_online(
    registry: NodeRegistry, clock: FakeClock
) -> None:
    link = Link()
    liveness = Liveness(registry, LivenessSettings(staleness_intervals=3.0), link_up=link)
    registry.apply_status(status("n1"))
    link.up = False
    clock.advance(60.0)
    assert liveness.expire_stale() == []
    link.up = True
    assert liveness.expire_stale() == []
    clock.advance(10.0)
    registry.apply_telemetry(telemetry("n1", seq=1))
    clock.advance(10.0)
    assert liveness.expire_stale() == []
    assert state_of(registry, "n1") == ("online", None)


class ProvenLink:
    """The control plane's link as its probes prove it (cloud/fleet/link_probe.py), as a
    test sets it: whether one came back lately, and when the newest that did was sent."""

    def __init__(self, clock: FakeClock) -> None:
        self.up = True
        self.proven_until_s = clock.monotonic()

    def is_up(self) -> bool:
        return self.up

    def proven(self) -> float:
        return self.proven_until_s


def test_silence_after_the_link_was_last_proven_is_no_node_s(
    registry: NodeRegistry, clock: FakeClock
) -> None:
    """A link that stalls without closing still counts as up until its probes are
    missed, but nothing anyone sent after the newest probe that came back has reached
    the control plane: that time is in no node's silence, and no grace clock runs
    through it, however short the node's telemetry interval."""
    link = ProvenLink(clock)
    liveness = Liveness(
        registry,
        LivenessSettings(staleness_intervals=3.0, node_lost_grace_s=1.0),
        link_up=link.is_up,
        proven_until_s=link.proven,
    )
    registry.apply_status(status("n1", telemetry_interval_s=0.1))  # stale after 0.3 s
    registry.apply_status(status("n2"))
    registry.apply_status(will("n2"))  # offline before the stall
    assert liveness.lost_nodes(["n1", "n2"], by_id(registry)) == {}  # n2's grace clock starts
    clock.advance(0.2)
    link.proven_until_s = clock.monotonic()  # the last probe that comes back, sent now
    clock.advance(2.8)  # the link stalled: far past n1's deadline and n2's grace
    assert liveness.expire_stale() == []
    assert liveness.lost_nodes(["n1", "n2"], by_id(registry)) == {}
    assert state_of(registry, "n1") == ("online", None)
    # The link carries again, with what waited in it: nothing from n1.
    clock.advance(0.5)
    link.proven_until_s = clock.monotonic() - 0.1
    assert liveness.expire_stale() == [NodeStateChange("n1", "offline", "telemetry-stale")]
    assert liveness.lost_nodes(["n1", "n2"], by_id(registry)) == {"n2": "offline: connection-lost"}


def test_a_grace_period_is_never_shorter_than_the_time_that_passed(
    registry: NodeRegistry, clock: FakeClock
) -> None:
    """The link is proven up to a probe interval late: a node's grace clock starts when a
    pass sees it unavailable, not at the proof before."""
    link = ProvenLink(clock)
    liveness = Liveness(
        registry,
        LivenessSettings(node_lost_grace_s=5.0),
        link_up=link.is_up,
        proven_until_s=link.proven,
    )
    registry.apply_status(status("n1"))
    clock.advance(10.0)
    link.proven_until_s = clock.monotonic() - 0.9
    registry.apply_status(will("n1"))
    assert liveness.lost_nodes(["n1"], by_id(registry)) == {}  # its clock starts now
    clock.advance(4.95)
    link.proven_until_s = clock.monotonic()
    assert liveness.lost_nodes(["n1"], by_id(registry)) == {}
    clock.advance(0.05)
    link.proven_until_s = clock.monotonic()
    assert liveness.lost_nodes(["n1"], by_id(registry)) == {"n1": "offline: connection-lost"}


def cause_of(registry: NodeRegistry, node_id: str = "n1") -> str | None:
    record = registry.get(node_id)
    assert record is not None
    return record.offline_cause


def test_a_will_while_the_node_was_talking_is_a_crash(
    registry: NodeRegistry, clock: FakeClock
) -> None:
    registry.apply_status(status("n1"))
    registry.apply_telemetry(telemetry("n1", seq=1))
    clock.advance(2.0)  # within two of its 5 s intervals: the connection was closed
    registry.apply_status(will("n1"))
    assert cause_of(registry) == "crashed"


def test_a_will_after_the_keepalive_ran_out_is_a_partition(
    registry: NodeRegistry, clock: FakeClock
) -> None:
    registry.apply_status(status("n1"))
    clock.advance(45.0)  # the broker waited out 1.5 x a 30 s keep-alive
    registry.apply_status(will("n1"))
    assert cause_of(registry) == "partitioned"


def test_stale_telemetry_is_a_partition_and_a_goodbye_a_stop(
    registry: NodeRegistry, liveness: Liveness, clock: FakeClock
) -> None:
    registry.apply_status(status("n1"))
    registry.apply_status(status("n2"))
    clock.advance(16.0)
    liveness.expire_stale()
    assert cause_of(registry, "n1") == "partitioned"
    registry.apply_status(status("n3"))
    registry.apply_status(status("n3", state="offline", offline_reason="shutdown"))
    assert cause_of(registry, "n3") == "stopped"


def test_the_outage_is_settled_when_the_node_is_back(
    registry: NodeRegistry, clock: FakeClock
) -> None:
    registry.apply_status(status("n1", instance_id="i1"))
    clock.advance(45.0)
    registry.apply_status(will("n1", instance_id="i1"))
    clock.advance(30.0)
    # The same agent instance reconnects: it was cut off and kept running.
    registry.apply_status(status("n1", instance_id="i1"))
    record = registry.get("n1")
    assert record is not None
    assert record.offline_cause is None
    assert record.last_outage is not None
    assert (record.last_outage.cause, record.last_outage.ended_by) == ("partitioned", "partition")
    assert record.last_outage.offline_s == pytest.approx(30.0)
    # A crash, and a new agent instance comes back: it restarted.
    registry.apply_telemetry(telemetry("n1", instance_id="i1", seq=1))
    registry.apply_status(will("n1", instance_id="i1"))
    clock.advance(5.0)
    registry.apply_status(status("n1", instance_id="i2"))
    assert record.last_outage is not None
    assert (record.last_outage.cause, record.last_outage.ended_by) == ("crashed", "restart")


def test_time_the_control_plane_was_stalled_is_no_node_s_silence(
    registry: NodeRegistry, clock: FakeClock, liveness: Liveness
) -> None:
    registry.apply_status(status("n1"))  # telemetry every 5 s: stale after 15 s of silence
    registry.apply_status(status("n2"))
    clock.advance(10.0)
    liveness.note_stall(6.0)  # nothing was read from 4 s to 10 s
    clock.advance(5.5)  # 15.5 s since n1 was heard, 9.5 s of it heard-able
    assert liveness.expire_stale() == []
    registry.apply_telemetry(telemetry("n2"))  # n2 speaks after the stall
    clock.advance(5.6)  # n1: 21.1 s, 15.1 s of it heard-able
    assert liveness.expire_stale() == [NodeStateChange("n1", "offline", "telemetry-stale")]
    clock.advance(10.0)  # n2: 15.6 s of silence, all of it after the stall
    assert liveness.expire_stale() == [NodeStateChange("n2", "offline", "telemetry-stale")]


async def test_a_late_liveness_timer_notes_the_stall_and_goes_on_judging(
    registry: NodeRegistry, clock: FakeClock
) -> None:
    liveness = Liveness(registry, LivenessSettings(liveness_check_interval_s=0.01))
    registry.apply_status(status("n1", telemetry_interval_s=1.0))
    changed = asyncio.Event()
    timer = asyncio.create_task(liveness.run(changed.set))
    try:
        await asyncio.sleep(0.05)  # the timer is running
        # A busy machine may stall the loop on its own too: this stall is counted on top.
        stalls_before = liveness.stalls_total
        # The event loop stalls (the point of the test): the timer wakes late.
        time.sleep(STALL_S + 0.1)  # noqa: ASYNC251
        await eventually(lambda: liveness.stalls_total > stalls_before)
        assert not changed.is_set()
        clock.advance(20.0)  # silent far longer than the stall, after it
        async with asyncio.timeout(5):
            await changed.wait()
    finally:
        await stop_task(timer)
    assert state_of(registry, "n1") == ("offline", "telemetry-stale")


@pytest.mark.parametrize("seed", range(4))
def test_the_stale_nodes_found_round_by_round_are_those_a_look_at_every_node_finds(
    clock: FakeClock, seed: int
) -> None:
    """`expire_stale` judges only the nodes due by a heap it keeps between registry
    changes: over births, samples, wills, departures, loop stalls and a link that drops
    and returns, each round marks exactly the online nodes that `is_stale` says are
    (what judging every node each round found)."""
    rng = random.Random(seed)
    link = {"up": True}
    registry = NodeRegistry(monotonic=clock.monotonic, wall_clock=clock.wall)
    liveness = Liveness(
        registry, LivenessSettings(staleness_intervals=3.0), link_up=lambda: link["up"]
    )
    seqs: dict[str, int] = {}
    instances: dict[str, int] = {}
    found = 0
    for _ in range(600):
        roll = rng.random()
        node_id = f"n{rng.randrange(40):02d}"
        if roll < 0.1:
            instances[node_id] = instances.get(node_id, 0) + (rng.random() < 0.3)
            seqs[node_id] = 0
            interval_s = rng.choice([0.5, 1.0, 2.0, 5.0])
            registry.apply_status(
                status(
                    node_id,
                    instance_id=f"i{instances[node_id]}",
                    telemetry_interval_s=interval_s,
                )
            )
        elif roll < 0.55 and node_id in seqs:
            seqs[node_id] += 1
            registry.apply_telemetry(
                telemetry(node_id, instance_id=f"i{instances[node_id]}", seq=seqs[node_id])
            )
        elif roll < 0.6 and node_id in seqs:
            registry.apply_status(will(node_id, instance_id=f"i{instances[node_id]}"))
        elif roll < 0.62:
            registry.forget(node_id)
            seqs.pop(node_id, None)
        elif roll < 0.66:
            clock.advance(rng.uniform(1.0, 4.0))
            liveness.note_stall(rng.uniform(1.0, 4.0))
        elif roll < 0.68:
            link["up"] = not link["up"]
        clock.advance(rng.choice([0.0, 0.1, 0.5, 1.0, 1.0, 2.5]))
        now_s = clock.monotonic()
        listening = liveness.listening(now_s)
        expected = sorted(
            record.node_id
            for record in registry
            if listening and record.state == "online" and liveness.is_stale(record, now_s)
        )
        changes = liveness.expire_stale()
        assert [change.node_id for change in changes] == expected
        assert {change.reason for change in changes} <= {"telemetry-stale"}
        found += len(changes)
    assert found > 20  # the rounds did find stale nodes
