"""The node registry: the cloud's live view of every node, built from MQTT.

It applies what nodes say of themselves: a node is offline when its retained
status says so (the will after a crash, or a goodbye on a clean stop), and fresh
telemetry from the same agent instance brings a node that went stale back online.
What silence means (when a node is stale, when its work is lost) is decided in
cloud/fleet/liveness.py, which records its verdicts here (`mark_offline`).

What it refuses (a message is checked for plausibility first, cloud/fleet/
plausibility.py): telemetry or a report from an agent instance other than the one of
the node's current birth; a sample whose sequence number does not increase (it may
start again only with a new instance) or runs further ahead than elapsed time allows,
so that one forged `seq` cannot make every later real sample "out of order"; and the
birth of a new node once `max_nodes` are known.

**Which agent instance holds a node.** A birth is retained and anyone who can write the
node's `status` can copy one, so a birth alone never takes a node from an instance that
holds it: *holding* means the node is online and its current instance's telemetry has
been accepted since that instance became current and since ingestion last subscribed
(samples are not retained: only an agent that is running sends them; and while we were
not listening, the agent may have died and its will been overwritten by its
successor's birth). A birth of another instance then becomes a
*candidate* (counted in `instance_conflicts`, refused as `instance_conflict`), kept for
`CANDIDATE_TTL_S`, at most `MAX_CANDIDATES_PER_NODE` per node. The node changes
instance when:

- a birth of another instance arrives while the current one does not hold the node:
  it is offline (its will or goodbye came, or it went stale: cloud/fleet/liveness.py),
  or it never sent a sample (a birth retained on the broker, a copy). A legitimate
  restart takes this path: the old agent's will (or goodbye) precedes the new one's
  birth, or its silence has outlasted the staleness limit;
- a candidate's telemetry arrives while the current instance does not hold the node.
  The instance that held the node before is kept as a candidate when it is replaced,
  so that an agent whose node a copied will and a forged birth took wins it back with
  its next sample (a flip between two instances: counted as a conflict too).

Telemetry from the current instance keeps it current, and brings the node back online
whatever took it offline: a copied will cannot keep a running agent's node offline.
Listeners (`instance_listeners`) hear of every change of a node's current instance:
the publisher answers the new instance's birth with the node's `desired` document,
issued for it (cloud/loop/publisher.py). Others (`forget_listeners`) hear of every node
the registry forgets: the publisher keeps nothing of it and clears its document.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Final, Literal

import msgspec

if TYPE_CHECKING:  # the CLI reads node views without the database stack
    from cloud.store import NodeAdminRecord

from cloud.fleet.envelope import NodeEnvelope, believed_accelerators, judge
from cloud.fleet.outage import Outage, OutageCause, ended_by, offline_cause
from shared.messages import (
    Accelerator,
    AcceleratorKind,
    DeploymentSample,
    NodeState,
    NodeStatus,
    OfflineReason,
    ReportedDeployment,
    ReportedState,
    ReportedTraining,
    Site,
    Telemetry,
)

# Whether a node is what it enrolled (or was approved) as (cloud/fleet/envelope.py).
Approval = Literal["approved", "pending-approval"]

# A sample another replica relayed, not decoded yet: (what decodes and checks it against
# the rest, or gives None: refused and counted by ingestion, cloud/fleet/ingest.py; its
# bytes; when its digest arrived, wall clock; the agent instance and sequence number its
# digest's index names).
RelayedSample = tuple[
    Callable[[str, bytes, float, str, int], Telemetry | None], bytes, float, str, int
]


class Rejection(StrEnum):
    """Why a well-formed message was still not applied; counted by ingestion."""

    UNKNOWN_NODE = "unknown_node"
    INSTANCE_MISMATCH = "instance_mismatch"
    OUT_OF_ORDER = "out_of_order"
    SEQ_JUMP = "seq_jump"
    REGISTRY_FULL = "registry_full"
    # The birth of another agent instance while the current one holds the node: kept as
    # a candidate, not applied.
    INSTANCE_CONFLICT = "instance_conflict"


# A sample's `seq` counts one per interval. It may run ahead of the count elapsed time
# allows by this factor, plus this many samples (jitter, a reconnect's burst, the agent's
# clock), and no further.
SEQ_RATE_TOLERANCE = 2.0
SEQ_SLACK = 100


def seq_plausible(
    seq: int, last_seq: int | None, interval_s: float, since_start_s: float, since_last_s: float
) -> bool:
    """Whether `seq` is no further along than an agent sending every `interval_s` can
    have counted `since_start_s` after it started (a first sample, or a burst of forged
    ones) and `since_last_s` after its sample `last_seq` (None: none accepted yet)."""
    if (
        seq
        > SEQ_RATE_TOLERANCE * (since_start_s if since_start_s > 0 else 0.0) / interval_s
        + SEQ_SLACK
    ):
        return False
    return (
        last_seq is None
        or seq - last_seq
        <= SEQ_RATE_TOLERANCE * (since_last_s if since_last_s > 0 else 0.0) / interval_s + SEQ_SLACK
    )


# Births of other agent instances kept per node while its current instance holds it, and
# for how long (monotonic seconds): bounded, so that a flood of forged births costs memory
# per node, not per message. A real agent whose birth was superseded announces itself
# again (edge/agent/birth.py), which renews its candidacy.
MAX_CANDIDATES_PER_NODE: Final = 3
CANDIDATE_TTL_S: Final = 600.0


@dataclass(frozen=True, slots=True)
class Candidate:
    """The birth of an agent instance that is not the node's current one."""

    status: NodeStatus
    since_monotonic: float


