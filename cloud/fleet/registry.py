"""The node registry: the cloud's live view of every node, built from MQTT.

It applies what nodes say of themselves: a node is offline when its retained
status says so (the will after a crash, or a goodbye on a clean stop), and fresh
telemetry from the same agent instance brings a node that went stale back online.
What silence means (when a node is stale, when its work is lost) is decided in
cloud/fleet/liveness.py, which records its verdicts here (`mark_offline`).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from enum import StrEnum

from shared.messages import (
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


class Rejection(StrEnum):
    """Why a well-formed message was still not applied; counted by ingestion."""

    UNKNOWN_NODE = "unknown_node"
    INSTANCE_MISMATCH = "instance_mismatch"
    OUT_OF_ORDER = "out_of_order"


@dataclass(slots=True)
class NodeRecord:
    status: NodeStatus
    state: NodeState
    offline_reason: OfflineReason | None
    last_seen_monotonic: float
    last_seen_at: float  # UTC epoch seconds
    telemetry: Telemetry | None = None
    reported: ReportedState | None = None

    @property
    def node_id(self) -> str:
        return self.status.node_id

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

    def matches(self, record: NodeRecord) -> bool:
        status = record.status
        return (
            (self.site is None or status.site == self.site)
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
    ) -> None:
        self._monotonic = monotonic
        self._wall_clock = wall_clock
        self._records: dict[str, NodeRecord] = {}
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

    def apply_status(self, status: NodeStatus) -> NodeStateChange | None:
        """Birth, will or goodbye. Returns the state change it caused, if any."""
        record = self._records.get(status.node_id)
        reason = status.offline_reason if status.state == "offline" else None
        if record is None:
            record = NodeRecord(
                status=status,
                state=status.state,
                offline_reason=reason,
                last_seen_monotonic=0.0,
                last_seen_at=0.0,
            )
            self._records[status.node_id] = record
            self._touch(record)
            self.version += 1
            return NodeStateChange(status.node_id, status.state, reason)
        if status.state == "offline" and status.instance_id != record.status.instance_id:
            # The will of an older agent instance, delivered after its successor's birth.
            return None
        previous = (record.state, record.offline_reason)
        if status.instance_id != record.status.instance_id:
            record.telemetry = None  # a new agent instance starts a new sequence
        record.status = status
        record.state = status.state
        record.offline_reason = reason
        if status.state == "online":
            self._touch(record)
        self.version += 1
        if previous == (record.state, record.offline_reason):
            return None
        return NodeStateChange(status.node_id, record.state, reason)

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
        record.telemetry = telemetry
        self._touch(record)
        if record.state == "offline" and record.offline_reason == "telemetry-stale":
            record.state = "online"
            record.offline_reason = None
            self.version += 1
            return NodeStateChange(record.node_id, "online", None)
        return None

    def apply_reported(self, reported: ReportedState) -> Rejection | None:
        record = self._records.get(reported.node_id)
        if record is None:
            return Rejection.UNKNOWN_NODE
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
