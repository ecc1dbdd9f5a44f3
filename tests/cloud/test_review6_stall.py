"""Until when the other replicas have relayed their share of the telemetry (cloud/fleet/
digest.py `DigestPeers`), and liveness judging no further (cloud/fleet/liveness.py),
without a broker: heartbeats, goodbyes, a replica back from a stall, and replicas of an
earlier version that send no heartbeat (a mixed fleet behaves as before)."""

from __future__ import annotations

import math

from cloud.fleet.digest import RELAYED_DIGEST_DECODER, DigestBuilder, TelemetryDigest
from cloud.fleet.ingest import Ingestor
from cloud.fleet.liveness import Liveness, LivenessSettings
from cloud.fleet.registry import NodeRegistry
from shared.messages import encode
from shared.topics import Channel
from tests.cloud.test_ingest_unit import MAX_PAYLOAD_BYTES, TOPICS, FakeClock, birth, sample, topic

DIGEST_TOPIC = TOPICS.telemetry_digest
KEEPALIVE_S = 30.0
# n1 samples every 5 s: offline after 3 of its intervals of silence.
LIVENESS = LivenessSettings(staleness_intervals=3, liveness_check_interval_s=1.0)
DEADLINE_S = 15.0


class Leader:
    """A replica's ingestion and liveness on a fake clock, wired as cloud/app.py does."""

    def __init__(self, clock: FakeClock) -> None:
        registry = NodeRegistry(monotonic=clock.monotonic, wall_clock=clock.wall)
        self.ingestor = Ingestor(
            registry,
            TOPICS,
            max_payload_bytes=MAX_PAYLOAD_BYTES,
            shared_group="cloud",
            keepalive_s=KEEPALIVE_S,
        )
        self.liveness = Liveness(
            registry,
            LIVENESS,
            relayed_until_s=self.ingestor.digest_peers.relayed_until_s,
        )
        self.ingestor.handle(topic("n1", Channel.STATUS), encode(birth()))
        self.ingestor.handle(topic("n1", Channel.TELEMETRY), encode(sample(seq=1)))

    def offline(self) -> list[str]:
        return [change.node_id for change in self.liveness.expire_stale()]


class Peer:
    """Another replica's digests; `unproven_s`: how long ago its own link was proven."""

    def __init__(self, clock: FakeClock, replica_id: str = "replica-peer") -> None:
        self.clock = clock
        self.unproven_s = 0.0
        self.builder = DigestBuilder(
            replica_id, max_payload_bytes=MAX_PAYLOAD_BYTES, unproven_s=lambda: self.unproven_s
        )

    def heartbeat(self, leader: Leader, *, goodbye: bool = False) -> None:
        leader.ingestor.handle(
            DIGEST_TOPIC, self.builder.heartbeat(self.clock.wall(), goodbye=goodbye)
        )


def test_a_silent_peer_holds_judgement_until_it_relays_again() -> None:
    clock = FakeClock()
    leader, peer = Leader(clock), Peer(clock)
    peer.heartbeat(leader)
    clock.now_s += 2 * DEADLINE_S  # the peer stalls; n1's samples went to it
    assert leader.offline() == []
    # Back from the stall before it read its backlog: its link unproven since it stalled.
    peer.unproven_s = 2 * DEADLINE_S
    peer.heartbeat(leader)
    assert leader.offline() == []
    # It read the backlog, n1's latest sample in it: relayed.
    peer.builder.observe(sample(seq=2))
    peer.unproven_s = 0.5
    (digest,) = peer.builder.take(clock.wall())
    leader.ingestor.handle(DIGEST_TOPIC, digest)
    assert leader.offline() == []
    clock.now_s += DEADLINE_S + 1.0
    assert leader.offline() == []  # the peer relayed nothing since n1's sample
    peer.heartbeat(leader)
    assert leader.offline() == ["n1"]  # now n1 is silent on its own


def test_a_peer_that_says_goodbye_or_stays_silent_is_waited_for_no_more() -> None:
    clock = FakeClock()
    leader, leaving, frozen = Leader(clock), Peer(clock, "replica-a"), Peer(clock, "replica-b")
    leaving.heartbeat(leader)
    frozen.heartbeat(leader)
    assert len(leader.ingestor.digest_peers) == 2
    leaving.heartbeat(leader, goodbye=True)
    assert len(leader.ingestor.digest_peers) == 1
    clock.now_s += 2 * KEEPALIVE_S - 1.0
    assert leader.offline() == []  # the frozen peer may still hold n1's samples
    clock.now_s += 2.0  # the broker gave it up long ago
    assert leader.offline() == ["n1"]
    assert len(leader.ingestor.digest_peers) == 0


def test_a_replica_of_an_earlier_version_is_not_waited_for() -> None:
    """Its digests carry no heartbeat, and it sends none while it hears nothing."""
    clock = FakeClock()
    leader = Leader(clock)
    earlier = TelemetryDigest(replica_id="replica-old", sent_at=clock.wall(), samples=())
    leader.ingestor.handle(DIGEST_TOPIC, encode(earlier))
    assert len(leader.ingestor.digest_peers) == 0
    clock.now_s += DEADLINE_S + 1.0
    assert leader.offline() == ["n1"]


def test_only_the_last_message_of_a_split_digest_is_a_heartbeat() -> None:
    """A replica that read the first of several messages has not got the others' samples."""
    split = DigestBuilder("replica-small", max_payload_bytes=4096, unproven_s=lambda: 0.0)
    for index in range(40):
        split.observe(sample(f"n{index}", seq=1))
    decoded = [RELAYED_DIGEST_DECODER.decode(m) for m in split.take(FakeClock().wall())]
    assert len(decoded) > 1
    assert [d.heartbeat for d in decoded] == [False] * (len(decoded) - 1) + [True]


def test_a_replica_whose_link_was_never_proven_vouches_for_nothing() -> None:
    clock = FakeClock()
    leader = Leader(clock)
    never = Peer(clock)
    never.unproven_s = math.inf
    never.heartbeat(leader)
    assert len(leader.ingestor.digest_peers) == 0
