"""Ingestion without a broker: `Ingestor.handle` fed real encoded messages."""

from __future__ import annotations

import json
from collections import Counter

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloud.fleet.ingest import Ingestor, InvalidReason
from cloud.fleet.registry import NodeRegistry, NodeStateChange
from shared.messages import (
    Accelerator,
    AcceleratorSample,
    HostInfo,
    NodeEvent,
    NodeStatus,
    ReportedState,
    Telemetry,
    encode,
)
from shared.topics import Channel, Topics

MAX_PAYLOAD_BYTES = 4096
TOPICS = Topics("unit-test")


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def monotonic(self) -> float:
        return self.now_s

    def wall(self) -> float:
        return 1_700_000_000.0 + self.now_s


def birth(node_id: str = "n1", instance_id: str = "i1") -> NodeStatus:
    return NodeStatus(
        node_id=node_id,
        state="online",
        instance_id=instance_id,
        agent_version="0.1.0",
        site="edge",
        zone="DE",
        region="europe-west3",
        labels={"city": "frankfurt"},
        host=HostInfo(
            hostname=node_id, os="Linux", arch="x86_64", cpu_logical_cores=8, memory_total_bytes=8
        ),
        accelerators=(
            Accelerator(
                id="gpu0",
                kind="gpu",
                vendor="nvidia",
                model="T4",
                memory_bytes=16,
                compute_units=40,
            ),
        ),
        telemetry_interval_s=5.0,
        started_at=1_700_000_000.0,
        sent_at=1_700_000_000.0,
    )


def will(node_id: str = "n1", instance_id: str = "i1") -> NodeStatus:
    return msgspec.structs.replace(
        birth(node_id, instance_id), state="offline", offline_reason="connection-lost"
    )


def sample(
    node_id: str = "n1", instance_id: str = "i1", seq: int = 1, cpu_pct: float = 20.0
) -> Telemetry:
    return Telemetry(
        node_id=node_id,
        instance_id=instance_id,
        seq=seq,
        sampled_at=1_700_000_100.0,
        interval_s=5.0,
        cpu_utilization_pct=cpu_pct,
        memory_used_bytes=2,
        memory_total_bytes=8,
        accelerators=(AcceleratorSample(id="gpu0", utilization_pct=50.0, memory_used_bytes=4),),
    )


def event(node_id: str = "n1") -> NodeEvent:
    return NodeEvent(
        node_id=node_id, event_id="e-1", kind="ready", subject="resnet50", occurred_at=1.0
    )


def topic(node_id: str, channel: Channel) -> str:
    return TOPICS.node(node_id, channel)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def registry(clock: FakeClock) -> NodeRegistry:
    return NodeRegistry(monotonic=clock.monotonic, wall_clock=clock.wall)


@pytest.fixture
def ingestor(registry: NodeRegistry) -> Ingestor:
    return Ingestor(registry, TOPICS, max_payload_bytes=MAX_PAYLOAD_BYTES)


@pytest.fixture
def known_node(ingestor: Ingestor) -> Ingestor:
    """An ingestor that has seen n1's birth (instance i1) and its sample with seq 5."""
    ingestor.handle(topic("n1", Channel.STATUS), encode(birth()))
    ingestor.handle(topic("n1", Channel.TELEMETRY), encode(sample(seq=5)))
    assert ingestor.stats.invalid_total == 0
    return ingestor


def test_a_birth_then_telemetry_are_applied_and_counted(
    ingestor: Ingestor, registry: NodeRegistry
) -> None:
    ingestor.handle(topic("n1", Channel.STATUS), encode(birth()))
    ingestor.handle(topic("n1", Channel.TELEMETRY), encode(sample(seq=1)))

    record = registry.get("n1")
    assert record is not None
    assert record.state == "online"
    assert record.status == birth()
    assert record.telemetry == sample(seq=1)
    assert ingestor.stats.ingested == Counter({"status": 1, "telemetry": 1})
    assert ingestor.stats.invalid_total == 0


def test_a_bytearray_payload_is_handled_like_bytes(
    ingestor: Ingestor, registry: NodeRegistry
) -> None:
    ingestor.handle(topic("n1", Channel.STATUS), bytearray(encode(birth())))
    assert registry.get("n1") is not None


