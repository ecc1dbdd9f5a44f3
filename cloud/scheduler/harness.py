"""Simulated time around the scheduler core (Nomad's ``scheduler/testing.go`` idea).

``SimulatedCluster`` keeps the running allocations and the queue, builds a
snapshot at the fake clock's time, runs ``schedule`` and applies the plan as a
control plane would: placements start, victims stop and go back to the queue,
work finishes when its (simulated) run time is over, and tests can fail work or
lose nodes. Used by the tests now and by the fleet simulator later.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from .core import schedule
from .model import Allocation, InferenceDeployment, Tenant, TrainingJob, Work
from .plan import Placement, Plan
from .policy import DEFAULT_POLICY, Policy
from .snapshot import Node, Snapshot

EventKind = Literal[
    "submitted", "started", "finished", "failed", "preempted", "node-lost", "node-restored"
]


class FakeClock:
    """Time that moves only when told to."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError("time does not go backwards")
        self._now += seconds
        return self._now

    def set(self, when: float) -> None:
        if when < self._now:
            raise ValueError("time does not go backwards")
        self._now = float(when)


@dataclass(frozen=True, slots=True)
class SimEvent:
    at: float
    kind: EventKind
    work_id: str | None = None
    node_id: str | None = None
    detail: str = ""


# Actual run time of a placement; by default exactly what the scheduler expected.
RuntimeModel = Callable[[Placement], float | None]


def _expected_runtime(placement: Placement) -> float | None:
    if placement.expected_end is None:
        return None
    return placement.expected_end - placement.start_at


