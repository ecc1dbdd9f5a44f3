"""What control-plane replicas that share nodes' telemetry tell each other.

With `mqtt.shared_group` set, every replica subscribes to `telemetry` through one MQTT
shared subscription, and the broker hands each sample to one of them: ingestion
capacity grows with the replicas (benchmarks/RESULTS.md, issue 28, ninth round). Every
replica still needs every node's latest figures (its `/v1/nodes`, liveness; the
leader's passes and usage metering), so each one publishes, every
`mqtt.digest_interval_s`, a *digest*: the latest sample it accepted itself of each node
heard since its previous digest, as the node sent it (not encoded again), indexed by
node, agent instance and sequence number, on `{root}/v1/cloud/telemetry-digest`. Every
replica subscribes to that topic (not shared) and merges the others' digests into its
registry (`Ingestor.handle_digest`).

A replica's digests are also what tells the others that its share of the telemetry has
reached them (`DigestPeers`): it sends one every interval even when it heard nothing (a
heartbeat), a last one when it stops cleanly, and its MQTT will says the same goodbye
when the broker gives it up. While a replica that was sending is silent (a GC pause, a
frozen VM, a half-open link: the broker keeps handing it its share until its keep-alive
runs out), the nodes of its share are silent to everyone else too, and that is no
evidence about them (cloud/fleet/liveness.py).

Merging costs a replica less than taking the samples itself, or the replicas would add
no capacity: each replica applies each sample's index entry to the registry and keeps
its bytes undecoded (`RelayedDigest`, `NodeRegistry.apply_relayed`) until its figures
are read (`NodeRecord.telemetry`), most of them never (a sample that would bring its
node online or hand it to another agent instance is decoded and checked at once); the
leader, which meters, reads them at its next usage flush, and decodes at once only those
it meters one by one (`Ingestor.relayed_wanted`). A digest without an index is decoded whole
(`TelemetryDigest`).

What each consumer of telemetry gets:

- the registry (last seen, the latest figures, liveness, `holds_node`): every node,
  at most one digest interval late for the samples another replica took;
- usage metering (cloud/usage/accountant.py, the leader only): every sample the
  leader took itself plus every digest's, metered past the node's mark (nodes with
  energy counters once per flush, from their latest sample), so a sample heard twice
  (directly and in a digest) counts once; samples coalesced in between are covered by
  the energy counters' differences, or the model where a node reports none
  (cloud/usage/meter.py);
- inference counters (cloud/fleet/inference_metrics.py, per-sample increments): only
  the samples a replica took itself, so each request is counted on exactly one
  replica's `/metrics` (sum them across replicas).

Trust: the digest topic is outside `nodes/`; only the control plane's account may
publish it (deploy/mosquitto/greenfed.acl; the dynamic-security role of
dynsec-bootstrap.sh writes `{root}/#`, node roles only their own subtree). A digest is
still checked as a node's sample is (size, schema, plausibility, the registry's instance
and sequence rules; an undecoded sample when it is read, against its index entry too): a
replica can relay only what a node could have said itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Annotated, Final

import msgspec

from cloud.fleet.plausibility import MAX_TEXT_CHARS
from shared.messages import ENCODER, SCHEMA_VERSION, SchemaVersion, Telemetry, WireStruct

# Samples in one digest message at most; a digest of more nodes is split.
MAX_DIGEST_SAMPLES: Final = 1024
# The envelope around the samples: every field but the samples and their index.
DIGEST_ENVELOPE_BYTES: Final = 1024
# What the index adds to each sample at most beyond its node id and encoded instance id:
# quotes, commas and a sequence number.
_INDEX_ENTRY_BYTES: Final = 32
# The wire's bounds on what a sample's index entry holds: a node id's characters never
# need escaping (shared.messages.NAME_PATTERN); an instance id's may (plausibility bounds
# only its length), and `\u001f` is the longest any character encodes to, longer than
# UTF-8's 4 bytes (no birth's instance id, and so no accepted sample's, holds a control
# character, but the bound does not have to rest on that); the sequence number's is
# shared.messages.Telemetry.seq's.
MAX_NODE_ID_CHARS: Final = 128
MAX_INSTANCE_ID_CHARS: Final = MAX_TEXT_CHARS
_MAX_ENCODED_CHAR_BYTES: Final = len(b"\\u001f")
MAX_SEQ: Final = 2**53
# The longest index entry a sample can have: what a digest relaying a sample as large as
# `mqtt.max_payload_bytes` on its own exceeds that by, beside its envelope.
MAX_INDEX_ENTRY_BYTES: Final = (
    MAX_NODE_ID_CHARS
    + _MAX_ENCODED_CHAR_BYTES * MAX_INSTANCE_ID_CHARS
    + len(str(MAX_SEQ))
    + _INDEX_ENTRY_BYTES
)
# Replicas whose heartbeats are tracked at most (a fleet runs a few): ids past these
# are not waited for, as an earlier version's are not.
MAX_DIGEST_PEERS: Final = 256


def max_digest_bytes(max_payload_bytes: int) -> int:
    """The largest digest message a replica sends (and so takes from another).

    `DigestBuilder.take` fills a message with samples and their index entries up to
    `max_payload_bytes`, but a sample as large as that (a node may send one) goes alone,
    and its index entry comes on top of it."""
    return max_payload_bytes + DIGEST_ENVELOPE_BYTES + MAX_INDEX_ENTRY_BYTES


_IndexedId = Annotated[str, msgspec.Meta(max_length=MAX_TEXT_CHARS)]
_Seq = Annotated[int, msgspec.Meta(ge=0)]


class _DigestIndex(WireStruct, frozen=True, kw_only=True):
    """What every digest carries beside its samples."""

    schema_version: SchemaVersion = SCHEMA_VERSION
    # The publishing process (its MQTT client id): a replica skips its own digests.
    replica_id: Annotated[str, msgspec.Meta(max_length=128)]
    sent_at: float
    nodes: Annotated[tuple[_IndexedId, ...], msgspec.Meta(max_length=MAX_DIGEST_SAMPLES)] = ()
    instances: Annotated[tuple[_IndexedId, ...], msgspec.Meta(max_length=MAX_DIGEST_SAMPLES)] = ()
    seqs: Annotated[tuple[_Seq, ...], msgspec.Meta(max_length=MAX_DIGEST_SAMPLES)] = ()
    # The last message of the replica's digest for an interval: everything it accepted
    # before `sent_at` has been relayed. A replica that sets it sends one every interval,
    # empty or not, so that its silence means something (`DigestPeers`); an earlier
    # version's never does, and is not waited for.
    heartbeat: bool = False
    # With `heartbeat`: how long before it was sent the replica's own link was last
    # proven (cloud/fleet/link_probe.py). What the broker handed it since may still wait
    # unread (a replica back from a stall sends a heartbeat before it read its backlog).
    unproven_s: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    # The replica takes no more telemetry (it stops, or the broker gave it up: its will).
    goodbye: bool = False


class TelemetryDigest(_DigestIndex, frozen=True, kw_only=True):
    """`{root}/v1/cloud/telemetry-digest` (QoS 0, not retained, control plane only).

    `samples` are nodes' samples as the replica received them; `nodes`, `instances` and
    `seqs` index them (entry i names sample i's node, agent instance and sequence
    number), so that a replica that does not meter can apply a digest without decoding
    its samples (`RelayedDigest`). A digest without an index (an earlier version's) is
    decoded whole."""

    samples: Annotated[tuple[Telemetry, ...], msgspec.Meta(max_length=MAX_DIGEST_SAMPLES)]


class RelayedDigest(_DigestIndex, frozen=True, kw_only=True):
    """`TelemetryDigest` read by its index: each sample left encoded (`msgspec.Raw`)."""

    samples: Annotated[tuple[msgspec.Raw, ...], msgspec.Meta(max_length=MAX_DIGEST_SAMPLES)]

    @property
    def indexed(self) -> bool:
        """Whether every sample has its index entry (else: decode the digest whole)."""
        count = len(self.samples)
        return len(self.nodes) == len(self.instances) == len(self.seqs) == count > 0


class _OutgoingDigest(WireStruct, frozen=True, kw_only=True):
    """`TelemetryDigest` as sent: samples already encoded, one by one, to split by size."""

    schema_version: SchemaVersion = SCHEMA_VERSION
    replica_id: str
    sent_at: float
    nodes: list[str]
    instances: list[str]
    seqs: list[int]
    samples: list[msgspec.Raw]
    heartbeat: bool
    unproven_s: float
    goodbye: bool


DIGEST_DECODER: Final = msgspec.json.Decoder(TelemetryDigest)
RELAYED_DIGEST_DECODER: Final = msgspec.json.Decoder(RelayedDigest)


class DigestBuilder:
    """Gathers the latest sample this replica accepted of each node (a dictionary store
    per sample, with the bytes it came in) and cuts digests from them."""

    def __init__(
        self,
        replica_id: str,
        *,
        max_payload_bytes: int,
        unproven_s: Callable[[], float] = lambda: 0.0,
    ) -> None:
        """`unproven_s`: how long ago this replica's link was last proven
        (`LinkProbe.unproven_s`); +inf: never, and its digests vouch for nothing."""
        self.replica_id = replica_id
        self._unproven_s = unproven_s
        self._max_payload_bytes = max_payload_bytes
        self._latest: dict[str, tuple[Telemetry, bytes | None]] = {}
        self.published = 0  # digest messages with samples (heartbeats not counted)
        self.published_samples = 0
        # How this replica's own digests begin, `{"schema_version":...,"replica_id":"...",`:
        # the broker hands them back to it, and telling them by these bytes spares
        # decoding a thousand samples only to read whose they are.
        empty = self._encode(_Chunk(), 0.0)
        self._own_prefix = empty[: empty.index(b'"sent_at"')]

    def observe(self, telemetry: Telemetry, payload: bytes | bytearray | None = None) -> None:
        """A sample accepted; `payload`: as it came from its node (relayed as it is),
        None: encoded again when a digest is cut."""
        if isinstance(payload, bytearray):
            payload = bytes(payload)  # the caller's buffer may be reused
        self._latest[telemetry.node_id] = (telemetry, payload)

    def is_own(self, payload: bytes | bytearray) -> bool:
        """Whether `payload` is a digest this builder made (its replica id, as encoded)."""
        return payload.startswith(self._own_prefix)

    def take(self, now_s: float, *, goodbye: bool = False) -> list[bytes]:
        """The digest of what was heard since the last call (none when nothing was: then
        send a `heartbeat`), in messages of at most `max_payload_bytes` beyond their
        envelope (a sample larger than that with its index entry goes alone: at most
        `max_digest_bytes`). `goodbye`: the last digest of this replica, which takes no
        more telemetry."""
        latest, self._latest = self._latest, {}
        if not latest:
            return []
        budget = self._max_payload_bytes
        messages: list[bytes] = []
        chunk = _Chunk()
        for node_id, (telemetry, payload) in latest.items():
            encoded = payload if payload is not None else ENCODER.encode(telemetry)
            instance_id = telemetry.instance_id
            # Encoded: an instance id's characters may take several bytes each.
            entry_bytes = (
                len(encoded) + len(node_id) + len(ENCODER.encode(instance_id)) + _INDEX_ENTRY_BYTES
            )
            if chunk.samples and (
                chunk.size + entry_bytes > budget or len(chunk.samples) >= MAX_DIGEST_SAMPLES
            ):
                messages.append(self._encode(chunk, now_s, heartbeat=False))
                chunk = _Chunk()
            chunk.add(node_id, instance_id, telemetry.seq, encoded, entry_bytes)
        self.published += len(messages) + 1
        self.published_samples += len(latest)
        # Only the last message proves the interval relayed: a replica that has read the
        # first of several has not yet got the samples of the others.
        if chunk.size <= budget:
            messages.append(self._encode(chunk, now_s, heartbeat=True, goodbye=goodbye))
            return messages
        # A sample over the budget went alone, in the one kind of message that can pass
        # `max_payload_bytes + DIGEST_ENVELOPE_BYTES` (what an earlier version takes at
        # most): the heartbeat (or goodbye) follows on its own, never refused with it.
        messages.append(self._encode(chunk, now_s))
        messages.append(self.heartbeat(now_s, goodbye=goodbye))
        return messages

    def heartbeat(self, now_s: float, *, goodbye: bool = False) -> bytes:
        """The digest of an interval in which nothing was heard: empty, but it proves
        this replica relayed its share. `goodbye`: it takes no more telemetry; also the
        MQTT will the broker publishes for it when it gives the connection up."""
        return self._encode(_Chunk(), now_s, heartbeat=True, goodbye=goodbye)

    def _encode(
        self, chunk: _Chunk, now_s: float, *, heartbeat: bool = False, goodbye: bool = False
    ) -> bytes:
        unproven_s = self._unproven_s() if heartbeat else 0.0
        if not math.isfinite(unproven_s):  # never proven: nothing to vouch for yet
            heartbeat, unproven_s = False, 0.0
        return ENCODER.encode(
            _OutgoingDigest(
                replica_id=self.replica_id,
                sent_at=now_s,
                nodes=chunk.nodes,
                instances=chunk.instances,
                seqs=chunk.seqs,
                samples=chunk.samples,
                heartbeat=heartbeat,
                unproven_s=max(unproven_s, 0.0),
                goodbye=goodbye,
            )
        )


class DigestPeers:
    """Until when the other replicas have relayed their share of the telemetry: when
    (local monotonic time) each one's latest heartbeat arrived, less how long its own
    link was unproven then (`unproven_s`).

    A replica is waited for once it sent a heartbeat, until it says goodbye or has
    relayed nothing for `quiet_limit_s` (twice `mqtt.keepalive_s`: by then the broker
    gave it up and hands its share to the others, even if its will was lost). Receive
    times, not `sent_at`: no replica's clock is trusted to judge another's silence."""

    def __init__(self, *, quiet_limit_s: float, monotonic: Callable[[], float]) -> None:
        if not quiet_limit_s > 0:
            raise ValueError("quiet_limit_s must be > 0")
        self.quiet_limit_s = quiet_limit_s
        self._monotonic = monotonic
        self._relayed_s: dict[str, float] = {}

    def heard(self, digest: RelayedDigest) -> None:
        """A digest of another replica (not this one's own) arrived."""
        replica_id = digest.replica_id
        if digest.goodbye:
            self._relayed_s.pop(replica_id, None)
            return
        known = self._relayed_s.get(replica_id)
        if not digest.heartbeat or (known is None and len(self._relayed_s) >= MAX_DIGEST_PEERS):
            return
        relayed_s = self._monotonic() - digest.unproven_s
        self._relayed_s[replica_id] = relayed_s if known is None else max(known, relayed_s)

    def relayed_until_s(self) -> float:
        """The earliest of the replicas waited for (+inf: none is): what the broker
        handed any of them before then has reached this replica."""
        oldest_s = self._monotonic() - self.quiet_limit_s
        gone = [replica for replica, at_s in self._relayed_s.items() if at_s < oldest_s]
        for replica_id in gone:
            del self._relayed_s[replica_id]
        return min(self._relayed_s.values(), default=math.inf)

    def __len__(self) -> int:
        return len(self._relayed_s)


class _Chunk:
    """One digest message being filled."""

    __slots__ = ("instances", "nodes", "samples", "seqs", "size")

    def __init__(self) -> None:
        self.nodes: list[str] = []
        self.instances: list[str] = []
        self.seqs: list[int] = []
        self.samples: list[msgspec.Raw] = []
        self.size = 0

    def add(self, node_id: str, instance_id: str, seq: int, encoded: bytes, size: int) -> None:
        self.nodes.append(node_id)
        self.instances.append(instance_id)
        self.seqs.append(seq)
        self.samples.append(msgspec.Raw(encoded))
        self.size += size
