"""A deployment's replica views (`GET /v1/deployments/{id}`, `replica_states`) show each
replica its own serving figures where its agent sends them (1.13), and the node's
figures for the deployment from an older agent."""

from __future__ import annotations

import msgspec

from cloud.fleet.registry import NodeRegistry
from cloud.store import AllocationRecord
from cloud.work.views import replica_views
from shared.messages import DeploymentSample, ReplicaSample
from tests.cloud.test_registry import FakeClock, status, telemetry


def _allocation(member_index: int) -> AllocationRecord:
    return AllocationRecord(
        work_id="d1", member_index=member_index, node_id="n1", accelerator_kind="gpu",
        accelerators=1, accelerator_ids=(f"gpu{member_index}",), host_memory_bytes=0,
        started_at=0.0, expected_end=None, borrowed=False, state="running", tenant_id="t",
        work_kind="inference", priority="p1",
    )  # fmt: skip


def _registry_with(sample: DeploymentSample) -> NodeRegistry:
    clock = FakeClock()
    registry = NodeRegistry(monotonic=clock.monotonic, wall_clock=clock.wall)
    registry.apply_status(status("n1"))
    registry.apply_telemetry(msgspec.structs.replace(telemetry("n1"), deployments=(sample,)))
    return registry


def _replica(replica: int, requests: int, p95_ms: float) -> ReplicaSample:
    return ReplicaSample(
        replica=replica, requests=requests, errors=0, rejected=0,
        requests_per_s=requests / 5.0, latency_p95_ms=p95_ms,
    )  # fmt: skip


def test_each_replica_shows_its_own_figures() -> None:
    sample = DeploymentSample(
        deployment_id="d1", requests=60, errors=0, rejected=0, requests_per_s=12.0,
        latency_p95_ms=40.0, replicas=(_replica(0, 50, 2.0), _replica(1, 10, 45.0)),
    )  # fmt: skip
    views = replica_views("d1", [_allocation(0), _allocation(1)], _registry_with(sample))
    shown = {view.replica: view.serving for view in views}
    assert shown[0] is not None
    assert (shown[0].requests_per_s, shown[0].latency_p95_ms) == (10.0, 2.0)
    assert shown[1] is not None
    assert (shown[1].requests_per_s, shown[1].latency_p95_ms) == (2.0, 45.0)


def test_a_replica_without_figures_of_its_own_shows_none() -> None:
    sample = DeploymentSample(
        deployment_id="d1", requests=50, errors=0, rejected=0, requests_per_s=10.0,
        replicas=(_replica(0, 50, 2.0),),
    )  # fmt: skip
    views = replica_views("d1", [_allocation(0), _allocation(1)], _registry_with(sample))
    assert [view.serving is None for view in views] == [False, True]


def test_an_older_agents_figures_are_shown_for_each_replica_on_its_node() -> None:
    sample = DeploymentSample(
        deployment_id="d1", requests=60, errors=0, rejected=0, requests_per_s=12.0
    )
    views = replica_views("d1", [_allocation(0), _allocation(1)], _registry_with(sample))
    assert [view.serving.requests_per_s for view in views if view.serving] == [12.0, 12.0]
