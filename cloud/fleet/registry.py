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
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Literal

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


class Rejection(StrEnum):
    """Why a well-formed message was still not applied; counted by ingestion."""

    UNKNOWN_NODE = "unknown_node"
    INSTANCE_MISMATCH = "instance_mismatch"
    OUT_OF_ORDER = "out_of_order"
    SEQ_JUMP = "seq_jump"
    REGISTRY_FULL = "registry_full"


# A sample's `seq` counts one per interval. It may run ahead of the count elapsed time
# allows by this factor, plus this many samples (jitter, a reconnect's burst, the agent's
# clock), and no further.
SEQ_RATE_TOLERANCE = 2.0
SEQ_SLACK = 100


@dataclass(slots=True)
class NodeRecord:
    status: NodeStatus
    state: NodeState
    offline_reason: OfflineReason | None
    last_seen_monotonic: float
    last_seen_at: float  # UTC epoch seconds
    telemetry: Telemetry | None = None
    reported: ReportedState | None = None
    telemetry_received_monotonic: float = 0.0  # when `telemetry` arrived
    admin: NodeAdminRecord | None = None  # what an admin set (cloud/fleet/node_admin.py)
    # While offline: its likely cause, and when it went offline (cloud/fleet/outage.py).
    offline_cause: OutageCause | None = None
    offline_since: float = 0.0  # UTC epoch seconds
    last_outage: Outage | None = None  # the latest one that ended
    # What its birth says beyond what it enrolled (or was approved) as: while not empty it
    # is `pending-approval` and takes no new work (cloud/fleet/envelope.py).
    awaiting_approval: tuple[str, ...] = ()
    # Its accelerators with the speed and power the control plane takes for them: the
    # model table's, unless an admin trusts the node's own (cloud/fleet/envelope.py).
    believed_accelerators: tuple[Accelerator, ...] = ()

    def __post_init__(self) -> None:
        if not self.believed_accelerators:
            self.believed_accelerators = believed_accelerators(
                self.status.accelerators, self.admin is not None and self.admin.trust_figures
            )

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
        samples = self.telemetry.deployments if self.telemetry is not None else ()
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

    def nodes(self, node_filter: NodeFilter | None = None) -> list[NodeRecord]:
        records = sorted(self._records.values(), key=lambda record: record.node_id)
        if node_filter is None:
            return records
        return [record for record in records if node_filter.matches(record)]

    def _touch(self, record: NodeRecord) -> None:
        record.last_seen_monotonic = self._monotonic()
        record.last_seen_at = self._wall_clock()

    def apply_status(self, status: NodeStatus) -> Rejection | NodeStateChange | None:
        """Birth, will or goodbye. Returns the state change it caused, if any, or
        `REGISTRY_FULL` for a node not known yet when `max_nodes` are."""
        record = self._records.get(status.node_id)
        reason = status.offline_reason if status.state == "offline" else None
        if record is None:
            if len(self._records) >= self.max_nodes:
                return Rejection.REGISTRY_FULL
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
            return NodeStateChange(status.node_id, status.state, reason)
        if status.state == "offline" and status.instance_id != record.status.instance_id:
            # The will of an older agent instance, delivered after its successor's birth.
            return None
        previous = (record.state, record.offline_reason)
        if status.state == "offline" and record.state == "online":
            self._went_offline(record, reason or "connection-lost")
        elif status.state == "online" and record.state == "offline":
            self._came_back(record, status.instance_id)
        if status.instance_id != record.status.instance_id:
            record.telemetry = None  # a new agent instance starts a new sequence
        record.status = status
        record.state = status.state
        record.offline_reason = reason
        self._judge(record)
        if status.state == "online":
            self._touch(record)
        self.version += 1
        if previous == (record.state, record.offline_reason):
            return None
        return NodeStateChange(status.node_id, record.state, reason)

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
        whether any verdict changed."""
        changed = False
        for node_id in node_ids:
            record = self._records.get(node_id)
            if record is not None:
                changed = self._judge(record) or changed
        if changed:
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
        verdict = judge(record.status, self.envelope_of(record.node_id), approved)
        if verdict == record.awaiting_approval:
            return False
        record.awaiting_approval = verdict
        return True

    def forget(self, node_id: str) -> bool:
        """Drop a node whose retained status was cleared (decommissioned)."""
        removed = self._records.pop(node_id, None) is not None
        if removed:
            self.version += 1
        return removed

    def apply_telemetry(self, telemetry: Telemetry) -> Rejection | NodeStateChange | None:
        record = self._records.get(telemetry.node_id)
        if record is None:
            return Rejection.UNKNOWN_NODE
        if telemetry.instance_id != record.status.instance_id:
            return Rejection.INSTANCE_MISMATCH
        if record.telemetry is not None and telemetry.seq <= record.telemetry.seq:
            return Rejection.OUT_OF_ORDER
        if not self._plausible_seq(record, telemetry.seq):
            return Rejection.SEQ_JUMP
        record.telemetry = telemetry
        self._touch(record)
        record.telemetry_received_monotonic = record.last_seen_monotonic
        if record.state == "offline" and record.offline_reason == "telemetry-stale":
            self._came_back(record, telemetry.instance_id)
            record.state = "online"
            record.offline_reason = None
            self.version += 1
            return NodeStateChange(record.node_id, "online", None)
        return None

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

    def _plausible_seq(self, record: NodeRecord, seq: int) -> bool:
        """Whether `seq` is no further along than this agent instance can have counted:
        since it started (a first sample, or a burst of forged ones) and since the last
        sample accepted."""
        interval_s = record.status.telemetry_interval_s
        since_start_s = self._wall_clock() - record.status.started_at + self._max_clock_skew_s
        if seq > SEQ_RATE_TOLERANCE * max(0.0, since_start_s) / interval_s + SEQ_SLACK:
            return False
        if record.telemetry is None:
            return True
        since_last_s = self._monotonic() - record.telemetry_received_monotonic
        allowed = SEQ_RATE_TOLERANCE * max(0.0, since_last_s) / interval_s + SEQ_SLACK
        return seq - record.telemetry.seq <= allowed

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
