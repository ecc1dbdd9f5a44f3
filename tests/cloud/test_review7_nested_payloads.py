"""A node's message nested too deeply to decode (msgspec raises RecursionError there,
not DecodeError) is malformed JSON like any other: counted as `malformed_json`, logged
at most once per interval, dropped; never an ingestion failure with a traceback per
message (cloud/fleet/ingest.py)."""

from __future__ import annotations

from collections import Counter

from structlog.testing import capture_logs

from cloud.fleet.ingest import Ingestor
from cloud.fleet.registry import NodeRegistry
from shared.messages import NodeStatus
from shared.topics import Channel, Topics

TOPICS = Topics("unit-test")
NESTING = 10_000
NESTED = b'{"node_id":"n1","x":' + b"[" * NESTING + b"]" * NESTING + b"}"
NODE_CHANNELS = (
    Channel.STATUS,
    Channel.TELEMETRY,
    Channel.REPORTED,
    Channel.EVENTS,
    Channel.LOGS,
)


def ingestor(shared_group: str = "") -> Ingestor:
    return Ingestor(NodeRegistry(), TOPICS, max_payload_bytes=1 << 20, shared_group=shared_group)


def test_nested_payloads_on_every_node_channel_are_malformed_json_not_failures() -> None:
    ingesting = ingestor()
    with capture_logs() as logs:
        for channel in NODE_CHANNELS:
            for _ in range(50):
                ingesting.handle_message(TOPICS.node("n1", channel), NESTED)

    assert ingesting.stats.failures == 0
    assert ingesting.stats.invalid == Counter(
        {(channel.value, "malformed_json"): 50 for channel in NODE_CHANNELS}
    )
    assert [entry for entry in logs if entry["event"] == "ingestion failed"] == []
    assert len(logs) == len(NODE_CHANNELS)  # one line per channel and reason, then quiet


def test_a_nested_digest_from_a_replica_is_malformed_json() -> None:
    ingesting = ingestor(shared_group="replicas")
    ingesting.handle_message(TOPICS.telemetry_digest, NESTED)

    assert ingesting.stats.failures == 0
    assert sum(ingesting.stats.invalid.values()) == 1
    assert next(iter(ingesting.stats.invalid))[1] == "malformed_json"


def test_a_nested_birth_of_a_node_not_enrolled_is_refused_and_never_offered() -> None:
    ingesting = ingestor()
    ingesting.admits_node = lambda node_id: False
    offered: list[NodeStatus] = []
    ingesting.unenrolled_birth = lambda status, payload: offered.append(status)

    ingesting.handle_message(TOPICS.node("n1", Channel.STATUS), NESTED)

    assert ingesting.stats.failures == 0
    assert ingesting.stats.invalid == Counter({("status", "not_enrolled"): 1})
    assert offered == []
