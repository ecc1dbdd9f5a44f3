"""Replicas' telemetry digests without a broker (cloud/fleet/digest.py): what one replica
accepted reaches another's registry, checked as a node's own sample is."""

from __future__ import annotations

import msgspec
import pytest

from cloud.fleet.digest import (
    MAX_DIGEST_SAMPLES,
    RELAYED_DIGEST_DECODER,
    DigestBuilder,
    TelemetryDigest,
    max_digest_bytes,
)
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
    will,
)

DIGEST_TOPIC = TOPICS.telemetry_digest
WALL_S = FakeClock().wall()  # the replicas' wall clock, when digests are cut


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
    (digest,) = taker.digest.take(now_s=WALL_S)
    assert taker.digest.take(now_s=WALL_S + 1.0) == []  # nothing heard since
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
    assert other.digest.take(now_s=WALL_S + 1.0) == []


def test_a_replica_skips_its_own_digest_and_samples_it_already_has(
    pair: tuple[Ingestor, Ingestor],
) -> None:
    taker, other = pair
    taker.handle(topic("n1", Channel.TELEMETRY), encode(sample(seq=3)))
    (digest,) = taker.digest.take(now_s=WALL_S)
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
        (b"x" * (max_digest_bytes(MAX_PAYLOAD_BYTES) + 1), InvalidReason.OVERSIZED),
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
    messages = builder.take(now_s=WALL_S)
    decoded = [msgspec.json.decode(m, type=TelemetryDigest) for m in messages]
    assert all(len(m) <= 4096 for m in messages)
    assert sum(len(d.samples) for d in decoded) == MAX_DIGEST_SAMPLES + 40
    assert {d.replica_id for d in decoded} == {"replica-a"}


def test_a_digest_relays_each_sample_as_its_node_sent_it() -> None:
    # The bytes a node sent (whatever their spacing) go out as they came, indexed.
    builder = DigestBuilder("replica-a", max_payload_bytes=MAX_PAYLOAD_BYTES)
    sent = encode(sample(seq=3)).replace(b",", b", ")
    builder.observe(sample(seq=3), sent)
    builder.observe(sample("n2", seq=7))  # no bytes: encoded when the digest is cut
    (message,) = builder.take(now_s=WALL_S)
    relayed = RELAYED_DIGEST_DECODER.decode(message)
    assert relayed.indexed
    assert (relayed.nodes, relayed.instances, relayed.seqs) == (("n1", "n2"), ("i1", "i1"), (3, 7))
    assert bytes(relayed.samples[0]) == sent
    assert msgspec.json.decode(message, type=TelemetryDigest).samples[1] == sample("n2", seq=7)


def test_a_replica_that_does_not_meter_decodes_a_relayed_sample_only_when_it_is_read(
    pair: tuple[Ingestor, Ingestor],
) -> None:
    taker, other = pair
    for replica_ in pair:  # a node's first sample here is decoded at once
        replica_.handle(topic("n1", Channel.TELEMETRY), encode(sample(seq=1, cpu_pct=30.0)))
    taker.digest.take(now_s=WALL_S)
    taker.handle(topic("n1", Channel.TELEMETRY), encode(sample(seq=2, cpu_pct=70.0)))
    (digest,) = taker.digest.take(now_s=WALL_S)
    other.handle(DIGEST_TOPIC, digest)

    record = other.registry.get("n1")
    assert record is not None
    # Applied by its index: the node's sequence, last seen and hold are current ...
    assert record.telemetry_seq == 2
    assert record.relayed is not None
    assert record.decoded_telemetry is not None
    assert record.decoded_telemetry.seq == 1
    assert other.registry.holds_node(record)
    assert other.stats.ingested[DIGEST_CHANNEL] == 1
    # ... and the sample is decoded on the first read, once.
    telemetry = record.telemetry
    assert telemetry is not None
    assert (telemetry.seq, telemetry.cpu_utilization_pct) == (2, 70.0)
    assert record.telemetry is telemetry
    # The same sequence rules as a node's own sample: an older one is stale.
    other.handle(topic("n1", Channel.TELEMETRY), encode(sample(seq=3)))
    other.handle(DIGEST_TOPIC, digest)
    assert other.stats.digest_stale == 1
    assert other.stats.invalid_total == 0