class SimulatedCluster:
    def __init__(
        self,
        nodes: Sequence[Node],
        *,
        tenants: Sequence[Tenant] = (),
        policy: Policy = DEFAULT_POLICY,
        clock: FakeClock | None = None,
        runtime: RuntimeModel = _expected_runtime,
    ) -> None:
        self.clock = clock if clock is not None else FakeClock()
        self.policy = policy
        self.tenants = tuple(tenants)
        self._runtime = runtime
        self._nodes = {node.node_id: node for node in nodes}
        self.running: dict[str, Allocation] = {}
        self._ends: dict[str, float] = {}  # work id -> when it finishes (training)
        self.queue: dict[str, Work] = {}
        self._submitted: dict[str, Work] = {}  # as first submitted, for requeueing
        self.events: list[SimEvent] = []
        self.plans: list[Plan] = []
        self.first_started: dict[str, float] = {}
        self.finished: dict[str, float] = {}

    @property
    def now(self) -> float:
        return self.clock.now()

    def _log(
        self,
        kind: EventKind,
        work_id: str | None = None,
        node_id: str | None = None,
        detail: str = "",
    ) -> None:
        self.events.append(SimEvent(self.now, kind, work_id, node_id, detail))

    # -- inputs -------------------------------------------------------------------

    def submit(self, work: Work) -> None:
        """Queue work, stamped with the current time."""
        stamped = dataclasses.replace(work, submitted_at=self.now)
        self._submitted[work.work_id] = stamped
        self._enqueue(stamped)
        self._log("submitted", work.work_id)

    def _enqueue(self, work: Work) -> None:
        queued = self.queue.get(work.work_id)
        if isinstance(work, InferenceDeployment) and isinstance(queued, InferenceDeployment):
            work = dataclasses.replace(
                queued, replicas=queued.replicas + work.replicas, min_replicas=None
            )
        self.queue[work.work_id] = work

    def snapshot(self) -> Snapshot:
        return Snapshot.build(
            now=self.now,
            nodes=list(self._nodes.values()),
            allocations=list(self.running.values()),
            queue=list(self.queue.values()),
            tenants=self.tenants,
        )

    # -- one scheduling pass --------------------------------------------------------

    def schedule(self) -> Plan:
        plan = schedule(self.snapshot(), self.policy)
        self.plans.append(plan)
        for preemption in plan.preemptions:
            victim = self.running.get(preemption.allocation_id)
            if victim is not None:
                self._stop(victim, "preempted", requeue=True)
        by_work: dict[str, list[Placement]] = {}
        for placement in plan.placements:
            by_work.setdefault(placement.work_id, []).append(placement)
        for work_id, placements in by_work.items():
            self._start(work_id, placements)
        return plan

    def _start(self, work_id: str, placements: Sequence[Placement]) -> None:
        work = self._dequeue(work_id, len(placements))
        runtimes = []
        for placement in placements:
            self.running[placement.allocation_id] = placement.to_allocation()
            runtimes.append(self._runtime(placement))
            self._log("started", work_id, placement.node_id)
        self.first_started.setdefault(work_id, self.now)
        if isinstance(work, TrainingJob):
            # Synchronous training: the gang finishes with its slowest worker.
            known = [r for r in runtimes if r is not None]
            if known:
                self._ends[work_id] = self.now + max(known)

    def _dequeue(self, work_id: str, started: int) -> Work | None:
        """Take ``started`` members of the queued work out of the queue: a job whole; a
        deployment's replicas not started stay queued (the rest of a partly placed one,
        and replicas evicted in the same pass, merged into its entry by ``_requeue``)."""
        work = self.queue.pop(work_id, None)
        if isinstance(work, InferenceDeployment) and work.replicas > started:
            # Any further replica helps a deployment that runs some already.
            self.queue[work_id] = dataclasses.replace(
                work, replicas=work.replicas - started, min_replicas=1
            )
        return work

    def _stop(self, alloc: Allocation, kind: EventKind, *, requeue: bool) -> None:
        """Stop one allocation; a training gang stops whole."""
        if alloc.work_kind == "training":
            members = [a for a in self.running.values() if a.work_id == alloc.work_id]
        else:
            members = [alloc]
        for member in members:
            del self.running[member.allocation_id]
            self._log(kind, member.work_id, member.node_id)
        self._ends.pop(alloc.work_id, None)
        if requeue:
            self._requeue(alloc, len(members))

    def _requeue(self, alloc: Allocation, members: int) -> None:
        original = self._submitted.get(alloc.work_id)
        if original is None:
            return
        if isinstance(original, InferenceDeployment):
            self._enqueue(dataclasses.replace(original, replicas=members, min_replicas=None))
        else:
            self._enqueue(original)

    # -- time and failures -----------------------------------------------------------

    def advance(self, seconds: float) -> None:
        """Move time forward, finishing work in order of its end time."""
        target = self.now + seconds
        while True:
            due = sorted((end, work_id) for work_id, end in self._ends.items() if end <= target)
            if not due:
                break
            end, work_id = due[0]
            self.clock.set(max(end, self.now))
            self._finish(work_id)
        self.clock.set(target)

    def _finish(self, work_id: str) -> None:
        for alloc in [a for a in self.running.values() if a.work_id == work_id]:
            del self.running[alloc.allocation_id]
            self._log("finished", work_id, alloc.node_id)
        self._ends.pop(work_id, None)
        self.finished[work_id] = self.now

    def fail(self, work_id: str, *, requeue: bool = True) -> None:
        """The work crashed: all its allocations stop; by default it is retried."""
        allocs = [a for a in self.running.values() if a.work_id == work_id]
        for alloc in allocs:
            if alloc.allocation_id in self.running:
                self._stop(alloc, "failed", requeue=requeue)

    def lose_node(self, node_id: str) -> None:
        """The node drops out: it turns unhealthy and everything on it fails and requeues."""
        self._nodes[node_id] = dataclasses.replace(self._nodes[node_id], healthy=False)
        self._log("node-lost", node_id=node_id)
        for alloc in [a for a in self.running.values() if a.node_id == node_id]:
            if alloc.allocation_id in self.running:
                self._stop(alloc, "failed", requeue=True)

    def add_node(self, node: Node) -> None:
        """A device joins (or re-registers with a new inventory)."""
        self._nodes[node.node_id] = node
        self._log("node-restored", node_id=node.node_id, detail="joined")

    def restore_node(self, node_id: str) -> None:
        self._nodes[node_id] = dataclasses.replace(self._nodes[node_id], healthy=True)
        self._log("node-restored", node_id=node_id)

    def run(
        self,
        *,
        until: float,
        step_s: float,
        arrivals: Callable[[float], Iterable[Work]] | None = None,
    ) -> None:
        """Alternate scheduling passes and time steps until ``until``."""
        while self.now < until:
            if arrivals is not None:
                for work in arrivals(self.now):
                    self.submit(work)
            self.schedule()
            self.advance(min(step_s, until - self.now))
