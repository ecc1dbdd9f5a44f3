"""What agents report -> state changes of work.

Level-triggered: every pass compares each placed work item's allocations with the
latest `reported` document of each node it is on (the registry keeps it), so a
report is never lost to a missed message and a restarted control plane catches up
by looking once.

Training (one worker per node of a gang; see desired.py):
- a worker `failed` -> the job failed, with that worker's reason, unless its retry
  policy (cloud/work/retries.py) queues it again after a backoff;
- every worker `succeeded` -> the job succeeded;
- a worker `stopped` while still wanted (its agent shut down) -> requeued;
- a worker running (or done) -> the job is running.
Inference (one entry per replica):
- a replica `failed` -> the deployment failed, with the reason;
- every replica `ready` -> the deployment is running.
A node that is lost takes its work with it: a gang is requeued whole; a deployment
keeps its other replicas and the lost ones are placed again. A device its node reports
unhealthy (edge/agent/device_health.py) does the same to the work placed on it. Which nodes are lost
(offline beyond the grace period, or unknown) is not decided here but in
cloud/fleet/liveness.py (`Liveness.lost_nodes`); the pass hands its verdict in.

Whose word counts: an entry is read only from the node an allocation is on and only
for the work's current attempt (training: `training_report(work_id, attempts)` of each
worker's node; inference: `replica_report(work_id, member_index)` of each replica's
node). What a node says of another node's work, of work not placed on it, of an
earlier attempt or of a replica it does not hold is never read, so it changes nothing;
ingestion counts such entries (`not_assigned`, `wrong_attempt`) and undoes entries
that go backwards within one agent instance (cloud/fleet/ingest.py). A reason a node
gives is cut to `MAX_REASON_CHARS`, its control characters replaced (shared/
printable.py), before it becomes the work's reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from cloud.fleet.registry import NodeRecord
from cloud.loop.allocations import as_new_allocation, node_workers
from cloud.store import AllocationRecord, EvictionWrite, PlacementWrite, StateWrite, WorkRecord
from cloud.store.states import PLACED_STATES
from cloud.work.retries import Retry, after_failure
from shared.messages import ReportedDeployment, ReportedTraining
from shared.printable import printable
from shared.work_literals import AllocationState

MAX_REASON_CHARS = 1000


def _reason(text: str) -> str:
    """A node's words for people, bounded and printable (they are stored and streamed as
    events: PostgreSQL refuses a NUL in text, a terminal obeys an escape sequence).
    Ingestion already made a node's text printable (cloud/fleet/node_text.py); a
    cluster's (cloud/clusters/bridge.py) comes here straight."""
    text = printable(text)
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 1] + "…"


@dataclass(frozen=True, slots=True)
class AllocationStateChange:
    work_id: str
    member_index: int
    state: AllocationState


@dataclass(frozen=True, slots=True)
class AgentOutcomes:
    state_changes: tuple[StateWrite, ...] = ()
    evictions: tuple[EvictionWrite, ...] = ()
    placements: tuple[PlacementWrite, ...] = ()  # deployments that lost replicas
    allocation_states: tuple[AllocationStateChange, ...] = ()

    @property
    def changes_work(self) -> bool:
        return bool(self.state_changes or self.evictions or self.placements)

    @property
    def work_ids(self) -> frozenset[str]:
        """The work these outcomes change."""
        return frozenset(
            [w.work_id for w in self.state_changes]
            + [w.work_id for w in self.evictions]
            + [w.work_id for w in self.placements]
        )


class _Collector:
    def __init__(self) -> None:
        self.state_changes: list[StateWrite] = []
        self.evictions: list[EvictionWrite] = []
        self.placements: list[PlacementWrite] = []
        self.allocation_states: list[AllocationStateChange] = []

    def move(self, record: WorkRecord, *states: str, reason: str | None = None) -> None:
        for state in states:
            self.state_changes.append(
                StateWrite(
                    work_id=record.work_id,
                    to_state=state,  # type: ignore[arg-type]
                    reason=reason,
                    expected_version=record.version if state == states[0] else None,
                )
            )

    def evict(
        self, record: WorkRecord, reason: str, *, retry_not_before: float | None = None
    ) -> None:
        self.evictions.append(
            EvictionWrite(
                work_id=record.work_id,
                reason=reason,
                expected_version=record.version,
                retry_not_before=retry_not_before,
            )
        )

    def allocation(self, allocation: AllocationRecord, running: bool) -> None:
        state: AllocationState = "running" if running else "assigned"
        if allocation.state != state:
            self.allocation_states.append(
                AllocationStateChange(allocation.work_id, allocation.member_index, state)
            )

    def result(self) -> AgentOutcomes:
        return AgentOutcomes(
            tuple(self.state_changes),
            tuple(self.evictions),
            tuple(self.placements),
            tuple(self.allocation_states),
        )


