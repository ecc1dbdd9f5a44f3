"""Replicas' telemetry digests without a broker (cloud/fleet/digest.py): what one replica
accepted reaches another's registry, checked as a node's own sample is."""

from __future__ import annotations

import msgspec
import pytest

from cloud.fleet.digest import MAX_DIGEST_SAMPLES, DigestBuilder, TelemetryDigest
from cloud.fleet.ingest import DIGEST_CHANNEL, Ingestor, InvalidReason
from cloud.fleet.registry import NodeRegistry
from shared.messages import Telemetry, encode
from shared.topics import Channel
from tests.cloud.test_ingest_unit import (
    MAX_PAYLOAD_BYTES,
    TOPICS,
    FakeClock,
    birth,
    sample,
    topic,
)

DIGEST_TOPIC = TOPICS.telemetry_digest


def replica(clock: FakeClock) -> Ingestor:
    registry = NodeRegistry(monotonic=clock.monotonic, wall_clock=clock.wall)
    ingestor = Ingestor(registry, TOPICS, max_payload_bytes=MAX_PAYLOAD_BYTES, shared_group="cloud")
    ingestor.handle(topic("n1", Channel.STATUS), encode(birth()))
    ingestor.handle(topic("n2", Channel.STATUS), encode(birth("n2")))
    return ingestor


def digest_of(*samples: Telemetry, replica_id: str = "replica-other") -> bytes:
    return encode(TelemetryDigest(replica_id=replica_id, sent_at=1.0, samples=samples))


@pytest.fixture
def pair() -> tuple[Ingestor, Ingestor]:
    clock = FakeClock()
    return replica(clock), replica(clock)


def test_what_one_replica_took_reaches_the_others_registry_and_listeners(
    pair: tuple[Ingestor, Ingestor],
) -> None:
    taker, other = pair
    merged: list[Telemetry] = []
    local: list[Telemetry] = []
    other.digest_listeners.append(merged.append)
    other.telemetry_listeners.append(local.append)

    taker.handle(topic("n1", Channel.TELEMETRY), encode(sample(seq=1)))
    taker.handle(topic("n1", Channel.TELEMETRY), encode(sample(seq=2, cpu_pct=70.0)))
    taker.handle(topic("n2", Channel.TELEMETRY), encode(sample("n2", seq=9)))
    (digest,) = taker.digest.take(now_s=1.0)
    assert taker.digest.take(now_s=2.0) == []  # nothing heard since
    other.handle(DIGEST_TOPIC, digest)

    n1, n2 = other.registry.get("n1"), other.registry.get("n2")
    assert n1 is not None
    assert n1.telemetry is not None
    assert n2 is not None
    assert (n1.telemetry.seq, n1.telemetry.cpu_utilization_pct) == (2, 70.0)  # the latest
    assert n2.telemetry is not None
    assert n2.telemetry.seq == 9
    assert other.stats.ingested[DIGEST_CHANNEL] == 2
    assert [t.seq for t in merged] == [2, 9]
    # Merged samples are not this replica's own: per-sample counters (inference
    # requests) count each sample on the one replica that took it.
    assert local == []
    # Nor are they passed on: a digest carries only what its replica took itself.
    assert other.digest.take(now_s=2.0) == []


def test_a_replica_skips_its_own_digest_and_samples_it_already_has(
    pair: tuple[Ingestor, Ingestor],
) -> None:
    taker, other = pair
    taker.handle(topic("n1", Channel.TELEMETRY), encode(sample(seq=3)))
    (digest,) = taker.digest.take(now_s=1.0)
    taker.handle(DIGEST_TOPIC, digest)
    assert taker.stats.ingested[DIGEST_CHANNEL] == 0
    assert taker.stats.digest_stale == 0

    other.handle(topic("n1", Channel.TELEMETRY), encode(sample(seq=4)))
    other.handle(DIGEST_TOPIC, digest)  # seq 3, older than its own 4
    record = other.registry.get("n1")
    assert record is not None
    assert record.telemetry is not None
    assert record.telemetry.seq == 4
    assert other.stats.digest_stale == 1
    assert other.stats.invalid_total == 0


