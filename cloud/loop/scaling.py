"""A pass's scaling step: autoscaled deployments get their new replica count, and a
deployment with more replicas than its spec asks for gives the surplus back.

Scaling up needs nothing more: a placed deployment short of replicas is queued for
the missing ones (cloud/loop/inputs.py). Scaling down keeps the replicas that serve:
those not yet running go first, then the highest replica numbers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import msgspec

from cloud.fleet.registry import NodeRecord
from cloud.loop.allocations import as_new_allocation
from cloud.loop.autoscale import ScaleDecision, ServingLoad
from cloud.store import AllocationRecord, NewEvent, PlacementWrite, WorkRecord
from cloud.work.specs import CanarySpec, DeploymentSpec
from cloud.work.views import SCALED_EVENT
from shared.messages import ReportedDeployment


def current_report(
    record: NodeRecord | None, deployment_id: str, member_index: int
) -> ReportedDeployment | None:
    """What the node's current agent instance last said of one replica (None: nothing).
    The registry keeps a node's report when a new agent instance starts, until that one
    reports: the old one's speaks for runs now gone."""
    reported = record.reported if record is not None else None
    if record is None or reported is None or reported.instance_id != record.status.instance_id:
        return None
    return record.replica_report(deployment_id, member_index)


def replica_ready(record: NodeRecord | None, deployment_id: str, member_index: int) -> bool:
    """Whether one replica serves now: its node is online (an offline node's record keeps
    its last report and sample) and its current agent instance reports the replica
    ready."""
    if record is None or record.state != "online":
        return False
    report = current_report(record, deployment_id, member_index)
    return report is not None and report.state == "ready"


def serving_load(
    deployment_id: str,
    allocations: Sequence[AllocationRecord],
    nodes: Mapping[str, NodeRecord],
) -> ServingLoad | None:
    """What the deployment's ready replicas last said of its serving (None: none ready,
    or none of their nodes sent figures yet).

    Readiness is per replica, not per node: a replacement placed on a node that already
    serves another replica is not ready until its own report says so. A node's figures
    are those of all its replicas of the deployment, and count once with its ready ones:
    the autoscaler divides the rate by the ready replicas."""
    ready_on_node = Counter(
        a.node_id
        for a in allocations
        if replica_ready(nodes.get(a.node_id), deployment_id, a.member_index)
    )
    rate, worst_p95, ready = 0.0, None, 0
    for node_id in sorted(ready_on_node):
        sample = nodes[node_id].serving_sample(deployment_id)
        if sample is None:
            continue  # no figures yet: its load is unknown, so are its replicas
        ready += ready_on_node[node_id]
        rate += sample.requests_per_s
        if sample.latency_p95_ms is not None:
            worst_p95 = max(worst_p95 or 0.0, sample.latency_p95_ms)
    return ServingLoad(ready, rate, worst_p95) if ready else None


def scaled_spec(spec: DeploymentSpec, replicas: int) -> DeploymentSpec:
    """The spec with `replicas`; a partial-placement floor or a disruption budget
    (`min_available`) above it comes down with it: scaling is not a disruption. So does
    a rollout's canary, in proportion (`scaled_canary`)."""
    floor, budget = spec.min_replicas, spec.min_available
    canary = spec.canary
    return msgspec.structs.replace(
        spec,
        replicas=replicas,
        min_replicas=None if floor is None else min(floor, replicas),
        min_available=None if budget is None else min(budget, replicas),
        canary=None if canary is None else scaled_canary(canary, spec.replicas, replicas),
    )


def scaled_canary(canary: CanarySpec, from_replicas: int, to_replicas: int) -> CanarySpec:
    """A rollout's canary once its deployment goes from `from_replicas` to `to_replicas`:
    on fewer, down in proportion (rounded down, at least one), so that it never serves a
    larger share than was asked (2 of 6 on 3 replicas is 1, not 2 of 3); on more, as it
    is (its share only falls). Always below `to_replicas` where 2 or more remain (one
    keeps the model); with fewer the rollout ends (cloud/loop/rollout.py)."""
    if to_replicas >= from_replicas:
        return canary
    count = max(1, min(canary.replicas * to_replicas // from_replicas, to_replicas - 1))
    return msgspec.structs.replace(canary, replicas=count)


def scaled_event(record: WorkRecord, decision: ScaleDecision) -> NewEvent:
    payload = {
        "work_id": record.work_id,
        "from_replicas": decision.from_replicas,
        "to_replicas": decision.to_replicas,
        "metric": decision.metric,
        "observed": decision.observed,
        "target": decision.target,
        "recommendation": decision.recommendation,
        "carbon_cap": decision.carbon_cap,
        "reason": decision.reason,
    }
    return NewEvent(
        kind=SCALED_EVENT,
        payload=msgspec.json.encode(payload),
        tenant_id=record.tenant_id,
        work_id=record.work_id,
    )


def keep_replicas(
    record: WorkRecord, replicas: int, allocations: Sequence[AllocationRecord], reason: str
) -> PlacementWrite:
    """The deployment down to at most `replicas` of `allocations`: those running first,
    then the lowest replica numbers."""
    ordered = sorted(allocations, key=lambda a: (a.state != "running", a.member_index))
    kept = sorted(ordered[:replicas], key=lambda a: a.member_index)
    return PlacementWrite(
        work_id=record.work_id,
        allocations=tuple(as_new_allocation(a) for a in kept),
        reason=reason,
        expected_version=record.version,
    )


def surplus_write(
    record: WorkRecord, replicas: int, allocations: Sequence[AllocationRecord]
) -> PlacementWrite | None:
    """The allocations a deployment keeps when it holds more than `replicas`."""
    if len(allocations) <= replicas:
        return None
    return keep_replicas(record, replicas, allocations, f"scaled down to {replicas} replica(s)")