def test_reported_state_is_applied_and_counted(known_node: Ingestor) -> None:
    reported = ReportedState(node_id="n1", instance_id="i1", observed_generation=3, reported_at=1)
    known_node.handle(topic("n1", Channel.REPORTED), encode(reported))

    record = known_node.registry.get("n1")
    assert record is not None
    assert record.reported == reported
    assert known_node.stats.ingested["reported"] == 1


def test_telemetry_from_a_newer_agent_with_extra_fields_is_ingested(known_node: Ingestor) -> None:
    payload = json.loads(encode(sample(seq=6)))
    payload["schema_version"] = "1.3"
    payload["gpu_fan_pct"] = 40
    known_node.handle(topic("n1", Channel.TELEMETRY), json.dumps(payload).encode())

    assert known_node.stats.invalid_total == 0
    record = known_node.registry.get("n1")
    assert record is not None
    assert record.telemetry is not None
    assert record.telemetry.seq == 6


def _oversized() -> bytes:
    # Valid JSON that is too big: whitespace after a real sample.
    return encode(sample(seq=6)) + b" " * MAX_PAYLOAD_BYTES


def _missing_field() -> bytes:
    payload = json.loads(encode(sample(seq=6)))
    del payload["seq"]
    return json.dumps(payload).encode()


INVALID_CASES = [
    pytest.param(
        "other-root/v1/nodes/n1/telemetry",
        encode(sample(seq=6)),
        ("unknown", "bad_topic"),
        id="foreign root",
    ),
    pytest.param(
        "unit-test/v1/nodes/n1/heartbeat",
        encode(sample(seq=6)),
        ("unknown", "bad_topic"),
        id="unknown channel",
    ),
    pytest.param(
        "unit-test/v1/nodes/n+1/telemetry",
        encode(sample(seq=6)),
        ("unknown", "bad_topic"),
        id="wildcard in node id",
    ),
    pytest.param(
        topic("n1", Channel.TELEMETRY), _oversized(), ("telemetry", "oversized"), id="oversized"
    ),
    pytest.param(
        topic("n1", Channel.TELEMETRY),
        b'{"node_id": "n1", ',
        ("telemetry", "malformed_json"),
        id="truncated json",
    ),
    pytest.param(
        topic("n1", Channel.STATUS),
        b"\xff\xfe not utf-8",
        ("status", "malformed_json"),
        id="binary garbage",
    ),
    pytest.param(
        topic("n1", Channel.TELEMETRY),
        encode(sample(seq=6, cpu_pct=150.0)),
        ("telemetry", "schema_violation"),
        id="utilisation over 100",
    ),
    pytest.param(
        topic("n1", Channel.TELEMETRY),
        _missing_field(),
        ("telemetry", "schema_violation"),
        id="missing required field",
    ),
    pytest.param(
        topic("n1", Channel.TELEMETRY),
        b"[1, 2, 3]",
        ("telemetry", "schema_violation"),
        id="array instead of object",
    ),
    pytest.param(
        topic("n1", Channel.TELEMETRY),
        encode(sample(node_id="n2", seq=6)),
        ("telemetry", "node_id_mismatch"),
        id="node id differs from topic",
    ),
    pytest.param(
        topic("n1", Channel.STATUS),
        encode(birth(node_id="n2", instance_id="i9")),
        ("status", "node_id_mismatch"),
        id="status for another node",
    ),
    pytest.param(
        topic("n9", Channel.TELEMETRY),
        encode(sample(node_id="n9", seq=6)),
        ("telemetry", "unknown_node"),
        id="unknown node",
    ),
    pytest.param(
        topic("n1", Channel.TELEMETRY),
        encode(sample(instance_id="i0", seq=6)),
        ("telemetry", "instance_mismatch"),
        id="previous agent instance",
    ),
    pytest.param(
        topic("n1", Channel.TELEMETRY),
        encode(sample(seq=5)),
        ("telemetry", "out_of_order"),
        id="repeated sequence number",
    ),
    pytest.param(
        topic("n1", Channel.TELEMETRY),
        encode(sample(seq=2)),
        ("telemetry", "out_of_order"),
        id="older sequence number",
    ),
    pytest.param(
        topic("n9", Channel.REPORTED),
        encode(ReportedState(node_id="n9", instance_id="x", observed_generation=1, reported_at=1)),
        ("reported", "unknown_node"),
        id="reported by an unknown node",
    ),
]