@dataclass(slots=True)
class RelayedMerge:
    """What `NodeRegistry.apply_relayed` made of a digest's samples."""

    applied: int = 0
    # No newer than what this replica had: replicas hear a node's samples in turns.
    stale: int = 0
    # The rest, by node id: other refusals (counted by ingestion) and the state changes
    # applied samples made (a node back online, another agent instance current).
    outcomes: list[tuple[str, Rejection | NodeStateChange]] = field(default_factory=list)


@dataclass(slots=True)
class NodeRecord:
    status: NodeStatus
    state: NodeState
    offline_reason: OfflineReason | None
    last_seen_monotonic: float
    last_seen_at: float  # UTC epoch seconds
    # The latest decoded sample of the current instance: read it through `telemetry`.
    decoded_telemetry: Telemetry | None = None
    reported: ReportedState | None = None
    telemetry_received_monotonic: float = 0.0  # when the latest sample arrived
    admin: NodeAdminRecord | None = None  # what an admin set (cloud/fleet/node_admin.py)
    # While offline: its likely cause, and when it went offline (cloud/fleet/outage.py).
    offline_cause: OutageCause | None = None
    offline_since: float = 0.0  # UTC epoch seconds
    last_outage: Outage | None = None  # the latest one that ended
    # What its birth says beyond what it enrolled (or was approved) as: while not empty it
    # is `pending-approval` and takes no new work (cloud/fleet/envelope.py).
    awaiting_approval: tuple[str, ...] = ()
    # The labels its join token fixed (its envelope's): laid over its births' labels.
    enrolled_labels: Mapping[str, str] = field(default_factory=dict)
    # Its accelerators with the speed and power the control plane takes for them: the
    # model table's, unless an admin trusts the node's own (cloud/fleet/envelope.py).
    believed_accelerators: tuple[Accelerator, ...] = ()
    # Births of other agent instances, by instance id, oldest first (see the module's
    # docstring): one of them becomes current by its telemetry once the current one no
    # longer holds the node.
    candidates: dict[str, Candidate] = field(default_factory=dict)
    # A newer sample than `decoded_telemetry` that another replica relayed (cloud/fleet/
    # digest.py), decoded and checked only when `telemetry` is read: a replica that does
    # not meter hears every other replica's share, and reads few of those samples.
    relayed: RelayedSample | None = None
    # The sequence number of the latest sample accepted, decoded or relayed; None: none
    # since the current instance became current.
    telemetry_seq: int | None = None

    def __post_init__(self) -> None:
        if self.telemetry_seq is None and self.decoded_telemetry is not None:
            self.telemetry_seq = self.decoded_telemetry.seq
        if not self.believed_accelerators:
            self.believed_accelerators = believed_accelerators(
                self.status.accelerators, self.admin is not None and self.admin.trust_figures
            )

    @property
    def telemetry(self) -> Telemetry | None:
        """The latest sample of the current instance: a relayed one is decoded and checked
        on the first read (one that fails is counted by ingestion, and the sample before
        it stays)."""
        relayed = self.relayed
        if relayed is not None:
            open_sample, payload, received_s, instance_id, seq = relayed
            opened = open_sample(self.node_id, payload, received_s, instance_id, seq)
            # Unless a newer sample came meanwhile (a /metrics scrape reads in a thread).
            if self.relayed is relayed:
                self.relayed = None
                if opened is not None:
                    self.decoded_telemetry = opened
                else:
                    # Refused: the sequence its index entry claimed stands no longer, or
                    # the node's real samples up to it would be refused as old.
                    last = self.decoded_telemetry
                    self.telemetry_seq = last.seq if last is not None else None
        return self.decoded_telemetry

    @telemetry.setter
    def telemetry(self, telemetry: Telemetry | None) -> None:
        self.decoded_telemetry = telemetry
        self.relayed = None
        self.telemetry_seq = telemetry.seq if telemetry is not None else None

    @property
    def node_id(self) -> str:
        return self.status.node_id

    @property
    def approval(self) -> Approval:
        return "pending-approval" if self.awaiting_approval else "approved"

    @property
    def accelerator_kinds(self) -> frozenset[AcceleratorKind]:
        return frozenset(accelerator.kind for accelerator in self.status.accelerators)

    # What the node last said of one piece of work (None: nothing yet).

    def training_report(self, job_id: str, attempt: int) -> ReportedTraining | None:
        entries = self.reported.training if self.reported is not None else ()
        return next((e for e in entries if e.job_id == job_id and e.attempt == attempt), None)

    def replica_report(self, deployment_id: str, replica: int) -> ReportedDeployment | None:
        entries = self.reported.deployments if self.reported is not None else ()
        return next(
            (e for e in entries if e.deployment_id == deployment_id and e.replica == replica),
            None,
        )

    def serving_sample(self, deployment_id: str) -> DeploymentSample | None:
        telemetry = self.telemetry
        samples = telemetry.deployments if telemetry is not None else ()
        return next((s for s in samples if s.deployment_id == deployment_id), None)