def _training(
    out: _Collector,
    record: WorkRecord,
    members: tuple[AllocationRecord, ...],
    nodes: Mapping[str, NodeRecord],
    lost: Mapping[str, str],
    now: float,
) -> None:
    workers = node_workers(members)
    gone = [node_id for node_id in workers if node_id in lost]
    if gone:
        reason = f"node {gone[0]} lost ({lost[gone[0]]})"
        out.evict(record, reason)
        return
    faults = [fault for allocation in members if (fault := _device_fault(allocation, nodes))]
    if faults:
        out.evict(record, faults[0])
        return
    entries: dict[str, ReportedTraining | None] = {}
    for node_id in workers:
        node = nodes.get(node_id)
        entries[node_id] = node.training_report(record.work_id, record.attempts) if node else None
    for node_id, entry in entries.items():
        for allocation in workers[node_id]:
            out.allocation(
                allocation, entry is not None and entry.state in ("running", "succeeded")
            )
    states = {node_id: (entry.state if entry else None) for node_id, entry in entries.items()}
    failed = [node_id for node_id, state in states.items() if state == "failed"]
    if failed:
        entry = entries[failed[0]]
        assert entry is not None
        reason = f"worker on {failed[0]} failed: {_reason(entry.reason)}"
        outcome = after_failure(record, reason, now)
        if isinstance(outcome, Retry):  # the job's retry policy runs it again
            out.evict(record, outcome.reason, retry_not_before=outcome.not_before)
        else:
            out.move(record, "failed", reason=outcome)
        return
    stopped = [node_id for node_id, state in states.items() if state == "stopped"]
    if stopped:
        entry = entries[stopped[0]]
        assert entry is not None
        reason = f"worker on {stopped[0]} stopped: {_reason(entry.reason) or 'by its agent'}"
        out.evict(record, reason)
        return
    started = [s for s in states.values() if s in ("running", "succeeded")]
    if len(started) == len(states) and all(s == "succeeded" for s in started):
        moves = ("running", "succeeded") if record.state == "scheduled" else ("succeeded",)
        out.move(record, *moves, reason="every worker exited 0")
    elif started and record.state == "scheduled":
        out.move(record, "running")


def _device_fault(allocation: AllocationRecord, nodes: Mapping[str, NodeRecord]) -> str | None:
    """Why `allocation` cannot go on where it is: a device of it its node reports unhealthy."""
    node = nodes.get(allocation.node_id)
    if node is None or not allocation.accelerator_ids:
        return None
    held = set(allocation.accelerator_ids)
    for accelerator in node.status.accelerators:
        if accelerator.id in held and not accelerator.healthy:
            health = _reason(accelerator.health) or "reported unhealthy"
            return f"{accelerator.id} on {allocation.node_id} failed: {health}"
    return None


def _inference(
    out: _Collector,
    record: WorkRecord,
    members: tuple[AllocationRecord, ...],
    nodes: Mapping[str, NodeRecord],
    lost: Mapping[str, str],
) -> None:
    faults = {a.allocation_id: fault for a in members if (fault := _device_fault(a, nodes))}
    kept = [
        allocation
        for allocation in members
        if allocation.node_id not in lost and allocation.allocation_id not in faults
    ]
    if len(kept) < len(members):
        dropped = sorted({a.node_id for a in members if a.node_id in lost})
        reason = (
            f"lost node {', '.join(dropped)} ({lost[dropped[0]]})"
            if dropped
            else next(iter(faults.values()))
        )
        if kept:
            out.placements.append(
                PlacementWrite(
                    work_id=record.work_id,
                    allocations=tuple(as_new_allocation(a) for a in kept),
                    reason=reason,
                    expected_version=record.version,
                )
            )
        else:
            out.evict(record, reason)
        return
    entries: list[tuple[AllocationRecord, ReportedDeployment | None]] = []
    for allocation in members:
        node = nodes.get(allocation.node_id)
        report = node.replica_report(record.work_id, allocation.member_index) if node else None
        entries.append((allocation, report))
    for allocation, entry in entries:
        out.allocation(allocation, entry is not None and entry.state == "ready")
    for allocation, entry in entries:
        if entry is not None and entry.state == "failed":
            out.move(
                record,
                "failed",
                reason=f"replica {allocation.member_index} on {allocation.node_id} failed: "
                f"{_reason(entry.reason)}",
            )
            return
    if record.state == "scheduled" and all(
        e is not None and e.state == "ready" for _, e in entries
    ):
        out.move(record, "running", reason=f"{len(entries)} replicas ready")


def agent_outcomes(
    records: Mapping[str, WorkRecord],
    allocations: Mapping[str, tuple[AllocationRecord, ...]],
    nodes: Mapping[str, NodeRecord],
    lost: Mapping[str, str],
    *,
    now: float,
) -> AgentOutcomes:
    """`lost`: node id -> why it counts as lost (`Liveness.lost_nodes`); `now`: UTC epoch
    seconds, from which a failed job's retry backoff runs."""
    out = _Collector()
    # Only placed work has members to hear from: walk the allocations, not the queue.
    for work_id in sorted(allocations):
        members = allocations[work_id]
        record = records.get(work_id)
        if record is None or record.state not in PLACED_STATES or not members:
            continue
        if record.kind == "training":
            _training(out, record, members, nodes, lost, now)
        else:
            _inference(out, record, members, nodes, lost)
    return out.result()