@pytest.mark.parametrize(("bad_topic", "payload", "counted_as"), INVALID_CASES)
def test_each_invalid_message_is_dropped_and_counted_under_its_reason(
    known_node: Ingestor, bad_topic: str, payload: bytes, counted_as: tuple[str, str]
) -> None:
    registry = known_node.registry
    version = registry.version
    ingested = Counter(known_node.stats.ingested)

    known_node.handle(bad_topic, payload)

    assert known_node.stats.invalid == Counter({counted_as: 1})
    assert counted_as[1] in {reason.value for reason in InvalidReason}
    assert known_node.stats.ingested == ingested
    assert registry.version == version
    assert [record.node_id for record in registry.nodes()] == ["n1"]
    record = registry.get("n1")
    assert record is not None
    assert record.status == birth()
    assert record.telemetry == sample(seq=5)


def test_every_invalid_reason_is_exercised() -> None:
    reasons = {case.values[2][1] for case in INVALID_CASES}  # type: ignore[index]
    assert reasons == {reason.value for reason in InvalidReason}


def test_a_payload_of_exactly_the_size_limit_is_accepted(known_node: Ingestor) -> None:
    payload = encode(sample(seq=6))
    padded = payload + b" " * (MAX_PAYLOAD_BYTES - len(payload))
    assert len(padded) == MAX_PAYLOAD_BYTES

    known_node.handle(topic("n1", Channel.TELEMETRY), padded)

    assert known_node.stats.invalid_total == 0
    assert known_node.stats.ingested["telemetry"] == 2


def test_the_size_limit_comes_from_max_payload_bytes(registry: NodeRegistry) -> None:
    payload = encode(birth())
    tight = Ingestor(registry, TOPICS, max_payload_bytes=len(payload) - 1)

    tight.handle(topic("n1", Channel.STATUS), payload)

    assert tight.stats.invalid == Counter({("status", "oversized"): 1})
    assert len(registry) == 0


def test_an_empty_retained_status_forgets_the_node(known_node: Ingestor) -> None:
    known_node.handle(topic("n1", Channel.STATUS), b"")

    assert known_node.registry.get("n1") is None
    assert known_node.stats.invalid_total == 0


def test_an_empty_payload_on_another_channel_forgets_nothing(known_node: Ingestor) -> None:
    known_node.handle(topic("n1", Channel.TELEMETRY), b"")
    known_node.handle(topic("n1", Channel.REPORTED), b"")

    assert known_node.registry.get("n1") is not None


def test_an_empty_status_for_an_unknown_node_is_harmless(ingestor: Ingestor) -> None:
    ingestor.handle(topic("ghost", Channel.STATUS), b"")
    assert len(ingestor.registry) == 0
    assert ingestor.stats.invalid_total == 0


def test_a_flood_of_malformed_payloads_changes_nothing_and_is_counted_exactly(
    known_node: Ingestor,
) -> None:
    registry = known_node.registry
    version = registry.version
    record = registry.get("n1")
    assert record is not None
    telemetry_before, status_before = record.telemetry, record.status

    for index in range(10_000):
        known_node.handle(topic("n1", Channel.TELEMETRY), b"{garbage %d" % index)

    assert known_node.stats.invalid == Counter({("telemetry", "malformed_json"): 10_000})
    assert known_node.stats.ingested == Counter({"status": 1, "telemetry": 1})
    assert registry.version == version
    assert (record.telemetry, record.status) == (telemetry_before, status_before)
    # The node's own next sample still gets through.
    known_node.handle(topic("n1", Channel.TELEMETRY), encode(sample(seq=6)))
    assert known_node.stats.ingested["telemetry"] == 2


