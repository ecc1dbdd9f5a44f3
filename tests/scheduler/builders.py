"""Terse constructors for scheduler test scenarios."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cloud.scheduler import (
    AcceleratorPool,
    Allocation,
    Candidates,
    Cohort,
    InferenceDeployment,
    Node,
    Plan,
    Policy,
    Snapshot,
    Taint,
    Tenant,
    TrainingJob,
    Work,
    schedule,
)
from cloud.scheduler.arrays import FloatArray
from shared.messages import AcceleratorKind, Site
from shared.work_literals import PriorityClass

GIB = 1 << 30
NOW = 1_700_000_000.0  # 2023-11-14T22:13:20Z


def gpu_node(
    node_id: str,
    count: int = 8,
    *,
    model: str = "A100",
    speed: float = 1.0,
    site: Site = "cloud",
    region: str = "eu",
    zone: str = "DE",
    memory_gib: int = 80,
    utilisation: float = 0.0,
    labels: Mapping[str, str] | None = None,
    taints: tuple[Taint, ...] = (),
    healthy: bool = True,
    utc_offset_minutes: int = 0,
    timezone: str | None = None,
    host_memory_gib: int = 0,
    providers: tuple[str, ...] = ("CUDAExecutionProvider",),
    cpu_cores: int = 0,
) -> Node:
    gpus = AcceleratorPool(
        kind="gpu",
        count=count,
        model=model,
        memory_bytes=memory_gib * GIB,
        relative_speed=speed,
        onnx_providers=providers,
        utilisation=utilisation,
    )
    cpus = AcceleratorPool(
        kind="cpu",
        count=cpu_cores,
        model="x86",
        memory_bytes=host_memory_gib * GIB,
        relative_speed=0.02,
        onnx_providers=("CPUExecutionProvider",),
    )
    return Node(
        node_id=node_id,
        site=site,
        zone=zone,
        region=region,
        labels=dict(labels or {}),
        taints=taints,
        healthy=healthy,
        utc_offset_minutes=utc_offset_minutes,
        timezone=timezone,
        host_memory_bytes=host_memory_gib * GIB,
        pools=(gpus, cpus) if cpu_cores else (gpus,),
    )


def edge_node(
    node_id: str,
    *,
    kind: AcceleratorKind = "npu",
    count: int = 1,
    region: str = "edge-a",
    providers: tuple[str, ...] = ("QNNExecutionProvider", "CPUExecutionProvider"),
    memory_gib: int = 8,
    speed: float = 0.2,
    cpu_cores: int = 0,
    labels: Mapping[str, str] | None = None,
    healthy: bool = True,
) -> Node:
    pools = [
        AcceleratorPool(
            kind=kind,
            count=count,
            model=f"{kind}-model",
            memory_bytes=memory_gib * GIB,
            relative_speed=speed,
            onnx_providers=providers,
        )
    ]
    if cpu_cores and kind != "cpu":
        pools.append(
            AcceleratorPool(
                kind="cpu",
                count=cpu_cores,
                model="arm",
                memory_bytes=memory_gib * GIB,
                relative_speed=0.02,
                onnx_providers=("CPUExecutionProvider",),
            )
        )
    return Node(
        node_id=node_id,
        site="edge",
        zone="DE",
        region=region,
        labels=dict(labels or {}),
        healthy=healthy,
        pools=tuple(pools),
    )


def job(
    work_id: str,
    gpus: int = 1,
    *,
    workers: int = 1,
    tenant: str = "team-a",
    priority: PriorityClass = "p1",
    submitted_at: float = 0.0,
    duration_s: float = 3600.0,
    **extra: Any,
) -> TrainingJob:
    return TrainingJob(
        work_id=work_id,
        tenant=tenant,
        priority=priority,
        submitted_at=submitted_at,
        workers=workers,
        accelerators_per_worker=gpus,
        duration_s=duration_s,
        **extra,
    )


def deployment(
    work_id: str,
    *,
    replicas: int = 1,
    tenant: str = "team-a",
    priority: PriorityClass = "p0",
    kinds: tuple[AcceleratorKind, ...] = ("npu", "gpu", "cpu"),
    submitted_at: float = 0.0,
    **extra: Any,
) -> InferenceDeployment:
    return InferenceDeployment(
        work_id=work_id,
        tenant=tenant,
        priority=priority,
        replicas=replicas,
        accepted_kinds=kinds,
        submitted_at=submitted_at,
        **extra,
    )


def running(
    allocation_id: str,
    node_id: str,
    gpus: int = 1,
    *,
    tenant: str = "team-b",
    priority: PriorityClass = "p2",
    preemptible: bool = True,
    started_at: float = NOW - 600,
    expected_end: float | None = NOW + 3600,
    kind: AcceleratorKind = "gpu",
    work_id: str | None = None,
    work_kind: str = "training",
    group: str | None = None,
    anti_affinity_groups: tuple[str, ...] = (),
    borrowed: bool = False,
    host_memory_bytes: int = 0,
    cpu_cores: int = 0,
) -> Allocation:
    return Allocation(
        allocation_id=allocation_id,
        work_id=work_id or allocation_id,
        work_kind="training" if work_kind == "training" else "inference",
        tenant=tenant,
        priority=priority,
        preemptible=preemptible,
        node_id=node_id,
        accelerator_kind=kind,
        accelerators=gpus,
        started_at=started_at,
        expected_end=expected_end,
        group=group,
        anti_affinity_groups=anti_affinity_groups,
        borrowed=borrowed,
        host_memory_bytes=host_memory_bytes,
        cpu_cores=cpu_cores,
    )


def snapshot(
    nodes: Sequence[Node],
    queue: Sequence[Work] = (),
    allocations: Sequence[Allocation] = (),
    tenants: Sequence[Tenant] = (),
    now: float = NOW,
) -> Snapshot:
    return Snapshot.build(
        now=now, nodes=nodes, allocations=allocations, queue=queue, tenants=tenants
    )


def plan_for(
    nodes: Sequence[Node],
    queue: Sequence[Work] = (),
    allocations: Sequence[Allocation] = (),
    tenants: Sequence[Tenant] = (),
    policy: Policy | None = None,
    now: float = NOW,
) -> Plan:
    return schedule(snapshot(nodes, queue, allocations, tenants, now), policy or Policy())


def nodes_of(plan: Plan, work_id: str) -> list[str]:
    return [p.node_id for p in plan.placements_for(work_id)]


@dataclass(frozen=True, slots=True)
class LatencyByRegion:
    """A fake ``LatencyEstimator``: a fixed latency per node region, 0 where not listed."""

    ms: Mapping[str, float]

    def estimate_ms(
        self, snapshot: Snapshot, deployment: InferenceDeployment, candidates: Candidates
    ) -> FloatArray:
        nodes = snapshot.nodes
        per_region = np.array([self.ms.get(region, 0.0) for region in nodes.regions])
        result: FloatArray = per_region[nodes.region_code[candidates.nodes]]
        return result


def plan_on_npus(
    nodes_npus: Sequence[int],
    queue: Sequence[Work],
    allocations: Sequence[Allocation],
    tenants: Sequence[Tenant],
    cohorts: Sequence[Cohort] = (),
    labels: dict[int, dict[str, str]] | None = None,
) -> Plan:
    """The plan of a fleet of edge nodes with `nodes_npus` NPUs each (`labels` by index)."""
    snapshot = Snapshot.build(
        now=NOW,
        nodes=[
            edge_node(f"e{i}", count=count, labels=(labels or {}).get(i))
            for i, count in enumerate(nodes_npus)
        ],
        allocations=allocations,
        queue=queue,
        tenants=tenants,
        cohorts=cohorts,
    )
    return schedule(snapshot, Policy())


def npu_replica(
    allocation_id: str,
    node_id: str,
    npus: int = 1,
    *,
    tenant: str,
    priority: PriorityClass,
    started_at: float = NOW - 600,
    preemptible: bool = True,
) -> Allocation:
    """An NPU replica already running (the reclaim tests' shape)."""
    return running(
        allocation_id,
        node_id,
        npus,
        kind="npu",
        tenant=tenant,
        priority=priority,
        work_id=allocation_id.split("/")[0],
        work_kind="inference",
        expected_end=None,
        started_at=started_at,
        preemptible=preemptible,
    )