@dataclass(frozen=True, slots=True)
class NodeFilter:
    site: Site | None = None
    zone: str | None = None
    region: str | None = None
    kind: AcceleratorKind | None = None
    state: NodeState | None = None
    approval: Approval | None = None

    def matches(self, record: NodeRecord) -> bool:
        status = record.status
        return (
            (self.approval is None or record.approval == self.approval)
            and (self.site is None or status.site == self.site)
            and (self.zone is None or status.zone == self.zone)
            and (self.region is None or status.region == self.region)
            and (self.kind is None or self.kind in record.accelerator_kinds)
            and (self.state is None or record.state == self.state)
        )


@dataclass(frozen=True, slots=True)
class NodeStateChange:
    node_id: str
    state: NodeState
    reason: OfflineReason | None


class NodeRegistry:
    def __init__(
        self,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        max_nodes: int = 10_000,
        max_clock_skew_s: float = 300.0,
    ) -> None:
        """`max_nodes`: births of new nodes beyond it are refused (`cloud.max_nodes`);
        `max_clock_skew_s`: how far an agent's clock may be ahead (`cloud.max_clock_skew_s`),
        which the sequence bound of a first sample allows for."""
        self._monotonic = monotonic
        self._wall_clock = wall_clock
        self.max_nodes = max_nodes
        self._max_clock_skew_s = max_clock_skew_s
        self._records: dict[str, NodeRecord] = {}
        # What an admin set, by node id, nodes not born yet included.
        self.admin: Mapping[str, NodeAdminRecord] = {}
        # What a node may be, as it enrolled (cloud/fleet/enrolled.py); None: not held.
        self.envelope_of: Callable[[str], NodeEnvelope | None] = lambda node_id: None
        # Bumped on every change of membership or state, so readers can cache by it.
        self.version = 0
        # Called with (node id, instance id) when a node's current agent instance changes,
        # a new node's first included. Must be quick and must not raise.
        self.instance_listeners: list[Callable[[str, str], None]] = []
        # Called with the node id when a node is forgotten (`forget`): revoked, or no
        # longer admitted. Must be quick and must not raise.
        self.forget_listeners: list[Callable[[str], None]] = []
        # Times a node was claimed by two agent instances at once: a birth held back as a
        # candidate, or a node won back from an instance that never proved itself
        # (greenfed_node_instance_conflicts_total).
        self.instance_conflicts = 0
        # When ingestion last (re)subscribed (monotonic): a sample from before may come
        # from an agent that died while its will could not reach us.
        self._hearing_since_monotonic = float("-inf")

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[NodeRecord]:
        """Every record, in no particular order (`nodes` sorts)."""
        return iter(self._records.values())

    @property
    def monotonic(self) -> Callable[[], float]:
        """The clock `NodeRecord.last_seen_monotonic` is read from."""
        return self._monotonic

    @property
    def wall_clock(self) -> Callable[[], float]:
        """The control plane's UTC clock (epoch seconds), that timestamps are judged by."""
        return self._wall_clock

    def get(self, node_id: str) -> NodeRecord | None:
        return self._records.get(node_id)

    def resubscribed(self) -> None:
        """Ingestion (re)subscribed to the broker: what was heard before proves no agent
        instance still holds its node (its will may have been published, and overwritten
        by its successor's birth, while we were not listening)."""
        self._hearing_since_monotonic = self._monotonic()

    def holds_node(self, record: NodeRecord) -> bool:
        """Whether the node's current agent instance holds it: the node is online and the
        instance's telemetry has been accepted since it became current and since we last
        subscribed (a birth proves nothing: it is retained and can be copied)."""
        return (
            record.state == "online"
            and record.telemetry_seq is not None
            and record.telemetry_received_monotonic > self._hearing_since_monotonic
        )

    def current_instance(self, node_id: str) -> str | None:
        """The agent instance of the node's current birth; None: the node is not known."""
        record = self._records.get(node_id)
        return record.status.instance_id if record is not None else None

    def nodes(self, node_filter: NodeFilter | None = None) -> list[NodeRecord]:
        records = sorted(self._records.values(), key=lambda record: record.node_id)
        if node_filter is None:
            return records
        return [record for record in records if node_filter.matches(record)]

    def _touch(self, record: NodeRecord) -> None:
        record.last_seen_monotonic = self._monotonic()
        record.last_seen_at = self._wall_clock()

    def apply_status(self, status: NodeStatus) -> Rejection | NodeStateChange | None:
        """Birth, will or goodbye. Returns the state change it caused, if any,
        `REGISTRY_FULL` for a node not known yet when `max_nodes` are, or
        `INSTANCE_CONFLICT` for the birth of another instance while the current one holds
        the node (kept as a candidate)."""
        record = self._records.get(status.node_id)
        if record is None:
            return self._first_birth(status)
        if status.instance_id == record.status.instance_id:
            return self._current_instance_status(record, status)
        if status.state == "offline":
            # The will or goodbye of an instance that is not current: an older one's,
            # delivered after its successor's birth, or a candidate's that is gone.
            record.candidates.pop(status.instance_id, None)
            return None
        if self.holds_node(record):
            self._keep_candidate(record, status)
            self.instance_conflicts += 1
            return Rejection.INSTANCE_CONFLICT
        return self._switch_instance(record, status)

    def _first_birth(self, status: NodeStatus) -> Rejection | NodeStateChange:
        if len(self._records) >= self.max_nodes:
            return Rejection.REGISTRY_FULL
        reason = status.offline_reason if status.state == "offline" else None
        record = NodeRecord(
            status=status,
            state=status.state,
            offline_reason=reason,
            last_seen_monotonic=0.0,
            last_seen_at=0.0,
            admin=self.admin.get(status.node_id),
        )
        self._records[status.node_id] = record
        self._judge(record)
        self._touch(record)
        self.version += 1
        self._instance_changed(record)
        return NodeStateChange(status.node_id, status.state, reason)

    def _current_instance_status(
        self, record: NodeRecord, status: NodeStatus
    ) -> NodeStateChange | None:
        """A birth (a reconnect, new device health), will or goodbye of the current
        instance."""
        reason = status.offline_reason if status.state == "offline" else None
        previous = (record.state, record.offline_reason)
        if status.state == "offline" and record.state == "online":
            self._went_offline(record, reason or "connection-lost")
        elif status.state == "online" and record.state == "offline":
            self._came_back(record, status.instance_id)
            # Its silence counts from its return. A birth while online does not reset it:
            # a copy of the birth must not keep a dead agent's node online.
            self._touch(record)
        record.status = status
        record.state = status.state
        record.offline_reason = reason
        self._judge(record)
        self.version += 1
        if previous == (record.state, record.offline_reason):
            return None
        return NodeStateChange(status.node_id, record.state, reason)

    def _switch_instance(self, record: NodeRecord, status: NodeStatus) -> NodeStateChange | None:
        """Make `status` (an online birth) the node's current instance."""
        previous = (record.state, record.offline_reason)
        replaced = record.status
        if record.telemetry_seq is not None and replaced.offline_reason != "shutdown":
            # It proved itself and did not say goodbye: if the newcomer is an impostor
            # (after a copied will, say), the old instance's next sample wins the node back.
            self._keep_candidate(
                record, msgspec.structs.replace(replaced, state="online", offline_reason=None)
            )
        record.candidates.pop(status.instance_id, None)
        if record.state == "offline":
            self._came_back(record, status.instance_id)
        record.telemetry = None  # a new agent instance starts a new sequence
        record.status = status
        record.state = "online"
        record.offline_reason = None
        self._judge(record)
        self._touch(record)
        self.version += 1
        self._instance_changed(record)
        if previous == ("online", None):
            return None
        return NodeStateChange(status.node_id, "online", None)

    def _keep_candidate(self, record: NodeRecord, status: NodeStatus) -> None:
        candidates = record.candidates
        candidates.pop(status.instance_id, None)  # inserted again as the newest
        candidates[status.instance_id] = Candidate(status, self._monotonic())
        while len(candidates) > MAX_CANDIDATES_PER_NODE:
            del candidates[next(iter(candidates))]

    def _candidate(self, record: NodeRecord, instance_id: str) -> NodeStatus | None:
        candidate = record.candidates.get(instance_id)
        if candidate is None:
            return None
        if self._monotonic() - candidate.since_monotonic > CANDIDATE_TTL_S:
            del record.candidates[instance_id]
            return None
        return candidate.status

    def _instance_changed(self, record: NodeRecord) -> None:
        for listener in self.instance_listeners:
            listener(record.node_id, record.status.instance_id)

    def set_admin(self, admin: Mapping[str, NodeAdminRecord]) -> bool:
        """Replace what admins set on nodes; whether any known node's changed."""
        changed = False
        for node_id, record in self._records.items():
            new = admin.get(node_id)
            if new != record.admin:
                record.admin = new
                self._judge(record)
                changed = True
        self.admin = dict(admin)
        if changed:
            self.version += 1
        return changed

    def judge_again(self, node_ids: Iterable[str]) -> bool:
        """Judge these nodes against their envelopes again (their enrolment changed);
        whether any verdict changed. The version moves whenever a known node is named,
        verdict changed or not: its envelope did, which readers that cache by the
        version read (cloud/fleet/node_admin.py `FirstClaims`)."""
        changed = known = False
        for node_id in node_ids:
            record = self._records.get(node_id)
            if record is not None:
                known = True
                changed = self._judge(record) or changed
        if known:
            self.version += 1
        return changed

    def _judge(self, record: NodeRecord) -> bool:
        """Hold the node to what it enrolled (or was approved) as, and take its figures
        as the control plane believes them; whether its approval changed."""
        admin = record.admin
        record.believed_accelerators = believed_accelerators(
            record.status.accelerators, admin is not None and admin.trust_figures
        )
        approved = admin.approved if admin is not None else None
        envelope = self.envelope_of(record.node_id)
        record.enrolled_labels = envelope.labels if envelope is not None else {}
        verdict = judge(record.status, envelope, approved)
        if verdict == record.awaiting_approval:
            return False
        record.awaiting_approval = verdict
        return True

    def forget(self, node_id: str) -> bool:
        """Drop a node an admin revoked, or one no longer admitted (cloud/api/enrolment.py);
        never for anything the node's topics say (an empty status included)."""
        removed = self._records.pop(node_id, None) is not None
        if removed:
            self.version += 1
            for listener in self.forget_listeners:
                listener(node_id)
        return removed

    def apply_telemetry(self, telemetry: Telemetry) -> Rejection | NodeStateChange | None:
        """A sample. From the current instance it keeps the node and brings it back online
        whatever took it offline; from a candidate, it makes that candidate current if the
        current instance does not hold the node."""
        return self._accept_sample(
            telemetry.node_id, telemetry.instance_id, telemetry.seq, telemetry
        )

    def apply_relayed(
        self,
        entries: Iterable[tuple[str, str, int, bytes | msgspec.Raw]],
        open_sample: Callable[[str, bytes, float, str, int], Telemetry | None],
        now: tuple[float, float],
        applied_entries: list[tuple[str, str, int]] | None = None,
    ) -> RelayedMerge:
        """Samples another replica took, each known here by its digest's index entry (node,
        agent instance, sequence number) and kept encoded until read (`NodeRecord.
        telemetry`, which checks it with `open_sample`): the same rules as
        `apply_telemetry`. `now`: (monotonic, wall clock), read once for the digest.
        `applied_entries` gets the index entry of each sample applied."""
        records = self._records
        now_monotonic, received_s = now
        skew_s = self._max_clock_skew_s
        applied = stale = 0
        outcomes: list[tuple[str, Rejection | NodeStateChange]] = []
        for node_id, instance_id, seq, raw in entries:
            # Every relayed sample's path, so the usual case is settled here, inline: the
            # node online, its current instance's next sample, at a plausible pace.
            record = records.get(node_id)
            if (
                record is not None
                and (last_seq := record.telemetry_seq) is not None
                and instance_id == (status := record.status).instance_id
                and record.state == "online"
            ):
                if seq <= last_seq:
                    stale += 1
                    continue
                if seq_plausible(
                    seq,
                    last_seq,
                    status.telemetry_interval_s,
                    received_s - status.started_at + skew_s,
                    now_monotonic - record.telemetry_received_monotonic,
                ):
                    # The bytes copied: a view would keep the whole digest's buffer alive.
                    record.relayed = (open_sample, bytes(raw), received_s, instance_id, seq)
                    record.telemetry_seq = seq
                    record.last_seen_monotonic = now_monotonic
                    record.telemetry_received_monotonic = now_monotonic
                    record.last_seen_at = received_s
                    applied += 1
                    if applied_entries is not None:
                        applied_entries.append((node_id, instance_id, seq))
                    continue
            # The rest (unknown, offline, another instance, a first sample, a jump): the
            # rules in full, on the sample decoded and checked now. What they may change
            # (the node's instance, the node back online) must not rest on an index entry
            # whose sample could still be refused; and these are few.
            if record is None:
                outcome: Rejection | NodeStateChange | None = Rejection.UNKNOWN_NODE
            else:
                opened = open_sample(node_id, bytes(raw), received_s, instance_id, seq)
                if opened is None:
                    continue  # refused, and counted, by ingestion
                outcome = self._accept_sample(node_id, instance_id, seq, opened, now)
            if outcome is Rejection.OUT_OF_ORDER:
                stale += 1
                continue
            if not isinstance(outcome, Rejection):
                applied += 1
                if applied_entries is not None:
                    applied_entries.append((node_id, instance_id, seq))
            if outcome is not None:
                outcomes.append((node_id, outcome))
        return RelayedMerge(applied=applied, stale=stale, outcomes=outcomes)

    def _accept_sample(
        self,
        node_id: str,
        instance_id: str,
        seq: int,
        sample: Telemetry,
        now: tuple[float, float] | None = None,
    ) -> Rejection | NodeStateChange | None:
        record = self._records.get(node_id)
        if record is None:
            return Rejection.UNKNOWN_NODE
        # Each clock read once: this is every sample's path.
        now_monotonic, now_s = now or (self._monotonic(), self._wall_clock())
        switched: NodeStateChange | None = None
        if instance_id != record.status.instance_id:
            if sample.sampled_at < record.status.started_at:
                # Taken before the node's current agent started (both on the node's
                # clock): a late copy from an instance it replaced, e.g. relayed by a
                # replica after the new birth arrived here.
                return Rejection.OUT_OF_ORDER
            candidate = self._candidate(record, instance_id)
            if candidate is None or self.holds_node(record):
                return Rejection.INSTANCE_MISMATCH
            since_start_s = now_s - candidate.started_at + self._max_clock_skew_s
            if not seq_plausible(seq, None, candidate.telemetry_interval_s, since_start_s, 0.0):
                return Rejection.SEQ_JUMP
            if record.state == "online":
                # Taken back from an instance that announced itself and never sent a sample.
                self.instance_conflicts += 1
            switched = self._switch_instance(record, candidate)
        last_seq = record.telemetry_seq
        if last_seq is not None and seq <= last_seq:
            return Rejection.OUT_OF_ORDER
        status = record.status
        if not seq_plausible(
            seq,
            last_seq,
            status.telemetry_interval_s,
            now_s - status.started_at + self._max_clock_skew_s,
            now_monotonic - record.telemetry_received_monotonic,
        ):
            return Rejection.SEQ_JUMP
        record.decoded_telemetry = sample
        record.relayed = None
        record.telemetry_seq = seq
        record.last_seen_monotonic = record.telemetry_received_monotonic = now_monotonic
        record.last_seen_at = now_s
        if record.state == "offline":
            # Only a running agent sends samples: whatever said it was offline (staleness,
            # a will or goodbye, copied or delivered late) no longer holds.
            self._came_back(record, instance_id)
            record.state = "online"
            record.offline_reason = None
            self.version += 1
            return NodeStateChange(record.node_id, "online", None)
        return switched

    def _went_offline(self, record: NodeRecord, reason: OfflineReason) -> None:
        silent_for_s = self._monotonic() - record.last_seen_monotonic
        record.offline_cause = offline_cause(
            reason, silent_for_s, record.status.telemetry_interval_s
        )
        record.offline_since = self._wall_clock()

    def _came_back(self, record: NodeRecord, instance_id: str) -> None:
        if record.offline_cause is not None:
            now = self._wall_clock()
            record.last_outage = Outage(
                cause=record.offline_cause,
                ended_by=ended_by(record.status.instance_id, instance_id),
                offline_s=max(0.0, now - record.offline_since),
                ended_at=now,
            )
        record.offline_cause = None

    def apply_reported(self, reported: ReportedState) -> Rejection | None:
        record = self._records.get(reported.node_id)
        if record is None:
            return Rejection.UNKNOWN_NODE
        if reported.instance_id != record.status.instance_id:
            # A straggler from the agent before a restart: it speaks for runs now gone.
            return Rejection.INSTANCE_MISMATCH
        record.reported = reported
        return None

    def mark_offline(self, node_ids: Iterable[str], reason: OfflineReason) -> list[NodeStateChange]:
        """Record that these nodes went offline for ``reason``, as cloud/fleet/liveness.py
        judged; a node that is not online (or not known) is left as it is."""
        changes = []
        for node_id in node_ids:
            record = self._records.get(node_id)
            if record is None or record.state != "online":
                continue
            self._went_offline(record, reason)
            record.state = "offline"
            record.offline_reason = reason
            changes.append(NodeStateChange(node_id, "offline", reason))
        if changes:
            self.version += 1
        return changes

    def counts(self) -> FleetCounts:
        return FleetCounts.of(self._records.values())


@dataclass(frozen=True, slots=True)
class FleetCounts:
    """Aggregates for metrics and summaries."""

    nodes_by_state_site: dict[tuple[str, str], int]
    nodes_by_kind_state: dict[tuple[str, str], int]
    accelerators_by_kind_state: dict[tuple[str, str], int]

    @classmethod
    def of(cls, records: Iterable[NodeRecord]) -> FleetCounts:
        by_state_site: Counter[tuple[str, str]] = Counter()
        nodes_by_kind: Counter[tuple[str, str]] = Counter()
        accelerators_by_kind: Counter[tuple[str, str]] = Counter()
        for record in records:
            by_state_site[(record.state, record.status.site)] += 1
            for kind in record.accelerator_kinds:
                nodes_by_kind[(kind, record.state)] += 1
            for accelerator in record.status.accelerators:
                accelerators_by_kind[(accelerator.kind, record.state)] += 1
        return cls(dict(by_state_site), dict(nodes_by_kind), dict(accelerators_by_kind))