def test_one_nodes_bad_messages_do_not_disturb_another_node(known_node: Ingestor) -> None:
    known_node.handle(topic("n2", Channel.STATUS), encode(birth("n2", "j1")))
    for _ in range(50):
        known_node.handle(topic("n1", Channel.TELEMETRY), encode(sample(seq=1)))
    known_node.handle(topic("n2", Channel.TELEMETRY), encode(sample("n2", "j1", seq=1)))

    record = known_node.registry.get("n2")
    assert record is not None
    assert record.telemetry == sample("n2", "j1", seq=1)


def test_state_changes_are_reported_to_the_callback(registry: NodeRegistry) -> None:
    changes: list[NodeStateChange] = []
    ingestor = Ingestor(
        registry, TOPICS, max_payload_bytes=MAX_PAYLOAD_BYTES, on_state_change=changes.append
    )

    ingestor.handle(topic("n1", Channel.STATUS), encode(birth()))
    ingestor.handle(topic("n1", Channel.TELEMETRY), encode(sample(seq=1)))
    ingestor.handle(topic("n1", Channel.STATUS), encode(will()))

    assert changes == [
        NodeStateChange("n1", "online", None),
        NodeStateChange("n1", "offline", "connection-lost"),
    ]


def test_a_stale_will_from_an_older_instance_reports_no_state_change(
    registry: NodeRegistry,
) -> None:
    changes: list[NodeStateChange] = []
    ingestor = Ingestor(
        registry, TOPICS, max_payload_bytes=MAX_PAYLOAD_BYTES, on_state_change=changes.append
    )
    ingestor.handle(topic("n1", Channel.STATUS), encode(birth(instance_id="old")))
    ingestor.handle(topic("n1", Channel.STATUS), encode(birth(instance_id="new")))
    ingestor.handle(topic("n1", Channel.STATUS), encode(will(instance_id="old")))

    assert changes == [NodeStateChange("n1", "online", None)]
    record = registry.get("n1")
    assert record is not None
    assert record.state == "online"


def test_events_are_passed_to_the_callback_and_counted(registry: NodeRegistry) -> None:
    events: list[NodeEvent] = []
    ingestor = Ingestor(
        registry, TOPICS, max_payload_bytes=MAX_PAYLOAD_BYTES, on_event=events.append
    )

    ingestor.handle(topic("n1", Channel.EVENTS), encode(event()))

    assert events == [event()]
    assert ingestor.stats.ingested["events"] == 1


def test_an_event_whose_node_id_differs_from_the_topic_is_not_passed_on(
    registry: NodeRegistry,
) -> None:
    events: list[NodeEvent] = []
    ingestor = Ingestor(
        registry, TOPICS, max_payload_bytes=MAX_PAYLOAD_BYTES, on_event=events.append
    )

    ingestor.handle(topic("n1", Channel.EVENTS), encode(event("n2")))

    assert events == []
    assert ingestor.stats.invalid == Counter({("events", "node_id_mismatch"): 1})


ANY_TOPIC = st.one_of(
    st.sampled_from([topic("n1", channel) for channel in Channel]),
    st.builds(
        lambda node, channel: f"unit-test/v1/nodes/{node}/{channel}",
        st.text(max_size=10),
        st.text(max_size=10),
    ),
    st.text(max_size=40),
)
ANY_PAYLOAD = st.one_of(
    st.binary(max_size=MAX_PAYLOAD_BYTES + 10),
    st.builds(
        lambda value: json.dumps(value).encode(),
        st.recursive(
            st.none() | st.booleans() | st.floats(allow_nan=False) | st.text(max_size=5),
            lambda children: (
                st.lists(children, max_size=3)
                | st.dictionaries(st.text(max_size=12), children, max_size=4)
            ),
            max_leaves=10,
        ),
    ),
)


@settings(max_examples=200, deadline=None)
@given(bad_topic=ANY_TOPIC, payload=ANY_PAYLOAD)
def test_handle_never_raises_for_anything_a_client_can_send(bad_topic: str, payload: bytes) -> None:
    registry = NodeRegistry()
    ingestor = Ingestor(registry, TOPICS, max_payload_bytes=MAX_PAYLOAD_BYTES)
    ingestor.handle(topic("n1", Channel.STATUS), encode(birth()))

    ingestor.handle(bad_topic, payload)

    assert sum(ingestor.stats.ingested.values()) + ingestor.stats.invalid_total <= 2
