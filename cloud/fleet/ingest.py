"""MQTT ingestion: node messages in, registry updates out.

Every message is checked in order: topic shape, size, JSON/schema, that the
node id in the payload is the one in the topic, plausibility (cloud/fleet/
plausibility.py: inventory, figures, timestamps, intervals, lengths), then registry
rules (known node, same agent instance, increasing and plausible sequence, room in
the registry). Each failure is counted under its reason, logged at most once per
interval per reason, and dropped; nothing one node sends can disturb another node's
ingestion.

A birth from another agent instance while the node's current instance holds it (cloud/
fleet/registry.py) is not applied: it is kept as a candidate and counted as
`instance_conflict`. An empty retained `status` (the topic cleared) removes no node:
anyone who can write the topic can send one, and a node leaves the registry only when
an admin revokes it; it is counted as `status_cleared` and the node's agent, which
watches its own status, announces itself again.

A birth's sealing key (what job secrets are sealed to) that is not a key, or not the
one the node was pinned to at enrolment, is dropped from the birth, which is kept:
counted and logged the same way, and the node receives no secrets until a birth
announces its enrolled key (cloud/fleet/plausibility.py `sealing_key_refusal`).

The free text of births, reports and events (reasons, providers, accelerator models,
taints, notes) has its control characters replaced as it is applied (cloud/fleet/
node_text.py): a NUL would fail every store write of a reason, an escape sequence would
reach a terminal. Telemetry holds none and is not looked at.

A birth of a node id that is not enrolled is counted as `not_enrolled` and dropped;
one that proves the enrolment certificate it shows is remembered for an admin to
re-admit (cloud/fleet/unenrolled.py). So is every message of a node id that is a broker
account of another kind (`non_node_accounts_of`: the control plane's own MQTT username,
the telemetry reader deploy/mosquitto/greenfed.acl once named), enrolled or not: an ACL
file gives every account a node's rights under its own name.

Who may say what about work (with an `AssignmentIndex`, cloud/fleet/assignments.py):
a log chunk is kept only if its node runs that attempt of the job (held a few seconds
when the index does not know it yet, then dropped as `not_assigned` or
`wrong_attempt`); a `reported` entry about work not assigned to its node is held and
counted the same way (the report itself is kept: the scheduling loop reads only entries
of the node's own allocations, cloud/loop/reports.py), and one that goes backwards
within an agent instance (`illegal_transition`) is replaced by what that instance said
before.

Replicas that share telemetry (`mqtt.shared_group`, cloud/fleet/digest.py) each take
a share of the samples through one shared subscription and merge the others' digests
(`handle_digest`), checked like the samples themselves (a replica that does not meter
checks each sample's index entry at once and the sample when it is read,
`_open_relayed`); births, reports, events and logs stay unshared: every replica needs
them, and they are few. Each replica's digests also say until when its share has been
relayed (`digest_peers`; heartbeats, a goodbye on a clean stop and as its will), so that
liveness does not take a stalled replica's share for the nodes' own silence.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from enum import StrEnum
from typing import Any

import aiomqtt
import msgspec
import structlog

from cloud.fleet.assignments import (
    Assignment,
    AssignmentIndex,
    AssignmentKey,
    HeldForConfirmation,
)
from cloud.fleet.digest import (
    DIGEST_DECODER,
    RELAYED_DIGEST_DECODER,
    DigestBuilder,
    DigestPeers,
    RelayedDigest,
    TelemetryDigest,
    max_digest_bytes,
)
from cloud.fleet.early_samples import EarlySamples
from cloud.fleet.link_probe import LinkProbe
from cloud.fleet.node_text import printable_event, printable_reported, printable_status
from cloud.fleet.plausibility import (
    Implausible,
    PlausibilityLimits,
    SealingKeyRefusal,
    Violation,
    check_event,
    check_log_chunk,
    check_recent,
    check_reported,
    check_status,
    check_telemetry,
    sealing_key_refusal,
    without_illegal_transitions,
)
from cloud.fleet.registry import NodeRegistry, NodeStateChange, Rejection
from shared.errors import MSGSPEC_DECODE_ERRORS
from shared.logs import RateLimitedLog
from shared.messages import (
    EVENT_DECODER,
    LOG_DECODER,
    REPORTED_DECODER,
    STATUS_DECODER,
    TELEMETRY_DECODER,
    JobLogChunk,
    NodeEvent,
    NodeStatus,
    ReportedState,
    Telemetry,
)
from shared.mqtt import MqttSession
from shared.settings import MqttSettings
from shared.tasks import cancel_and_wait
from shared.topics import CHANNEL_SPECS, Channel, NodeTopic, TopicError, Topics

# Topics parsed lately, kept to skip parsing (a node has five): cleared when full.
MAX_PARSED_TOPICS = 65_536

# How many `reported` entries the index does not know may wait for its next update (a
# replica that does not lead learns of new placements from the store every 2 s), apart
# from the log chunks' budget: a report names all of its node's work, many times more
# entries than a node has log streams. Past these, an entry is judged at once.
MAX_HELD_REPORTED_PER_NODE = 256
MAX_HELD_REPORTED = 16_384

# How digests' samples are counted (`IngestStats`, /metrics' `channel` label).
DIGEST_CHANNEL = "digest"
# How long a replica that stops may spend on its last digest: less than an owner waits
# before cancelling it again (shared.tasks.RECANCEL_INTERVAL_S).
GOODBYE_TIMEOUT_S = 1.0

# The telemetry reader's account that deploy/mosquitto/greenfed.acl named, in the agents'
# password file, until readers had a listener of their own: Mosquitto applies an ACL
# file's `pattern` lines to every account, so a broker set up so lets it publish as the
# node of that name.
SHIPPED_READER_USERNAME = "greenfed-reader"

IngestedMessage = NodeStatus | Telemetry | ReportedState | NodeEvent | JobLogChunk

# Status first, so that retained births are known before the first telemetry.
DECODERS: dict[Channel, msgspec.json.Decoder[IngestedMessage]] = {
    Channel.STATUS: STATUS_DECODER,  # type: ignore[dict-item]
    Channel.TELEMETRY: TELEMETRY_DECODER,  # type: ignore[dict-item]
    Channel.REPORTED: REPORTED_DECODER,  # type: ignore[dict-item]
    Channel.EVENTS: EVENT_DECODER,  # type: ignore[dict-item]
    Channel.LOGS: LOG_DECODER,  # type: ignore[dict-item]
}


class InvalidReason(StrEnum):
    BAD_TOPIC = "bad_topic"
    OVERSIZED = "oversized"
    MALFORMED_JSON = "malformed_json"
    SCHEMA_VIOLATION = "schema_violation"
    NODE_ID_MISMATCH = "node_id_mismatch"
    UNKNOWN_NODE = Rejection.UNKNOWN_NODE.value
    INSTANCE_MISMATCH = Rejection.INSTANCE_MISMATCH.value
    OUT_OF_ORDER = Rejection.OUT_OF_ORDER.value
    SEQ_JUMP = Rejection.SEQ_JUMP.value
    REGISTRY_FULL = Rejection.REGISTRY_FULL.value
    # The birth of another agent instance while the current one holds the node.
    INSTANCE_CONFLICT = Rejection.INSTANCE_CONFLICT.value
    # An empty retained status of a known node: no node leaves the registry that way.
    STATUS_CLEARED = "status_cleared"
    IMPLAUSIBLE_INVENTORY = Implausible.INVENTORY.value
    IMPLAUSIBLE_SAMPLE = Implausible.SAMPLE.value
    CLOCK_SKEW = Implausible.CLOCK_SKEW.value
    BAD_INTERVAL = Implausible.BAD_INTERVAL.value
    FIELD_TOO_LONG = Implausible.FIELD_TOO_LONG.value
    INVALID_NAME = Implausible.INVALID_NAME.value
    # Log chunks and `reported` entries about work their node does not run.
    NOT_ASSIGNED = Assignment.NOT_ASSIGNED.value
    WRONG_ATTEMPT = Assignment.WRONG_ATTEMPT.value
    # A `reported` entry going backwards (e.g. succeeded -> running) within one instance.
    ILLEGAL_TRANSITION = "illegal_transition"
    # A node id that is not enrolled (cloud.require_enrolment), was revoked, or is a
    # broker account of another kind (`non_node_accounts_of`).
    NOT_ENROLLED = "not_enrolled"
    # A relayed sample that is not the node, instance or sequence number its digest's
    # index names for it (cloud/fleet/digest.py).
    INDEX_MISMATCH = "index_mismatch"
    # A birth kept without its sealing key: not a key, or not the one pinned at enrolment.
    SEALING_KEY_INVALID = SealingKeyRefusal.INVALID.value
    SEALING_KEY_MISMATCH = SealingKeyRefusal.MISMATCH.value


def _nothing() -> None:
    """An entry the index confirms: the report was applied already."""


def non_node_accounts_of(control_plane_username: str | None) -> frozenset[str]:
    """Broker accounts of another kind, whose names are never a node's id: the control
    plane's own MQTT username and the reader deploy/mosquitto once shipped."""
    names = {SHIPPED_READER_USERNAME}
    if control_plane_username:
        names.add(control_plane_username)
    return frozenset(names)