def relayed_digest(
    *entries: tuple[str, str, int, bytes], sent_at: float = WALL_S, replica_id: str = "replica-x"
) -> bytes:
    """A digest as a replica sends it, with each entry's index and sample chosen freely."""
    return msgspec.json.encode(
        {
            "schema_version": "1.13",
            "replica_id": replica_id,
            "sent_at": sent_at,
            "nodes": [node_id for node_id, _, _, _ in entries],
            "instances": [instance_id for _, instance_id, _, _ in entries],
            "seqs": [seq for _, _, seq, _ in entries],
            "samples": [msgspec.Raw(raw) for _, _, _, raw in entries],
        }
    )


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        # A sample that is not what its index entry says it is.
        (encode(sample("n2", seq=6)), InvalidReason.INDEX_MISMATCH),
        (encode(sample(seq=7)), InvalidReason.INDEX_MISMATCH),
        (encode(sample(instance_id="impostor", seq=6)), InvalidReason.INDEX_MISMATCH),
        # A sample no node could have sent.
        (
            encode(msgspec.structs.replace(sample(seq=6), interval_s=1e9)),
            InvalidReason.BAD_INTERVAL,
        ),
        (
            encode(msgspec.structs.replace(sample(seq=6), sampled_at=1e10)),
            InvalidReason.CLOCK_SKEW,
        ),
        (b'{"node_id": "n1"}', InvalidReason.SCHEMA_VIOLATION),
    ],
)
def test_a_relayed_sample_is_checked_when_read_and_one_that_fails_leaves_the_last_good_one(
    pair: tuple[Ingestor, Ingestor], raw: bytes, reason: InvalidReason
) -> None:
    _, other = pair
    other.handle(topic("n1", Channel.TELEMETRY), encode(sample(seq=5, cpu_pct=40.0)))

    other.handle(DIGEST_TOPIC, relayed_digest(("n1", "i1", 6, raw)))

    record = other.registry.get("n1")
    assert record is not None
    assert other.stats.invalid_total == 0  # not decoded yet
    telemetry = record.telemetry
    assert other.stats.invalid == {(DIGEST_CHANNEL, reason.value): 1}
    assert telemetry is not None
    assert (telemetry.seq, telemetry.cpu_utilization_pct) == (5, 40.0)
    assert record.telemetry is telemetry  # counted once


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        (("n1", "impostor", 6), InvalidReason.INSTANCE_MISMATCH),
        (("n1", "i1", 10**9), InvalidReason.SEQ_JUMP),
        (("n9", "i1", 1), InvalidReason.UNKNOWN_NODE),
    ],
)
def test_a_relayed_index_entry_obeys_the_registrys_rules(
    pair: tuple[Ingestor, Ingestor], entry: tuple[str, str, int], reason: InvalidReason
) -> None:
    _, other = pair
    other.handle(topic("n1", Channel.TELEMETRY), encode(sample(seq=5)))
    node_id, instance_id, seq = entry
    forged = encode(sample(node_id, instance_id, seq))

    other.handle(
        DIGEST_TOPIC,
        relayed_digest((node_id, instance_id, seq, forged), ("n2", "i1", 1, encode(sample("n2")))),
    )

    assert other.stats.invalid == {(DIGEST_CHANNEL, reason.value): 1}
    assert other.stats.ingested[DIGEST_CHANNEL] == 1  # n2's, in the same digest
    record = other.registry.get("n1")
    assert record is not None
    assert record.telemetry is not None
    assert (record.telemetry.instance_id, record.telemetry.seq) == ("i1", 5)


