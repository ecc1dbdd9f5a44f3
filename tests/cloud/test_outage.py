"""An offline node's cause when the broker, not the node, ended its connection
(cloud/fleet/outage.py `BrokerOutageJudge`, issue 25): a broker that shuts down cleanly
publishes every client's will and then closes every connection, the control plane's
too, so a fleet's wills arriving with the control plane's own loss of the broker are
no crash of any node. Driven by a fake clock; tests/faults/test_broker_shutdown.py
stops real brokers."""

from __future__ import annotations

import pytest

from cloud.fleet.outage import BROKER_SHUTDOWN_WINDOW_S, BrokerOutageJudge
from cloud.fleet.registry import NodeRegistry, NodeStateChange
from shared.messages import NodeStatus
from tests.cloud.test_registry import FakeClock, cause_of, status, telemetry, will


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def registry(clock: FakeClock) -> NodeRegistry:
    return NodeRegistry(monotonic=clock.monotonic, wall_clock=clock.wall)


@pytest.fixture
def judge(registry: NodeRegistry) -> BrokerOutageJudge:
    return BrokerOutageJudge(registry)


def apply(registry: NodeRegistry, judge: BrokerOutageJudge, message: NodeStatus) -> None:
    """As ingestion does: the registry applies, then the judge hears of the change."""
    change = registry.apply_status(message)
    if isinstance(change, NodeStateChange):
        judge.note_state_change(change)


def talking(registry: NodeRegistry, *node_ids: str) -> None:
    for node_id in node_ids:
        registry.apply_status(status(node_id))
        registry.apply_telemetry(telemetry(node_id, seq=1))


def test_wills_that_come_as_the_control_plane_loses_the_broker_are_the_brokers(
    registry: NodeRegistry, judge: BrokerOutageJudge, clock: FakeClock
) -> None:
    talking(registry, "n1", "n2", "n3")
    clock.advance(1.0)
    for node_id in ("n1", "n2", "n3"):
        apply(registry, judge, will(node_id))
    # Judged alone, each will looks like a crash: the node was talking.
    assert {cause_of(registry, n) for n in ("n1", "n2", "n3")} == {"crashed"}
    version = registry.version
    judge.link_lost()  # milliseconds later, as Mosquitto closes every connection
    assert {cause_of(registry, n) for n in ("n1", "n2", "n3")} == {"broker"}
    assert registry.version > version
    # Back with the same agent: the outage was the broker's, the agent kept running.
    registry.apply_status(status("n1"))
    record = registry.get("n1")
    assert record is not None
    assert record.last_outage is not None
    assert (record.last_outage.cause, record.last_outage.ended_by) == ("broker", "partition")


def test_a_crash_long_before_the_broker_went_away_stays_a_crash(
    registry: NodeRegistry, judge: BrokerOutageJudge, clock: FakeClock
) -> None:
    talking(registry, "n1", "n2")
    apply(registry, judge, will("n1"))
    clock.advance(BROKER_SHUTDOWN_WINDOW_S + 1.0)
    registry.apply_telemetry(telemetry("n2", seq=2))
    apply(registry, judge, will("n2"))
    judge.link_lost()
    assert (cause_of(registry, "n1"), cause_of(registry, "n2")) == ("crashed", "broker")


def test_a_crash_while_the_broker_stays_up_stays_a_crash(
    registry: NodeRegistry, judge: BrokerOutageJudge, clock: FakeClock
) -> None:
    talking(registry, "n1")
    apply(registry, judge, will("n1"))
    clock.advance(60.0)
    assert cause_of(registry, "n1") == "crashed"


def test_a_will_replayed_after_the_control_plane_was_cut_off_says_nothing_of_the_node(
    registry: NodeRegistry, judge: BrokerOutageJudge, clock: FakeClock
) -> None:
    talking(registry, "n1", "n2", "n3")
    clock.advance(0.5)
    judge.link_lost()  # the control plane's connection ended before the wills reached it
    clock.advance(1.0)
    registry.resubscribed()  # as ingestion does when it is back on the broker
    # Back on the broker: n1's will comes from the broker's retained state (it was
    # last heard before the loss); n2 sent a fresh birth and crashed afterwards.
    apply(registry, judge, will("n1"))
    registry.apply_status(status("n2", instance_id="i2"))
    registry.apply_telemetry(telemetry("n2", instance_id="i2", seq=1))
    clock.advance(1.0)
    apply(registry, judge, will("n2", instance_id="i2"))
    assert (cause_of(registry, "n1"), cause_of(registry, "n2")) == ("broker", "crashed")
    # After a long outage, a retained will looks like silence: no partition either.
    clock.advance(60.0)
    apply(registry, judge, will("n3"))
    assert cause_of(registry, "n3") == "broker"


def test_goodbyes_and_partitions_keep_their_cause(
    registry: NodeRegistry, judge: BrokerOutageJudge, clock: FakeClock
) -> None:
    talking(registry, "n1", "n2")
    apply(registry, judge, status("n1", state="offline", offline_reason="shutdown"))
    clock.advance(45.0)  # n2's keep-alive ran out
    apply(registry, judge, will("n2"))
    judge.link_lost()
    assert (cause_of(registry, "n1"), cause_of(registry, "n2")) == ("stopped", "partitioned")