class IngestStats:
    """Plain counters on the hot path; exported to Prometheus by a collector."""

    def __init__(self) -> None:
        self.ingested: Counter[str] = Counter()
        self.invalid: Counter[tuple[str, str]] = Counter()
        # Messages whose handling raised: a bug, never a client's fault (the fuzz test
        # asserts it stays 0).
        self.failures = 0
        # Samples in other replicas' digests that this one had already heard, or newer.
        self.digest_stale = 0

    @property
    def invalid_total(self) -> int:
        return sum(self.invalid.values())


class Ingestor:
    def __init__(
        self,
        registry: NodeRegistry,
        topics: Topics,
        *,
        max_payload_bytes: int,
        invalid_log_interval_s: float = 10.0,
        on_state_change: Callable[[NodeStateChange], None] | None = None,
        on_event: Callable[[NodeEvent], None] | None = None,
        on_log: Callable[[JobLogChunk], None] | None = None,
        limits: PlausibilityLimits | None = None,
        assignments: AssignmentIndex | None = None,
        shared_group: str = "",
        digest_interval_s: float = 1.0,
        keepalive_s: float = MqttSettings().keepalive_s,
        link_probe_interval_s: float = 1.0,
        non_node_accounts: Iterable[str] = (),
    ) -> None:
        """`limits`: plausibility bounds (`PlausibilityLimits.of(settings.cloud)`);
        timestamps are judged by the registry's wall clock. `assignments`: who runs
        what, to gate log chunks and audit reports; None trusts every node about any
        work (tests of ingestion alone). `shared_group` (`mqtt.shared_group`): take
        telemetry through this shared subscription and exchange digests every
        `digest_interval_s` (cloud/fleet/digest.py); "": every sample, no digests.
        `keepalive_s` (`mqtt.keepalive_s`, every replica's): a replica whose digests
        stopped for twice this is no longer waited for (`digest_peers`).
        `link_probe_interval_s`: how often the session proves its link (`link_probe`).
        `non_node_accounts`: broker accounts of another kind, whose messages as a node
        are all dropped, as not admitted (`non_node_accounts_of` names them)."""
        self.registry = registry
        self.topics = topics
        self.stats = IngestStats()
        self._max_payload_bytes = max_payload_bytes
        self._log = structlog.get_logger("greenfed.ingest")
        self._invalid_log = RateLimitedLog(self._log, invalid_log_interval_s)
        self._on_state_change = on_state_change
        self._on_event = on_event
        self._on_log = on_log
        self._limits = limits or PlausibilityLimits()
        self.assignments = assignments
        self._held = HeldForConfirmation(assignments) if assignments is not None else None
        self._held_reported = (
            HeldForConfirmation(
                assignments,
                max_per_node=MAX_HELD_REPORTED_PER_NODE,
                max_total=MAX_HELD_REPORTED,
            )
            if assignments is not None
            else None
        )
        self._early = EarlySamples(monotonic=registry.monotonic)
        # Called (with nothing) whenever a node's state changed or it reported: the
        # scheduling loop's trigger. Must be quick and must not raise.
        self.change_listeners: list[Callable[[], None]] = []
        # Called with every telemetry sample the registry accepted from the broker
        # (accounting, serving counters, the digest). On the hot path: must be quick and
        # must not raise.
        self.telemetry_listeners: list[Callable[[Telemetry], None]] = []
        # Called with the samples of other replicas' digests the registry accepted that
        # `relayed_wanted` wants (accounting: the leader meters every node). Must be
        # quick and must not raise.
        self.digest_listeners: list[Callable[[Telemetry], None]] = []
        # Told of each relayed sample applied by its digest's index, (node id, agent
        # instance): True to have it decoded and handed to the digest listeners now;
        # False leaves it encoded until read (`NodeRecord.telemetry`), as every sample
        # is where no listener asks (the accountant: only while it leads, and only
        # samples it cannot hold for its next flush). None: every sample, if listened to.
        self.relayed_wanted: Callable[[str, str], bool] | None = None
        self.shared_group = shared_group
        self._parsed: dict[str, NodeTopic] = {}
        self._digest_interval_s = digest_interval_s
        self._digest_topic = topics.telemetry_digest
        # Whether, and until when, this session is known to hear the broker: liveness
        # judges silence by it (cloud/fleet/link_probe.py).
        self.link_probe = LinkProbe(
            topics, interval_s=link_probe_interval_s, monotonic=registry.monotonic
        )
        # What this replica heard, for the others (only while sharing), and how far its
        # link is proven: they judge silence no further (`digest_peers`).
        self.digest = DigestBuilder(
            f"replica-{uuid.uuid4().hex}",
            max_payload_bytes=max_payload_bytes,
            unproven_s=self.link_probe.unproven_s,
        )
        # Until when the other replicas have relayed their share: liveness judges silence
        # only that far (cloud/fleet/liveness.py).
        self.digest_peers = DigestPeers(quiet_limit_s=2 * keepalive_s, monotonic=registry.monotonic)
        # Set while subscribed to every channel: the cloud's readiness.
        self.subscribed = asyncio.Event()
        # Which node ids may be ingested at all (cloud/fleet/enrolled.py); None: all but
        # `non_node_accounts`, which never are.
        self.admits_node: Callable[[str], bool] | None = None
        self.non_node_accounts = frozenset(non_node_accounts)
        # The sealing key a node was pinned to at enrolment (cloud/fleet/enrolled.py);
        # None (here or from it): trust the key its birth announces.
        self.pinned_sealing_key: Callable[[str], str | None] | None = None
        # Hears (well-formed, plausible) births of node ids not admitted, with their raw
        # payload: those that prove an enrolment certificate (cloud/fleet/unenrolled.py).
        self.unenrolled_birth: Callable[[NodeStatus, bytes], None] | None = None
        # Hears the raw `reported` documents of node ids not admitted (the same table).
        self.unenrolled_report: Callable[[str, bytes], None] | None = None

    def _reject(self, channel: str, reason: InvalidReason, topic: str, error: str = "") -> None:
        self.stats.invalid[(channel, reason.value)] += 1
        self._invalid_log.warning(
            f"{channel}/{reason.value}",
            "mqtt payload dropped",
            reason=reason.value,
            topic=topic,
            error=error[:300],
        )

    def _changed(self, change: NodeStateChange | None) -> None:
        if change is None:
            return
        self._log.info(
            "node state", node_id=change.node_id, state=change.state, reason=change.reason
        )
        if self._on_state_change is not None:
            self._on_state_change(change)
        self.notify_change()

    def notify_change(self) -> None:
        for listener in self.change_listeners:
            listener()

    def handle(self, topic: str, payload: bytes | bytearray) -> None:
        """Decode and apply one message. Never raises for anything a client can send."""
        parsed = self._parsed.get(topic)
        if parsed is None:
            parsed = self._parse(topic, payload)
            if parsed is None:
                return
        channel = parsed.channel
        if len(payload) > self._max_payload_bytes:
            self._reject(
                channel,
                InvalidReason.OVERSIZED,
                topic,
                f"{len(payload)} bytes > {self._max_payload_bytes}",
            )
            return
        if channel in DECODERS and parsed.node_id in self.non_node_accounts:
            # Broker accounts of another kind: whatever the broker let one of them say as
            # a node (an ACL file's `pattern` lines), it is never one, nor re-admitted.
            self._reject(
                channel,
                InvalidReason.NOT_ENROLLED,
                topic,
                f"{parsed.node_id} (not a node's account)",
            )
            return
        if (
            self.admits_node is not None
            and channel in DECODERS
            and not self.admits_node(parsed.node_id)
        ):
            self._reject(channel, InvalidReason.NOT_ENROLLED, topic, parsed.node_id)
            offer = self.unenrolled_birth
            if channel is Channel.STATUS and payload and offer is not None:
                self._offer_unenrolled(offer, parsed.node_id, payload)
            note = self.unenrolled_report
            if channel is Channel.REPORTED and payload and note is not None:
                note(parsed.node_id, bytes(payload))
            return
        if not payload:
            # An empty retained message clears the topic. For status, it says nothing of
            # the node: only an admin's revoke removes one (POST /v1/nodes/{id}/revoke).
            if channel is Channel.STATUS and self.registry.get(parsed.node_id) is not None:
                self._reject(channel, InvalidReason.STATUS_CLEARED, topic, "node kept")
            return
        decoder = DECODERS.get(channel)
        if decoder is None:
            return  # desired is the cloud's own output, not ingested
        message = self._decode(decoder, channel, topic, payload)
        if message is None:
            return
        if message.node_id != parsed.node_id:
            self._reject(
                channel,
                InvalidReason.NODE_ID_MISMATCH,
                topic,
                f"payload node_id {message.node_id!r}",
            )
            return
        if isinstance(message, Telemetry):  # most of the traffic: its own path
            self._take_telemetry(
                message, Channel.TELEMETRY, topic, self.telemetry_listeners, payload
            )
            return
        violation = self._implausible(message)
        if violation is not None:
            self._reject(channel, InvalidReason(violation.reason.value), topic, str(violation))
            return
        self._apply(channel, message, topic)

    def _decode(
        self,
        decoder: msgspec.json.Decoder[Any],
        channel: str,
        topic: str,
        payload: bytes | bytearray,
    ) -> Any:
        """The payload decoded, or None (counted)."""
        try:
            return decoder.decode(payload)
        except msgspec.ValidationError as error:
            self._reject(channel, InvalidReason.SCHEMA_VIOLATION, topic, str(error))
        except MSGSPEC_DECODE_ERRORS as error:  # too deep ('{"x":' + '[' * 3000) included
            self._reject(channel, InvalidReason.MALFORMED_JSON, topic, str(error))
        return None

    def _take_telemetry(
        self,
        telemetry: Telemetry,
        channel: str,
        topic: str,
        listeners: list[Callable[[Telemetry], None]],
        payload: bytes | bytearray | None = None,
    ) -> Rejection | None:
        """Check a sample (from its node, or a replica's digest) and apply it; the
        registry's refusal, which is counted unless it is `OUT_OF_ORDER` from a digest.
        `payload`: the sample as its node sent it, relayed so in this replica's digest."""
        if not self._plausible_sample(telemetry, channel, topic, self.registry.wall_clock()):
            return None
        outcome = self.registry.apply_telemetry(telemetry)
        if isinstance(outcome, Rejection):
            if outcome is Rejection.OUT_OF_ORDER and channel == DIGEST_CHANNEL:
                return outcome  # replicas hear a node's samples in turns: not invalid
            if outcome is Rejection.UNKNOWN_NODE and channel == Channel.TELEMETRY:
                # Maybe ahead of its birth: held for it (cloud/fleet/early_samples.py).
                for sample, held_topic in self._early.hold(telemetry, topic):
                    self._reject(channel, InvalidReason.UNKNOWN_NODE, held_topic, self._why(sample))
                return outcome
            self._reject(channel, InvalidReason(outcome.value), topic, self._why(telemetry))
            return outcome
        self.stats.ingested[channel] += 1
        for listener in listeners:
            listener(telemetry)
        if self.shared_group and channel != DIGEST_CHANNEL:
            self.digest.observe(telemetry, payload)
        if outcome is not None:
            self._changed(outcome)
        return None

    def _parse(self, topic: str, payload: bytes | bytearray) -> NodeTopic | None:
        """A topic not seen lately: a node's (then remembered), the digest's (then
        merged), the link probe's (then taken as its echo), or none of these (counted)."""
        try:
            parsed = self.topics.parse(topic)
        except TopicError as error:
            if topic == self._digest_topic and self.shared_group:
                self.handle_digest(payload)
                return None
            if topic == self.link_probe.topic:
                self.link_probe.echoed(payload)
                return None
            self._reject("unknown", InvalidReason.BAD_TOPIC, topic, str(error))
            return None
        if len(self._parsed) >= MAX_PARSED_TOPICS:
            self._parsed.clear()  # bounded whatever topics clients make up
        self._parsed[topic] = parsed
        return parsed

    def handle_digest(self, payload: bytes | bytearray) -> None:
        """Merge another replica's digest: each sample checked as if its node had sent
        it here (enrolment, plausibility, the registry's instance and sequence rules).
        A sample no newer than what this replica has is skipped, not counted invalid:
        replicas hear the same node's samples in turns.

        Each sample is applied by its index entry and left encoded until its figures
        are read (`NodeRecord.telemetry`), checked then; the digest listeners get those
        `relayed_wanted` asks for, decoded at once."""
        channel, topic = DIGEST_CHANNEL, self._digest_topic
        if len(payload) > max_digest_bytes(self._max_payload_bytes):
            self._reject(channel, InvalidReason.OVERSIZED, topic, f"{len(payload)} bytes")
            return
        if self.digest.is_own(payload):
            return  # our own, back from the broker: known by its first bytes, not decoded
        relayed: RelayedDigest | None = self._decode(
            RELAYED_DIGEST_DECODER, channel, topic, payload
        )
        if relayed is None or relayed.replica_id == self.digest.replica_id:
            return
        self.digest_peers.heard(relayed)
        if relayed.indexed:
            self._merge_relayed(relayed)
            return
        if not relayed.samples:
            return
        # No index (an earlier version's digest), or one that does not cover every
        # sample: decoded whole.
        digest: TelemetryDigest | None = self._decode(DIGEST_DECODER, channel, topic, payload)
        if digest is None:
            return
        if digest.replica_id == self.digest.replica_id:
            return  # our own, back from the broker
        for telemetry in digest.samples:
            if self.admits_node is not None and not self.admits_node(telemetry.node_id):
                self._reject(channel, InvalidReason.NOT_ENROLLED, topic, telemetry.node_id)
                continue
            refusal = self._take_telemetry(telemetry, channel, topic, self.digest_listeners)
            if refusal is Rejection.OUT_OF_ORDER:
                self.stats.digest_stale += 1

    def _merge_relayed(self, digest: RelayedDigest) -> None:
        """Apply a digest by its index: the registry's rules now, each sample's own checks
        when it is read (`_open_relayed`)."""
        channel, topic = DIGEST_CHANNEL, self._digest_topic
        now = (self.registry.monotonic(), self.registry.wall_clock())
        now_s = now[1]
        # Its samples were each taken no later than it was sent: none is recent if it is not.
        violation = check_recent("$.sent_at", digest.sent_at, self._limits, now_s)
        if violation is not None:
            self._reject(channel, InvalidReason(violation.reason.value), topic, str(violation))
            return
        entries: Iterable[tuple[str, str, int, msgspec.Raw]] = zip(
            digest.nodes, digest.instances, digest.seqs, digest.samples, strict=True
        )
        if self.admits_node is not None:
            entries = [entry for entry in entries if self._relayed_admitted(entry[0])]
        listeners = self.digest_listeners
        applied: list[tuple[str, str, int]] | None = [] if listeners else None
        merged = self.registry.apply_relayed(entries, self._open_relayed, now, applied)
        for node_id, outcome in merged.outcomes:
            if isinstance(outcome, Rejection):
                self._reject(channel, InvalidReason(outcome.value), topic, node_id)
            else:
                self._changed(outcome)
        self.stats.ingested[channel] += merged.applied
        self.stats.digest_stale += merged.stale
        if applied:
            self._hand_relayed(applied, listeners)

    def _hand_relayed(
        self, applied: list[tuple[str, str, int]], listeners: list[Callable[[Telemetry], None]]
    ) -> None:
        """The digest listeners get the samples just applied that `relayed_wanted` asks
        for, decoded and checked (`NodeRecord.telemetry`)."""
        wanted = self.relayed_wanted
        records = self.registry.get
        for node_id, instance_id, seq in applied:
            if wanted is not None and not wanted(node_id, instance_id):
                continue
            record = records(node_id)
            if record is None or record.telemetry_seq != seq:
                continue  # a later one of the same digest, or refused
            telemetry = record.telemetry
            if telemetry is None or telemetry.seq != seq or telemetry.instance_id != instance_id:
                continue  # refused when decoded (counted)
            for listener in listeners:
                listener(telemetry)

    def _relayed_admitted(self, node_id: str) -> bool:
        """Whether a relayed sample's node may be ingested (counted where not)."""
        assert self.admits_node is not None
        if self.admits_node(node_id):
            return True
        self._reject(DIGEST_CHANNEL, InvalidReason.NOT_ENROLLED, self._digest_topic, node_id)
        return False

    def _open_relayed(
        self, node_id: str, raw: bytes, received_s: float, instance_id: str, seq: int
    ) -> Telemetry | None:
        """A relayed sample decoded and checked as its node's own would have been when
        its digest arrived (`received_s`), and as what its index entry said it is (node,
        agent instance, sequence number); None (counted) if it is not."""
        channel, topic = DIGEST_CHANNEL, self._digest_topic
        telemetry: Telemetry | None = self._decode(TELEMETRY_DECODER, channel, topic, raw)
        if telemetry is None:
            return None
        if (telemetry.node_id, telemetry.instance_id, telemetry.seq) != (
            node_id,
            instance_id,
            seq,
        ):
            indexed = f"indexed as {node_id!r} {instance_id[:64]!r} {seq}"
            self._reject(channel, InvalidReason.INDEX_MISMATCH, topic, indexed)
            return None
        return telemetry if self._plausible_sample(telemetry, channel, topic, received_s) else None

    def _plausible_sample(
        self, telemetry: Telemetry, channel: str, topic: str, now_s: float
    ) -> bool:
        """Whether a sample could be real at `now_s` (counted where it could not)."""
        violation = check_telemetry(telemetry, self._limits, now_s)
        if violation is not None:
            self._reject(channel, InvalidReason(violation.reason.value), topic, str(violation))
        return violation is None

    def _offer_unenrolled(
        self, offer: Callable[[NodeStatus, bytes], None], node_id: str, payload: bytes | bytearray
    ) -> None:
        """A refused birth, offered for re-admission if it is a birth at all (already
        counted as `not_enrolled`: nothing more is counted here)."""
        try:
            status = STATUS_DECODER.decode(payload)
        except MSGSPEC_DECODE_ERRORS:  # ValidationError and nesting too deep included
            return
        if status.node_id == node_id and self._implausible(status) is None:
            offer(printable_status(status), bytes(payload))

    def _implausible(self, message: IngestedMessage) -> Violation | None:
        now_s = self.registry.wall_clock()
        if isinstance(message, Telemetry):
            return check_telemetry(message, self._limits, now_s)
        if isinstance(message, NodeStatus):
            return check_status(message, self._limits, now_s)
        if isinstance(message, ReportedState):
            return check_reported(message, self._limits, now_s)
        if isinstance(message, JobLogChunk):
            return check_log_chunk(message, self._limits, now_s)
        return check_event(message, self._limits, now_s)

    def _trusted_key(self, status: NodeStatus, topic: str) -> NodeStatus:
        """The birth as the registry keeps it: its sealing key dropped unless trusted."""
        announced = status.sealing_public_key
        if announced is None:
            return status
        pinned = self.pinned_sealing_key(status.node_id) if self.pinned_sealing_key else None
        refusal = sealing_key_refusal(announced, pinned)
        if refusal is None:
            return status
        reason = InvalidReason(refusal.value)
        self.stats.invalid[(Channel.STATUS.value, reason.value)] += 1
        self._invalid_log.warning(
            f"{Channel.STATUS.value}/{reason.value}",
            "sealing key dropped from a birth: the node receives no secrets",
            reason=reason.value,
            topic=topic,
        )
        return msgspec.structs.replace(status, sealing_public_key=None)

    def _reported(self, reported: ReportedState, topic: str) -> Rejection | None:
        """Apply a report with backward transitions undone; count what it says of work
        its node does not run."""
        record = self.registry.get(reported.node_id)
        previous = record.reported if record is not None else None
        assignments, node_id = self.assignments, reported.node_id
        reported, undone = without_illegal_transitions(
            previous,
            reported,
            lambda job_id, attempt: (
                assignments is None
                or assignments.assignment(("training", node_id, job_id, attempt))
                is Assignment.ASSIGNED
            ),
        )
        outcome = self.registry.apply_reported(reported)
        if outcome is not None:
            return outcome
        for entry in undone:
            self._reject(Channel.REPORTED, InvalidReason.ILLEGAL_TRANSITION, topic, entry)
        self._audit_reported(reported, topic)
        return None

    def _audit_reported(self, reported: ReportedState, topic: str) -> None:
        """Count the entries about work not assigned to the node. Only counted (the
        scheduling loop acts on nothing but allocated entries), and only once the index
        has been updated since: work the leader placed a moment ago is not yet in the
        index of a replica that does not lead."""
        index, held = self.assignments, self._held_reported
        if index is None or held is None:
            return
        node_id = reported.node_id
        keys: list[AssignmentKey] = [
            ("training", node_id, t.job_id, t.attempt) for t in reported.training
        ]
        keys += [("replica", node_id, d.deployment_id, d.replica) for d in reported.deployments]
        for key in keys:
            if index.assignment(key) is not Assignment.ASSIGNED:
                held.offer(key, confirmed=_nothing, refused=self._counter_of_reported(key, topic))

    def _counter_of_reported(self, key: AssignmentKey, topic: str) -> Callable[[Assignment], None]:
        """What counts a `reported` entry found not assigned."""
        kind, _, work_id, number = key
        what = f"{work_id} {'attempt' if kind == 'training' else 'replica'} {number}"
        return lambda verdict: self._reject(
            Channel.REPORTED, InvalidReason(verdict.value), topic, what
        )

    def _log_chunk(self, chunk: JobLogChunk, topic: str) -> None:
        """Keep a chunk only from a node that runs that attempt of the job (counted as
        ingested once kept)."""
        if self._held is None:
            self._keep_log(chunk)
            return
        self._held.offer(
            ("training", chunk.node_id, chunk.job_id, chunk.attempt),
            confirmed=lambda: self._keep_log(chunk),
            refused=lambda verdict: self._reject(
                Channel.LOGS,
                InvalidReason(verdict.value),
                topic,
                f"{chunk.job_id} attempt {chunk.attempt}",
            ),
        )

    def _keep_log(self, chunk: JobLogChunk) -> None:
        self.stats.ingested[Channel.LOGS] += 1
        if self._on_log is not None:
            self._on_log(chunk)

    def _apply(
        self,
        channel: Channel,
        message: NodeStatus | ReportedState | NodeEvent | JobLogChunk,
        topic: str,
    ) -> None:
        """Everything but telemetry (`_take_telemetry`)."""
        outcome: Rejection | NodeStateChange | None = None
        if isinstance(message, NodeStatus):
            message = printable_status(message)
            outcome = self.registry.apply_status(self._trusted_key(message, topic))
        elif isinstance(message, ReportedState):
            outcome = self._reported(printable_reported(message), topic)
            if outcome is None:
                self.notify_change()
        elif isinstance(message, JobLogChunk):
            self._log_chunk(message, topic)
            return
        elif self._on_event is not None:
            self._on_event(printable_event(message))
        if isinstance(outcome, Rejection):
            self._reject(channel, InvalidReason(outcome.value), topic, self._why(message))
            return
        self.stats.ingested[channel] += 1
        self._changed(outcome)
        if isinstance(message, NodeStatus) and len(self._early):
            early = self._early.take(message.node_id)
            if early is not None:  # a sample that came before this birth
                self._take_telemetry(
                    early[0], Channel.TELEMETRY, early[1], self.telemetry_listeners
                )

    def _why(self, message: IngestedMessage) -> str:
        """What a log line says of a message the registry refused: whose instance."""
        if not isinstance(message, NodeStatus | Telemetry | ReportedState):
            return ""
        current = self.registry.current_instance(message.node_id)
        return f"instance {message.instance_id[:64]!r}, current {str(current)[:64]!r}"

    def session(self, settings: MqttSettings, client_id: str) -> MqttSession:
        """An MQTT session that delivers every message straight to `handle_message`;
        while sharing telemetry, its will is this replica's goodbye digest: the broker
        says it when it gives the connection up, and stops handing it telemetry."""
        will = (
            aiomqtt.Will(self._digest_topic, self.digest.heartbeat(time.time(), goodbye=True))
            if self.shared_group
            else None
        )
        return MqttSession(
            settings,
            client_id=client_id,
            will=will,
            message_sink=self.handle_message,
            logger=structlog.get_logger("greenfed.cloud.mqtt"),
        )

    def handle_message(self, topic: str, payload: bytes | bytearray) -> None:
        try:
            self.handle(topic, payload)
        except Exception:  # a bug here must not tear down the connection for everyone
            self.stats.failures += 1
            self._log.exception("ingestion failed", topic=topic)

    async def run(self, session: MqttSession) -> None:
        """Subscribe on every (re)connect and ingest until cancelled."""
        await session.run(self._consume)

    async def _consume(self, client: aiomqtt.Client) -> None:
        self.registry.resubscribed()
        group = self.shared_group
        for channel in DECODERS:
            topic_filter = self.topics.all_nodes(channel)
            if channel is Channel.TELEMETRY:
                topic_filter = self.topics.shared(topic_filter, group)
            await client.subscribe(topic_filter, qos=CHANNEL_SPECS[channel].qos)
        if group:
            await client.subscribe(self._digest_topic, qos=0)
        # After the channels: a probe's echo comes after the retained messages they bring.
        await client.subscribe(self.link_probe.topic, qos=0)
        self._log.info("ingestion subscribed", root=self.topics.root, shared_group=group or None)
        self.subscribed.set()
        # Owned here: it lives and dies with this connection.
        digests = (
            asyncio.create_task(self._publish_digests(client), name="telemetry-digest")
            if group
            else None
        )
        try:
            # A probe that cannot be sent ends the connection: unproven, the link would
            # hold every judgment of the fleet until the keep-alive gave it up.
            async with asyncio.TaskGroup() as connection:
                connection.create_task(self.link_probe.run(client), name="link-probe")
                connection.create_task(self._read(client), name="mqtt-read")
        except* aiomqtt.MqttError as lost:
            raise lost.exceptions[0] from None
        finally:
            self.link_probe.lost()
            self.subscribed.clear()
            if digests is not None:
                await cancel_and_wait([digests])
                failed = digests.done() and not digests.cancelled()
                if failed and digests.exception() is not None:
                    # A publish failed: the connection is going; this loop raises too.
                    self._log.warning("digest publishing stopped", error=str(digests.exception()))
                task = asyncio.current_task()
                if task is not None and task.cancelling():  # stopping, not a lost link
                    await self._say_goodbye(client)

    async def _say_goodbye(self, client: aiomqtt.Client) -> None:
        """The last digest of a replica that stops: what it heard since the previous
        one, and that the others need not wait for more (a clean DISCONNECT drops the
        will that would say so)."""
        try:
            async with asyncio.timeout(GOODBYE_TIMEOUT_S):
                now_s = time.time()
                last = self.digest.take(now_s, goodbye=True)
                for payload in last or [self.digest.heartbeat(now_s, goodbye=True)]:
                    await client.publish(self._digest_topic, payload, qos=0)
        except (aiomqtt.MqttError, TimeoutError) as error:
            # The others stop waiting for this replica after twice the keep-alive.
            self._log.warning("last digest not sent", error=str(error) or type(error).__name__)

    async def _read(self, client: aiomqtt.Client) -> None:
        """Messages arrive through handle_message (the session's sink); iterating only
        waits here, and raises when the connection drops."""
        async for message in client.messages:
            if isinstance(message.payload, bytes | bytearray):
                self.handle_message(message.topic.value, message.payload)

    async def _publish_digests(self, client: aiomqtt.Client) -> None:
        """Every `digest_interval_s`, what this replica heard since the last digest, or a
        heartbeat: the others judge nodes' silence only as far as it proves this
        replica's share relayed (cloud/fleet/liveness.py)."""
        while True:
            await asyncio.sleep(self._digest_interval_s)
            now_s = time.time()
            for payload in self.digest.take(now_s) or [self.digest.heartbeat(now_s)]:
                await client.publish(self._digest_topic, payload, qos=0)