def test_a_replica_whose_id_begins_with_anothers_is_not_taken_for_it(
    pair: tuple[Ingestor, Ingestor],
) -> None:
    # A replica tells its own digests by their first bytes (cloud/fleet/digest.py): the
    # id is compared whole, so "replica-abc" never skips "replica-abcd"'s digest.
    taker, _ = pair
    longer_id = taker.digest.replica_id + "d"
    taker.handle(DIGEST_TOPIC, digest_of(sample(seq=5), replica_id=longer_id))
    assert taker.stats.ingested[DIGEST_CHANNEL] == 1
    record = taker.registry.get("n1")
    assert record is not None
    assert record.telemetry is not None
    assert record.telemetry.seq == 5


@pytest.mark.parametrize(
    ("forged", "reason"),
    [
        (sample(instance_id="impostor", seq=6), InvalidReason.INSTANCE_MISMATCH),
        (sample(seq=10**9), InvalidReason.SEQ_JUMP),
        (sample("n9", seq=1), InvalidReason.UNKNOWN_NODE),
        (msgspec.structs.replace(sample(seq=6), interval_s=1e9), InvalidReason.BAD_INTERVAL),
        (msgspec.structs.replace(sample(seq=6), sampled_at=1e10), InvalidReason.CLOCK_SKEW),
    ],
)
def test_a_digest_relays_only_what_the_node_could_have_said_itself(
    pair: tuple[Ingestor, Ingestor], forged: Telemetry, reason: InvalidReason
) -> None:
    _, other = pair
    other.handle(topic("n1", Channel.TELEMETRY), encode(sample(seq=5)))

    other.handle(DIGEST_TOPIC, digest_of(forged, sample("n2", seq=1)))

    assert other.stats.invalid[(DIGEST_CHANNEL, reason.value)] == 1
    record = other.registry.get("n1")
    assert record is not None
    assert record.telemetry is not None
    assert (record.telemetry.instance_id, record.telemetry.seq) == ("i1", 5)
    assert other.stats.ingested[DIGEST_CHANNEL] == 1  # n2's, in the same digest


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"{not json", InvalidReason.MALFORMED_JSON),
        (b'{"replica_id": "x", "sent_at": 1.0, "samples": [{"node_id": 3}]}', None),
        (b"x" * (MAX_PAYLOAD_BYTES + 2048), InvalidReason.OVERSIZED),
    ],
)
def test_a_malformed_digest_is_counted_and_changes_nothing(
    pair: tuple[Ingestor, Ingestor], payload: bytes, reason: InvalidReason | None
) -> None:
    _, other = pair
    other.handle(DIGEST_TOPIC, payload)
    expected = (reason or InvalidReason.SCHEMA_VIOLATION).value
    assert other.stats.invalid == {(DIGEST_CHANNEL, expected): 1}
    assert other.stats.failures == 0


def test_without_a_shared_group_the_digest_topic_is_not_listened_to() -> None:
    clock = FakeClock()
    registry = NodeRegistry(monotonic=clock.monotonic, wall_clock=clock.wall)
    plain = Ingestor(registry, TOPICS, max_payload_bytes=MAX_PAYLOAD_BYTES)
    plain.handle(topic("n1", Channel.STATUS), encode(birth()))
    plain.handle(DIGEST_TOPIC, digest_of(sample(seq=1)))
    assert plain.stats.invalid == {("unknown", InvalidReason.BAD_TOPIC.value): 1}
    record = registry.get("n1")
    assert record is not None
    assert record.telemetry is None


def test_a_large_digest_is_split_by_size_and_count() -> None:
    builder = DigestBuilder("replica-a", max_payload_bytes=4096)
    for index in range(MAX_DIGEST_SAMPLES + 40):
        builder.observe(sample(f"n{index}", seq=1))
    messages = builder.take(now_s=1.0)
    decoded = [msgspec.json.decode(m, type=TelemetryDigest) for m in messages]
    assert all(len(m) <= 4096 for m in messages)
    assert sum(len(d.samples) for d in decoded) == MAX_DIGEST_SAMPLES + 40
    assert {d.replica_id for d in decoded} == {"replica-a"}