def test_a_relayed_sample_refused_when_read_gives_back_the_sequence_it_claimed(
    pair: tuple[Ingestor, Ingestor],
) -> None:
    """An index entry moves the node's sequence on before its sample is read; refused
    then, it must not leave the node's real samples up to it refused as old."""
    _, other = pair
    other.handle(topic("n1", Channel.TELEMETRY), encode(sample(seq=5)))
    other.handle(DIGEST_TOPIC, relayed_digest(("n1", "i1", 9, b'{"node_id": "n1"}')))
    record = other.registry.get("n1")
    assert record is not None
    assert record.telemetry is not None
    assert record.telemetry.seq == 5

    other.handle(topic("n1", Channel.TELEMETRY), encode(sample(seq=6, cpu_pct=60.0)))

    assert record.telemetry is not None
    assert (record.telemetry.seq, record.telemetry.cpu_utilization_pct) == (6, 60.0)
    assert other.stats.invalid == {(DIGEST_CHANNEL, InvalidReason.SCHEMA_VIOLATION.value): 1}


def test_a_relayed_sample_that_fails_its_checks_never_brings_a_node_back_online(
    pair: tuple[Ingestor, Ingestor],
) -> None:
    _, other = pair
    other.handle(topic("n1", Channel.TELEMETRY), encode(sample(seq=5)))
    other.handle(topic("n1", Channel.STATUS), encode(will()))
    record = other.registry.get("n1")
    assert record is not None
    assert record.state == "offline"

    other.handle(DIGEST_TOPIC, relayed_digest(("n1", "i1", 6, b'{"node_id": "n1"}')))

    assert record.state == "offline"
    assert other.stats.invalid == {(DIGEST_CHANNEL, InvalidReason.SCHEMA_VIOLATION.value): 1}
    assert other.stats.ingested[DIGEST_CHANNEL] == 0


def test_a_late_relayed_sample_of_the_instance_a_restart_replaced_does_not_take_it_back(
    pair: tuple[Ingestor, Ingestor],
) -> None:
    """Replica A took the old agent's last sample; the agent died, and its will and the new
    agent's birth reached replica B before A's digest: that sample is old news there."""
    took, other = pair
    for replica_ in pair:
        replica_.handle(topic("n1", Channel.TELEMETRY), encode(sample(seq=50)))
    took.handle(topic("n1", Channel.TELEMETRY), encode(sample(seq=51)))
    restarted = msgspec.structs.replace(
        birth(instance_id="i2"), started_at=sample().sampled_at + 1.0
    )
    for replica_ in pair:
        replica_.handle(topic("n1", Channel.STATUS), encode(will()))
        replica_.handle(topic("n1", Channel.STATUS), encode(restarted))

    for digest in took.digest.take(WALL_S):
        other.handle(DIGEST_TOPIC, digest)

    record = other.registry.get("n1")
    assert record is not None
    assert record.status.instance_id == "i2"
    assert other.stats.invalid_total == 0  # a stale copy, not an invalid one
    second = msgspec.structs.replace(
        sample(instance_id="i2", seq=1), sampled_at=restarted.started_at + 1.0
    )
    other.handle(topic("n1", Channel.TELEMETRY), encode(second))
    # Once the new agent's samples arrive the old one is no candidate either: a copy of
    # its samples still is only old news.
    other.handle(DIGEST_TOPIC, relayed_digest(("n1", "i1", 52, encode(sample(seq=52)))))
    assert other.stats.invalid_total == 0
    assert record.telemetry is not None
    assert record.telemetry.instance_id == "i2"


def test_a_relayed_digest_sent_outside_the_clock_skew_changes_nothing(
    pair: tuple[Ingestor, Ingestor],
) -> None:
    # Its samples were taken before it was sent: a digest from long ago (or a forged
    # date) says nothing of now.
    _, other = pair
    stale = relayed_digest(("n1", "i1", 1, encode(sample())), sent_at=WALL_S - 3600.0)
    other.handle(DIGEST_TOPIC, stale)
    assert other.stats.invalid == {(DIGEST_CHANNEL, InvalidReason.CLOCK_SKEW.value): 1}
    record = other.registry.get("n1")
    assert record is not None
    assert record.telemetry_seq is None


