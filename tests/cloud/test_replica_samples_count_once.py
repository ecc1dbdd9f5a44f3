"""A node's serving sample with each replica's figures within it (schema 1.13): the
readers that add up a deployment's figures over its nodes (the tenants' /metrics, the
autoscaler) read the deployment's and count each request once."""

from __future__ import annotations

import dataclasses

from prometheus_client import CollectorRegistry

from cloud.fleet.inference_metrics import InferenceCollector, InferenceCounters
from cloud.fleet.registry import NodeRegistry
from cloud.loop.autoscale import ServingLoad
from cloud.loop.scaling import serving_load
from shared.messages import DeploymentSample, ReplicaSample, Telemetry
from tests.loop.builders import allocation
from tests.loop.test_disruption_budget import ready_on
from tests.usage.test_accountant import T0, Clock, birth
from tests.usage.test_metrics import samples


def two_replicas(deployment_id: str) -> DeploymentSample:
    """Two replicas on one node answered 30 and 10 of its 40 requests."""
    parts = tuple(
        ReplicaSample(
            replica=number, requests=requests, errors=1, rejected=0,
            requests_per_s=float(requests), latency_p95_ms=p95_ms,
        )
        for number, requests, p95_ms in ((0, 30, 40.0), (1, 10, 5.0))
    )  # fmt: skip
    return DeploymentSample(
        deployment_id=deployment_id, requests=40, errors=2, rejected=0, requests_per_s=40.0,
        latency_p95_ms=38.0, replicas=parts,
    )  # fmt: skip


def telemetry(node_id: str, seq: int, sample: DeploymentSample) -> Telemetry:
    return Telemetry(
        node_id=node_id, instance_id="i1", seq=seq, sampled_at=T0 + seq, interval_s=1.0,
        cpu_utilization_pct=5.0, memory_used_bytes=1, memory_total_bytes=2,
        deployments=(sample,),
    )  # fmt: skip


def test_the_tenants_serving_series_count_each_request_once() -> None:
    node_registry = NodeRegistry(wall_clock=Clock())
    node_registry.apply_status(birth(T0))
    counters = InferenceCounters()
    for seq in (1, 2):
        sample = telemetry("n1", seq, two_replicas("dep-1"))
        assert node_registry.apply_telemetry(sample) is None
        counters.observe(sample)
    registry = CollectorRegistry()
    registry.register(InferenceCollector(counters, node_registry, lambda work_id: "acme"))
    found = samples(registry)
    key = {"deployment": "dep-1", "tenant": "acme"}
    assert found["greenfed_inference_requests_total"] == [(key, 80.0)]
    assert found["greenfed_inference_errors_total"] == [(key, 4.0)]
    assert found["greenfed_inference_requests_per_second"] == [(key, 40.0)]


def test_the_autoscaler_reads_a_nodes_rate_once_for_all_its_replicas() -> None:
    members = tuple(
        allocation("detector", i, "a", (f"gpu{i}",), kind="inference") for i in range(2)
    )
    sampled = telemetry("a", 1, two_replicas("detector"))
    record = dataclasses.replace(ready_on("a", members), decoded_telemetry=sampled, telemetry_seq=1)
    assert serving_load("detector", members, {"a": record}) == ServingLoad(2, 40.0, 38.0)
