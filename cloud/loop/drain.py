"""Draining nodes: what a pass does with the work on a node an admin is draining.

The node is cordoned, so nothing new lands there. Training on it is requeued (a job
that checkpoints resumes from its checkpoint, like any requeue). An inference replica
is replaced before it stops: its deployment may hold that many replicas more (the
surge) until as many replicas as it wants serve on other nodes; then the replicas on
the draining node are given back. A deployment with nowhere else to go keeps its
replica there (the drain waits, as a Kubernetes drain waits on a disruption budget).
A replacement serves once its node reports that replica ready (`serving_load`), not
when it is placed: one placed beside another replica of the deployment would count
at once, and the drain would stop the draining node's replica with nothing to take
over its requests.

A deployment with a `min_available` (its disruption budget) lets the drain go on as
soon as that many replicas serve elsewhere: the ones on the draining node are given
back then, and the queue tops the deployment up again. Until then the node stays
draining, and says what it waits for (`waiting`, shown with the node): "waiting:
detector would fall below min_available 2 (1 serving elsewhere)".
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass, field

from cloud.fleet.registry import NodeRecord
from cloud.loop.scaling import keep_replicas, serving_load
from cloud.store import AllocationRecord, EvictionWrite, PlacementWrite, WorkRecord
from cloud.work.specs import DeploymentSpec


@dataclass(slots=True)
class DrainPlan:
    evictions: list[EvictionWrite] = field(default_factory=list)
    releases: list[PlacementWrite] = field(default_factory=list)
    surge: dict[str, int] = field(default_factory=dict)  # deployment -> replacements wanted
    held: set[str] = field(default_factory=set)  # deployments the drain is handling
    # Per draining node, what keeps its drain from ending (one line per deployment).
    waiting: dict[str, list[str]] = field(default_factory=dict)

    @property
    def writes(self) -> bool:
        return bool(self.evictions or self.releases)


def draining_nodes(nodes: Mapping[str, NodeRecord]) -> frozenset[str]:
    return frozenset(
        node_id
        for node_id, record in nodes.items()
        if record.admin is not None and record.admin.draining
    )


def plan_drain(
    records: Mapping[str, WorkRecord],
    allocations: Mapping[str, tuple[AllocationRecord, ...]],
    deployments: Mapping[str, DeploymentSpec],
    nodes: Mapping[str, NodeRecord],
    draining: Set[str],
) -> DrainPlan:
    plan = DrainPlan()
    if not draining:
        return plan
    for work_id, members in allocations.items():
        on_drain = [m for m in members if m.node_id in draining]
        record = records.get(work_id)
        if not on_drain or record is None:
            continue
        spec = deployments.get(work_id)
        if spec is None:
            names = ", ".join(sorted({m.node_id for m in on_drain}))
            plan.evictions.append(
                EvictionWrite(
                    work_id=work_id,
                    reason=f"node {names} drained",
                    expected_version=record.version,
                )
            )
            continue
        plan.held.add(work_id)
        elsewhere = [m for m in members if m.node_id not in draining]
        load = serving_load(work_id, elsewhere, nodes)
        serving = load.ready_replicas if load is not None else 0
        budget = spec.min_available
        if serving >= spec.replicas or (budget is not None and serving >= budget):
            plan.releases.append(
                keep_replicas(record, spec.replicas, elsewhere, "replicas moved off a drained node")
            )
            continue
        plan.surge[work_id] = len(on_drain)
        reason = _waiting_reason(spec, serving)
        for node_id in sorted({m.node_id for m in on_drain}):
            plan.waiting.setdefault(node_id, []).append(reason)
    return plan


def _waiting_reason(spec: DeploymentSpec, serving: int) -> str:
    if spec.min_available is not None:
        return (
            f"waiting: {spec.name} would fall below min_available {spec.min_available} "
            f"({serving} serving elsewhere)"
        )
    return (
        f"waiting: {spec.name} has {serving} of {spec.replicas} replicas serving elsewhere; "
        "its replacements start first"
    )
