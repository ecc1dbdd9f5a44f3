"""Ingestion without a broker: `Ingestor.handle` fed real encoded messages."""

from __future__ import annotations

import json
from collections import Counter

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from cloud.fleet.assignments import AssignmentIndex
from cloud.fleet.early_samples import DEFAULT_HOLD_S, EarlySamples
from cloud.fleet.ingest import Ingestor, InvalidReason
from cloud.fleet.registry import NodeRegistry, NodeStateChange
from shared.messages import (
    Accelerator,
    AcceleratorSample,
    HostInfo,
    JobLogChunk,
    NodeEvent,
    NodeStatus,
    ReportedState,
    ReportedTraining,
    Telemetry,
    TrainingRunState,
    encode,
)
from shared.sealing import public_key_text
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


def _absurd_accelerator() -> bytes:
    # 4 EiB on one device, far beyond cloud.max_accelerator_memory_bytes (64 TiB).
    gpu = msgspec.structs.replace(birth().accelerators[0], memory_bytes=2**62)
    return encode(msgspec.structs.replace(birth(), accelerators=(gpu,)))


def _absurd_power() -> bytes:
    device = AcceleratorSample(id="gpu0", utilization_pct=50.0, memory_used_bytes=4, power_w=1e300)
    return encode(msgspec.structs.replace(sample(seq=6), accelerators=(device,)))


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
    pytest.param(
        topic("n1", Channel.REPORTED),
        encode(ReportedState(node_id="n1", instance_id="i0", observed_generation=1, reported_at=1)),
        ("reported", "instance_mismatch"),
        id="reported by a previous agent instance",
    ),
    pytest.param(
        topic("n1", Channel.TELEMETRY),
        encode(sample(seq=2**52)),  # within the wire's bound (2**53)
        ("telemetry", "seq_jump"),
        id="sequence number far ahead of time",
    ),
    pytest.param(
        topic("n1", Channel.STATUS),
        _absurd_accelerator(),
        ("status", "implausible_inventory"),
        id="4 EiB accelerator",
    ),
    pytest.param(
        topic("n1", Channel.TELEMETRY),
        _absurd_power(),
        ("telemetry", "implausible_sample"),
        id="1e300 W",
    ),
    pytest.param(
        topic("n1", Channel.STATUS),
        encode(msgspec.structs.replace(birth(), started_at=1e300)),
        ("status", "clock_skew"),
        id="started in the far future",
    ),
    pytest.param(
        topic("n1", Channel.TELEMETRY),
        encode(msgspec.structs.replace(sample(seq=6), sampled_at=1_699_000_000.0)),
        ("telemetry", "clock_skew"),
        id="sample taken long ago",
    ),
    pytest.param(
        topic("n1", Channel.TELEMETRY),
        encode(msgspec.structs.replace(sample(seq=6), interval_s=0.001)),
        ("telemetry", "bad_interval"),
        id="interval below the minimum",
    ),
    pytest.param(
        topic("n1", Channel.STATUS),
        encode(msgspec.structs.replace(birth(), labels={f"k{i}": "v" for i in range(65)})),
        ("status", "field_too_long"),
        id="65 labels",
    ),
    pytest.param(
        topic("n1", Channel.STATUS),
        encode(msgspec.structs.replace(birth(), zone="=cmd|' /C calc'!A0")),
        ("status", "invalid_name"),
        id="a zone that is a spreadsheet formula",
    ),
    pytest.param(
        topic("n1", Channel.STATUS),
        encode(msgspec.structs.replace(birth(), labels={"team": "@SUM(1+1)"})),
        ("status", "invalid_name"),
        id="a label value that is a spreadsheet formula",
    ),
    pytest.param(
        topic("n1", Channel.STATUS),
        encode(msgspec.structs.replace(birth(), region="eu west\x1b[2J")),
        ("status", "invalid_name"),
        id="a region with a space and a terminal escape",
    ),
    pytest.param(
        topic("n1", Channel.STATUS),
        encode(birth(instance_id="i2")),
        ("status", "instance_conflict"),
        id="another instance's birth while i1 sends samples",
    ),
    pytest.param(
        topic("n1", Channel.STATUS),
        b"",
        ("status", "status_cleared"),
        id="the node's status cleared",
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


def test_a_node_the_enrolment_gate_refuses_is_dropped_and_counted(known_node: Ingestor) -> None:
    version = known_node.registry.version
    known_node.admits_node = lambda node_id: node_id != "n1"  # cloud/fleet/enrolled.py

    known_node.handle(topic("n1", Channel.TELEMETRY), encode(sample(seq=6)))

    assert known_node.stats.invalid == Counter({("telemetry", "not_enrolled"): 1})
    assert known_node.registry.version == version


def keyed_birth(key: str | None) -> NodeStatus:
    return msgspec.structs.replace(birth(), sealing_public_key=key)


# Fixed keys: parameters are test ids, the same in every process that collects them.
NODE_KEY = public_key_text(X25519PrivateKey.from_private_bytes(bytes([1]) * 32))
OTHER_KEY = public_key_text(X25519PrivateKey.from_private_bytes(bytes([2]) * 32))


@pytest.mark.parametrize(
    ("announced", "pinned", "kept", "counted_as"),
    [
        (NODE_KEY, None, NODE_KEY, None),  # enrolled without a key: trusted
        (NODE_KEY, NODE_KEY, NODE_KEY, None),
        (OTHER_KEY, NODE_KEY, None, "sealing_key_mismatch"),
        ("bm90IGEga2V5", None, None, "sealing_key_invalid"),  # base64, but 9 bytes
        ("not base64!", NODE_KEY, None, "sealing_key_invalid"),
        (None, NODE_KEY, None, None),  # an older agent announces none
    ],
)
def test_a_birth_keeps_its_sealing_key_only_when_it_is_the_one_the_node_enrolled_with(
    ingestor: Ingestor, announced: str | None, pinned: str | None, kept: str | None,
    counted_as: str | None,
) -> None:  # fmt: skip
    ingestor.pinned_sealing_key = {"n1": pinned}.get  # cloud/fleet/enrolled.py

    ingestor.handle(topic("n1", Channel.STATUS), encode(keyed_birth(announced)))

    record = ingestor.registry.get("n1")
    assert record is not None  # the birth itself is always kept
    assert record.status == keyed_birth(kept)
    assert ingestor.stats.ingested["status"] == 1
    expected = Counter({("status", counted_as): 1}) if counted_as else Counter()
    assert ingestor.stats.invalid == expected


def test_every_invalid_reason_is_exercised() -> None:
    reasons = {case.values[2][1] for case in INVALID_CASES}  # type: ignore[index]
    reasons.add(InvalidReason.NOT_ENROLLED.value)  # the test above
    reasons |= {"sealing_key_invalid", "sealing_key_mismatch"}  # and the one before
    # Below: they need more than one message.
    reasons |= {"registry_full", "not_assigned", "wrong_attempt", "illegal_transition"}
    reasons.add("index_mismatch")  # a relayed sample: tests/cloud/test_telemetry_digest.py
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


def test_an_empty_retained_status_keeps_the_node_and_is_counted(known_node: Ingestor) -> None:
    # Anyone who can write the topic can clear it: only an admin's revoke removes a node.
    known_node.handle(topic("n1", Channel.STATUS), b"")

    record = known_node.registry.get("n1")
    assert record is not None
    assert record.state == "online"
    assert known_node.stats.invalid == Counter({("status", "status_cleared"): 1})


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


# ---- the registry's bound, and who may speak of which work ------------------------------


def test_a_birth_beyond_max_nodes_is_refused_while_known_nodes_keep_updating(
    clock: FakeClock,
) -> None:
    registry = NodeRegistry(monotonic=clock.monotonic, wall_clock=clock.wall, max_nodes=2)
    ingestor = Ingestor(registry, TOPICS, max_payload_bytes=MAX_PAYLOAD_BYTES)
    for node_id in ("n1", "n2", "n3"):
        ingestor.handle(topic(node_id, Channel.STATUS), encode(birth(node_id, f"i-{node_id}")))

    assert [record.node_id for record in registry.nodes()] == ["n1", "n2"]
    assert ingestor.stats.invalid == Counter({("status", "registry_full"): 1})
    ingestor.handle(topic("n2", Channel.TELEMETRY), encode(sample("n2", "i-n2", seq=1)))
    ingestor.handle(topic("n1", Channel.STATUS), encode(will("n1", "i-n1")))
    assert registry.get("n2").telemetry == sample("n2", "i-n2", seq=1)  # type: ignore[union-attr]
    assert registry.get("n1").state == "offline"  # type: ignore[union-attr]
    # Clearing a node's status makes no room (anyone who can write it could); a node
    # an admin revokes leaves, and makes room.
    ingestor.handle(topic("n1", Channel.STATUS), b"")
    ingestor.handle(topic("n3", Channel.STATUS), encode(birth("n3", "i-n3")))
    assert registry.get("n3") is None
    assert registry.forget("n1")  # what POST /v1/nodes/n1/revoke does
    ingestor.handle(topic("n3", Channel.STATUS), encode(birth("n3", "i-n3")))
    assert registry.get("n3") is not None


class Clock:
    """A monotonic clock a test moves by hand (the hold of unconfirmed messages)."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def log_chunk(node_id: str, job_id: str, attempt: int, text: str) -> JobLogChunk:
    return JobLogChunk(
        node_id=node_id, job_id=job_id, attempt=attempt, offset=0, text=text, sent_at=1.0
    )


@pytest.fixture
def hold_clock() -> Clock:
    return Clock()


@pytest.fixture
def gated(registry: NodeRegistry, hold_clock: Clock) -> tuple[Ingestor, list[JobLogChunk]]:
    """An ingestor with an assignment index: n1 runs attempt 2 of job-a."""
    index = AssignmentIndex(monotonic=hold_clock, linger_s=60.0)
    kept: list[JobLogChunk] = []
    ingestor = Ingestor(
        registry, TOPICS, max_payload_bytes=MAX_PAYLOAD_BYTES, on_log=kept.append, assignments=index
    )
    index.replace({("training", "n1", "job-a", 2)})
    ingestor.handle(topic("n1", Channel.STATUS), encode(birth()))
    return ingestor, kept


def test_log_chunks_are_kept_only_from_the_node_that_runs_that_attempt(
    gated: tuple[Ingestor, list[JobLogChunk]], hold_clock: Clock
) -> None:
    ingestor, kept = gated
    mine = log_chunk("n1", "job-a", 2, "epoch 1\n")
    for chunk in (
        mine,
        log_chunk("n2", "job-a", 2, "forged by another node\n"),
        log_chunk("n1", "job-a", 1, "an earlier attempt\n"),
        log_chunk("n1", "no-such-job", 0, "a job that does not exist\n"),
        log_chunk("ghost", "job-a", 2, "a node that does not exist\n"),
    ):
        ingestor.handle(topic(chunk.node_id, Channel.LOGS), encode(chunk))
    assert kept == [mine]

    hold_clock.now_s = 5.1
    ingestor.assignments.replace({("training", "n1", "job-a", 2)})  # type: ignore[union-attr]

    assert kept == [mine]
    assert ingestor.stats.invalid == Counter(
        {("logs", "not_assigned"): 3, ("logs", "wrong_attempt"): 1}
    )
    assert ingestor.stats.ingested["logs"] == 1


def test_a_chunk_for_work_the_index_learns_of_soon_is_held_then_kept_in_order(
    gated: tuple[Ingestor, list[JobLogChunk]], hold_clock: Clock
) -> None:
    ingestor, kept = gated
    first, second = log_chunk("n1", "job-b", 1, "one\n"), log_chunk("n1", "job-b", 1, "two\n")
    ingestor.handle(topic("n1", Channel.LOGS), encode(first))
    ingestor.handle(topic("n1", Channel.LOGS), encode(second))
    assert kept == []

    hold_clock.now_s = 2.0  # another replica's pass placed it; the refresh tells us
    ingestor.assignments.replace(  # type: ignore[union-attr]
        {("training", "n1", "job-a", 2), ("training", "n1", "job-b", 1)}
    )

    assert kept == [first, second]
    assert ingestor.stats.invalid_total == 0


def test_a_withdrawn_workers_last_output_is_still_kept_for_a_while(
    gated: tuple[Ingestor, list[JobLogChunk]], hold_clock: Clock
) -> None:
    ingestor, kept = gated
    ingestor.assignments.replace(set())  # type: ignore[union-attr]  # job-a finished
    last = log_chunk("n1", "job-a", 2, "done\n")
    ingestor.handle(topic("n1", Channel.LOGS), encode(last))
    assert kept == [last]

    hold_clock.now_s = 61.0
    ingestor.assignments.replace(set())  # type: ignore[union-attr]  # linger over
    ingestor.handle(topic("n1", Channel.LOGS), encode(log_chunk("n1", "job-a", 2, "late\n")))
    hold_clock.now_s = 67.0
    ingestor.assignments.replace(set())  # type: ignore[union-attr]
    assert kept == [last]
    assert ingestor.stats.invalid == Counter({("logs", "not_assigned"): 1})


def test_a_flood_of_unassigned_chunks_is_held_within_bounds(
    gated: tuple[Ingestor, list[JobLogChunk]],
) -> None:
    ingestor, kept = gated
    for index in range(1000):
        chunk = log_chunk("n1", f"job-{index}", 1, "x")
        ingestor.handle(topic("n1", Channel.LOGS), encode(chunk))

    # 32 wait for the index (5 s); the rest are refused at once.
    assert ingestor.stats.invalid[("logs", "not_assigned")] == 1000 - 32
    assert kept == []


def reported(*training: ReportedTraining, instance_id: str = "i1") -> ReportedState:
    return ReportedState(
        node_id="n1",
        instance_id=instance_id,
        observed_generation=1,
        reported_at=1_700_000_000.0,
        training=training,
    )


def run(job_id: str, attempt: int, state: TrainingRunState) -> ReportedTraining:
    return ReportedTraining(job_id=job_id, attempt=attempt, state=state)


def test_reported_entries_about_work_not_on_the_node_are_counted(
    gated: tuple[Ingestor, list[JobLogChunk]], hold_clock: Clock
) -> None:
    ingestor, _ = gated
    document = reported(
        run("job-a", 2, "running"),
        run("job-a", 1, "succeeded"),
        run("someone-elses-job", 1, "succeeded"),
    )
    ingestor.handle(topic("n1", Channel.REPORTED), encode(document))
    hold_clock.now_s = 6.0
    ingestor.assignments.replace({("training", "n1", "job-a", 2)})  # type: ignore[union-attr]

    # Kept as sent: the loop reads only the entries of n1's own allocations.
    assert ingestor.registry.get("n1").reported == document  # type: ignore[union-attr]
    assert ingestor.stats.invalid == Counter(
        {("reported", "wrong_attempt"): 1, ("reported", "not_assigned"): 1}
    )


def test_a_report_full_of_unknown_entries_does_not_crowd_out_the_nodes_real_logs(
    registry: NodeRegistry, hold_clock: Clock
) -> None:
    index = AssignmentIndex(monotonic=hold_clock, linger_s=60.0)
    kept: list[JobLogChunk] = []
    ingestor = Ingestor(
        registry, TOPICS, max_payload_bytes=64 * 1024, on_log=kept.append, assignments=index
    )
    index.replace({("training", "n1", "job-a", 2)})
    ingestor.handle(topic("n1", Channel.STATUS), encode(birth()))
    finished = [run(f"old-{index}", 1, "succeeded") for index in range(40)]
    ingestor.handle(topic("n1", Channel.REPORTED), encode(reported(*finished)))
    # Held for the index's next update (apart from the chunks' budget), then counted.
    assert ingestor.stats.invalid[("reported", "not_assigned")] == 0
    fresh = log_chunk("n1", "job-new", 1, "first line\n")  # placed a moment ago
    ingestor.handle(topic("n1", Channel.LOGS), encode(fresh))
    hold_clock.now_s = 1.0
    ingestor.assignments.replace(  # type: ignore[union-attr]
        {("training", "n1", "job-a", 2), ("training", "n1", "job-new", 1)}
    )
    assert kept == [fresh]
    hold_clock.now_s = 6.0
    index.replace({("training", "n1", "job-a", 2), ("training", "n1", "job-new", 1)})
    assert ingestor.stats.invalid[("reported", "not_assigned")] == 40


def test_an_entry_that_goes_backwards_within_an_instance_is_undone_and_counted(
    gated: tuple[Ingestor, list[JobLogChunk]],
) -> None:
    ingestor, _ = gated
    handle = ingestor.handle
    handle(topic("n1", Channel.REPORTED), encode(reported(run("job-a", 2, "succeeded"))))

    handle(topic("n1", Channel.REPORTED), encode(reported(run("job-a", 2, "starting"))))

    record = ingestor.registry.get("n1")
    assert record is not None
    assert record.reported is not None
    assert record.reported.training == (run("job-a", 2, "succeeded"),)
    assert ingestor.stats.invalid == Counter({("reported", "illegal_transition"): 1})
    # A new agent instance runs it afresh: starting again is its word.
    handle(topic("n1", Channel.STATUS), encode(birth(instance_id="i2")))
    handle(
        topic("n1", Channel.REPORTED),
        encode(reported(run("job-a", 2, "starting"), instance_id="i2")),
    )
    assert record.reported.training == (run("job-a", 2, "starting"),)


def test_a_sample_ahead_of_its_birth_is_applied_by_the_birth(
    ingestor: Ingestor, registry: NodeRegistry
) -> None:
    seen: list[Telemetry] = []
    ingestor.telemetry_listeners.append(seen.append)
    ingestor.handle(topic("n1", Channel.TELEMETRY), encode(sample(seq=1)))
    assert registry.get("n1") is None
    assert ingestor.stats.invalid_total == 0  # held, not refused
    ingestor.handle(topic("n1", Channel.TELEMETRY), encode(sample(seq=2)))
    ingestor.handle(topic("n1", Channel.STATUS), encode(birth()))
    record = registry.get("n1")
    assert record is not None
    assert record.telemetry is not None
    assert record.telemetry.seq == 2  # the newest held sample
    assert [t.seq for t in seen] == [2]
    assert ingestor.stats.ingested[Channel.TELEMETRY] == 1
    # The older one was superseded: refused as it would have been at once.
    assert ingestor.stats.invalid == Counter({("telemetry", "unknown_node"): 1})


def test_a_sample_of_a_node_that_never_announces_itself_is_refused_after_the_hold(
    ingestor: Ingestor, clock: FakeClock
) -> None:
    ingestor.handle(topic("n9", Channel.TELEMETRY), encode(sample(node_id="n9", seq=6)))
    assert ingestor.stats.invalid_total == 0
    clock.now_s += DEFAULT_HOLD_S + 1.0
    # The next early sample gives up what was held too long.
    ingestor.handle(topic("n8", Channel.TELEMETRY), encode(sample(node_id="n8", seq=6)))
    assert ingestor.stats.invalid == Counter({("telemetry", "unknown_node"): 1})
    ingestor.handle(topic("n9", Channel.STATUS), encode(birth(node_id="n9")))
    assert ingestor.stats.ingested[Channel.TELEMETRY] == 0  # nothing held for n9 any more


def test_early_samples_are_held_for_a_bounded_number_of_nodes() -> None:
    early = EarlySamples(max_nodes=2, monotonic=lambda: 0.0)
    assert early.hold(sample(node_id="a"), "ta") == []
    assert early.hold(sample(node_id="b"), "tb") == []
    given_up = early.hold(sample(node_id="c"), "tc")
    assert [(t.node_id, held_topic) for t, held_topic in given_up] == [("a", "ta")]
    assert len(early) == 2
    assert early.take("a") is None
    taken = early.take("c")
    assert taken is not None
    assert taken[0].node_id == "c"
