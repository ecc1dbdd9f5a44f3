"""Registry records, stored work and allocations for the loop's unit tests."""

from __future__ import annotations

from typing import Any

import msgspec

from cloud.fleet.registry import NodeRecord
from cloud.store import AllocationRecord, WorkRecord
from shared.messages import (
    Accelerator,
    AcceleratorKind,
    HostInfo,
    NodeState,
    NodeStatus,
    ReportedDeployment,
    ReportedState,
    ReportedTraining,
    Site,
)
from shared.work_literals import WorkState


def device(kind: AcceleratorKind, index: int, **fields: Any) -> Accelerator:
    defaults: dict[str, Any] = {
        "vendor": "nvidia" if kind == "gpu" else "generic",
        "model": f"{kind}-model",
        "memory_bytes": 16 * 2**30,
        "compute_units": 8,
        "onnx_providers": ("CUDAExecutionProvider", "CPUExecutionProvider")
        if kind == "gpu"
        else ("CPUExecutionProvider",),
    }
    return Accelerator(id=f"{kind}{index}", kind=kind, **(defaults | fields))


def node(
    node_id: str,
    *,
    gpus: int = 4,
    site: Site = "cloud",
    state: NodeState = "online",
    labels: dict[str, str] | None = None,
    devices: tuple[Accelerator, ...] | None = None,
    training: tuple[ReportedTraining, ...] = (),
    deployments: tuple[ReportedDeployment, ...] = (),
    zone: str = "DE",
) -> NodeRecord:
    accelerators = devices or (device("cpu", 0), *(device("gpu", i) for i in range(gpus)))
    status = NodeStatus(
        node_id=node_id,
        state=state,
        instance_id="i1",
        agent_version="test",
        site=site,
        zone=zone,
        region="europe-west3",
        labels=labels or {},
        host=HostInfo(
            hostname=f"{node_id}.internal",
            os="Linux",
            arch="x86_64",
            cpu_logical_cores=16,
            memory_total_bytes=64 * 2**30,
        ),
        accelerators=accelerators,
        telemetry_interval_s=1.0,
        started_at=0.0,
        sent_at=0.0,
    )
    reported = ReportedState(
        node_id=node_id,
        instance_id="i1",
        observed_generation=1,
        reported_at=0.0,
        training=training,
        deployments=deployments,
    )
    return NodeRecord(
        status=status,
        state=state,
        offline_reason=None if state == "online" else "connection-lost",
        last_seen_monotonic=0.0,
        last_seen_at=0.0,
        reported=reported,
    )


def work(
    work_id: str,
    *,
    kind: str = "training",
    state: WorkState = "scheduled",
    attempts: int = 1,
    version: int = 2,
    **spec: Any,
) -> WorkRecord:
    document: dict[str, Any] = (
        {"name": work_id, "command": ["python", "train.py"], "estimated_duration_s": 60.0}
        if kind == "training"
        else {"kind": "deployment", "name": work_id, "model_id": "m1"}
    )
    return WorkRecord(
        work_id=work_id,
        tenant_id="t1",
        kind=kind,  # type: ignore[arg-type]
        spec=msgspec.json.encode(document | spec),
        priority="p1",
        state=state,
        state_reason=None,
        attempts=attempts,
        submitted_at=0.0,
        updated_at=0.0,
        idempotency_key=None,
        version=version,
    )


def allocation(
    work_id: str,
    member: int,
    node_id: str,
    devices: tuple[str, ...] = ("gpu0",),
    *,
    kind: str = "training",
) -> AllocationRecord:
    return AllocationRecord(
        work_id=work_id,
        member_index=member,
        node_id=node_id,
        accelerator_kind="gpu",
        accelerators=len(devices),
        accelerator_ids=devices,
        host_memory_bytes=0,
        started_at=0.0,
        expected_end=None,
        borrowed=False,
        state="assigned",
        tenant_id="t1",
        work_kind=kind,  # type: ignore[arg-type]
        priority="p1",
    )
