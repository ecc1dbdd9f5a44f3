"""Assignments a node was sent but never acknowledged: republished, then requeued.

A node acknowledges an allocation by listing it in its `reported` document, in any
state (a training worker by job id and attempt, a replica by deployment id and
number). One that does not, while it is online and the control plane is on the
broker, may never have received its `desired` document (a broker that lost it, an
agent that refused it, a document dropped on the floor): after
`assignment_timeout_s` the node's newest document is published again, and after
twice that the work is requeued with a reason, so nothing sits `scheduled` for ever
on a node that is not running it.

The clocks start when this leader first sees an allocation unacknowledged, not when
the allocation was made: a control plane that restarts, or takes leadership over, and
reads old allocations gives each node a full timeout before it judges. Nodes that
are offline are not judged here; losing them is cloud/fleet/liveness.py's call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from cloud.fleet.registry import NodeRecord
from cloud.loop.allocations import as_new_allocation
from cloud.store import AllocationRecord, EvictionWrite, PlacementWrite, WorkRecord
from cloud.store.states import PLACED_STATES

# (work id, attempt, member index, node id): a new attempt or a move is a new clock.
_Key = tuple[str, int, int, str]


@dataclass(frozen=True, slots=True)
class Unacknowledged:
    """What one pass does about assignments nobody acknowledged."""

    republish: frozenset[str] = frozenset()  # nodes whose desired document goes out again
    evictions: tuple[EvictionWrite, ...] = ()
    placements: tuple[PlacementWrite, ...] = ()  # deployments that keep their other replicas

    @property
    def changes_work(self) -> bool:
        return bool(self.evictions or self.placements)


def acknowledged(allocation: AllocationRecord, record: WorkRecord, node: NodeRecord) -> bool:
    """Listed in the report of the node's current agent: a report the previous instance
    left (an agent killed and restarted) says nothing of what runs now."""
    if node.reported is None or node.reported.instance_id != node.status.instance_id:
        return False
    if record.kind == "training":
        return node.training_report(record.work_id, record.attempts) is not None
    return node.replica_report(record.work_id, allocation.member_index) is not None


@dataclass
class AssignmentWatch:
    """Per-leader clocks of unacknowledged allocations."""

    timeout_s: float
    monotonic: Callable[[], float]
    _since_s: dict[_Key, float] = field(default_factory=dict)
    _republished: set[_Key] = field(default_factory=set)

    def reset(self) -> None:
        """Leadership ended: the next leader starts its own clocks."""
        self._since_s.clear()
        self._republished.clear()

    def check(
        self,
        records: Mapping[str, WorkRecord],
        allocations: Mapping[str, tuple[AllocationRecord, ...]],
        nodes: Mapping[str, NodeRecord],
        *,
        listening: bool,
        settled: Iterable[str] = (),
    ) -> Unacknowledged:
        """`listening`: the control plane is on the broker (else nothing is judged and
        every clock restarts, as liveness does). `settled`: work this pass already
        changes for other reasons, left alone here."""
        if not listening:
            self.reset()
            return Unacknowledged()
        now_s = self.monotonic()
        skip = set(settled)
        seen: set[_Key] = set()
        republish: set[str] = set()
        overdue: dict[str, list[AllocationRecord]] = {}
        for work_id, members in sorted(allocations.items()):
            record = records.get(work_id)
            if record is None or record.state not in PLACED_STATES or work_id in skip:
                continue
            for allocation in members:
                node = nodes.get(allocation.node_id)
                if node is None or node.state != "online" or acknowledged(allocation, record, node):
                    continue
                key = (work_id, record.attempts, allocation.member_index, allocation.node_id)
                seen.add(key)
                waited_s = now_s - self._since_s.setdefault(key, now_s)
                if waited_s >= 2 * self.timeout_s:
                    overdue.setdefault(work_id, []).append(allocation)
                elif waited_s >= self.timeout_s and key not in self._republished:
                    self._republished.add(key)
                    republish.add(allocation.node_id)
        for key in set(self._since_s) - seen:
            del self._since_s[key]
        self._republished &= seen
        evictions: list[EvictionWrite] = []
        placements: list[PlacementWrite] = []
        for work_id, silent in overdue.items():
            record = records[work_id]
            silent_nodes = sorted({a.node_id for a in silent})
            reason = (
                f"node {', '.join(silent_nodes)} did not acknowledge its assignment within "
                f"{2 * self.timeout_s:g} s"
            )
            kept = [a for a in allocations[work_id] if a not in silent]
            if record.kind == "inference" and kept:
                placements.append(
                    PlacementWrite(
                        work_id=work_id,
                        allocations=tuple(as_new_allocation(a) for a in kept),
                        reason=reason,
                        expected_version=record.version,
                    )
                )
            else:  # a gang runs whole or not at all
                evictions.append(
                    EvictionWrite(work_id=work_id, reason=reason, expected_version=record.version)
                )
        return Unacknowledged(frozenset(republish), tuple(evictions), tuple(placements))