def test_a_digest_whose_index_does_not_cover_its_samples_is_decoded_whole(
    pair: tuple[Ingestor, Ingestor],
) -> None:
    _, other = pair
    payload = msgspec.json.encode(
        {
            "replica_id": "replica-x",
            "sent_at": WALL_S,
            "nodes": ["n2"],  # names n2, carries n1's sample and n2's
            "instances": ["i1"],
            "seqs": [1],
            "samples": [sample(seq=4), sample("n2", seq=2)],
        }
    )
    other.handle(DIGEST_TOPIC, payload)
    n1, n2 = other.registry.get("n1"), other.registry.get("n2")
    assert n1 is not None
    assert n2 is not None
    assert (n1.decoded_telemetry, n2.decoded_telemetry) == (sample(seq=4), sample("n2", seq=2))
    assert other.stats.ingested[DIGEST_CHANNEL] == 2


@pytest.mark.parametrize("wanted", [True, False])
def test_only_the_relayed_samples_a_listener_wants_now_are_decoded_for_it(
    pair: tuple[Ingestor, Ingestor], wanted: bool
) -> None:
    # Every replica that schedules has an accountant listening, which wants a sample
    # only while its replica leads, and only one it cannot hold for its next flush
    # (cloud/app.py): the rest stay encoded until read.
    taker, other = pair
    heard: list[Telemetry] = []
    asked: list[tuple[str, str]] = []

    def relayed_wanted(node_id: str, instance_id: str) -> bool:
        asked.append((node_id, instance_id))
        return wanted

    other.digest_listeners.append(heard.append)
    other.relayed_wanted = relayed_wanted
    other.handle(topic("n1", Channel.TELEMETRY), encode(sample(seq=1)))
    taker.handle(topic("n1", Channel.TELEMETRY), encode(sample(seq=2)))
    (digest,) = taker.digest.take(now_s=WALL_S)

    other.handle(DIGEST_TOPIC, digest)

    record = other.registry.get("n1")
    assert record is not None
    assert asked == [("n1", "i1")]
    assert [t.seq for t in heard] == ([2] if wanted else [])
    assert (record.relayed is None) == wanted
    assert record.telemetry is not None
    assert record.telemetry.seq == 2
    # A stale copy (heard already) reaches no listener.
    other.handle(DIGEST_TOPIC, digest.replace(b"replica-", b"replica-x", 1))
    assert [t.seq for t in heard] == ([2] if wanted else [])


def test_a_sample_relayed_while_an_older_one_is_being_read_is_kept(
    pair: tuple[Ingestor, Ingestor],
) -> None:
    # A /metrics scrape reads the figures in a thread while digests keep arriving: what
    # the read decodes must not drop, or be checked against, a newer relayed sample.
    _, other = pair
    other.handle(topic("n1", Channel.TELEMETRY), encode(sample(seq=1)))
    other.handle(DIGEST_TOPIC, relayed_digest(("n1", "i1", 2, encode(sample(seq=2)))))
    record = other.registry.get("n1")
    assert record is not None
    assert record.relayed is not None
    opener, payload, received_s, instance_id, seq = record.relayed

    def open_while_seq_3_arrives(*args: object) -> Telemetry | None:
        other.handle(DIGEST_TOPIC, relayed_digest(("n1", "i1", 3, encode(sample(seq=3)))))
        return opener(*args)  # type: ignore[arg-type]

    record.relayed = (open_while_seq_3_arrives, payload, received_s, instance_id, seq)
    first_read = record.telemetry
    assert first_read is not None
    assert first_read.seq == 1
    assert other.stats.invalid_total == 0  # nor counted against seq 3's index entry
    telemetry = record.telemetry
    assert telemetry is not None
    assert telemetry.seq == 3
