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

from typing import Annotated, Final

import msgspec

from shared.messages import ENCODER, SCHEMA_VERSION, SchemaVersion, Telemetry, WireStruct

# Samples in one digest message at most; a digest of more nodes is split.
MAX_DIGEST_SAMPLES: Final = 1024
# The envelope around the samples: what a digest may exceed `mqtt.max_payload_bytes` by.
DIGEST_ENVELOPE_BYTES: Final = 1024
# What the index adds to each sample at most beyond its node id and encoded instance id:
# quotes, commas and a sequence number.
_INDEX_ENTRY_BYTES: Final = 32

_IndexedId = Annotated[str, msgspec.Meta(max_length=256)]
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


DIGEST_DECODER: Final = msgspec.json.Decoder(TelemetryDigest)
RELAYED_DIGEST_DECODER: Final = msgspec.json.Decoder(RelayedDigest)


class DigestBuilder:
    """Gathers the latest sample this replica accepted of each node (a dictionary store
    per sample, with the bytes it came in) and cuts digests from them."""

    def __init__(self, replica_id: str, *, max_payload_bytes: int) -> None:
        self.replica_id = replica_id
        self._max_payload_bytes = max_payload_bytes
        self._latest: dict[str, tuple[Telemetry, bytes | None]] = {}
        self.published = 0  # digest messages
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

    def take(self, now_s: float) -> list[bytes]:
        """The digests of what was heard since the last call (none when nothing was),
        each at most `max_payload_bytes` beyond its envelope (a sample larger than that
        alone goes alone)."""
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
                messages.append(self._encode(chunk, now_s))
                chunk = _Chunk()
            chunk.add(node_id, instance_id, telemetry.seq, encoded, entry_bytes)
        messages.append(self._encode(chunk, now_s))
        self.published += len(messages)
        self.published_samples += len(latest)
        return messages

    def _encode(self, chunk: _Chunk, now_s: float) -> bytes:
        return ENCODER.encode(
            _OutgoingDigest(
                replica_id=self.replica_id,
                sent_at=now_s,
                nodes=chunk.nodes,
                instances=chunk.instances,
                seqs=chunk.seqs,
                samples=chunk.samples,
            )
        )


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
