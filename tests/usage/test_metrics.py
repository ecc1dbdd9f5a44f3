"""Usage, grid, zone-load and serving series on /metrics (cloud/usage/metrics.py,
cloud/fleet/inference_metrics.py)."""

from __future__ import annotations

import asyncio

import msgspec
import numpy as np
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cloud.fleet.assignments import AssignmentIndex
from cloud.fleet.inference_metrics import InferenceCollector, InferenceCounters
from cloud.fleet.registry import NodeRegistry
from cloud.signals.grid import GridSignals, ZoneSeries
from cloud.store import StoreSnapshot, TenantRecord, UsageHour
from cloud.usage.accountant import Accountant, TenantTotals
from cloud.usage.metrics import GridCollector, UsageCollector
from shared.messages import DeploymentSample, Telemetry
from shared.settings import UsageSettings
from tests.usage.test_accountant import T0, Clock, birth, snapshot

HOUR_S = 3600.0


def samples(registry: CollectorRegistry) -> dict[str, list[tuple[dict[str, str], float]]]:
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((sample.labels, sample.value))
    return found


def test_tenants_usage_the_grid_and_the_load_by_zone() -> None:
    clock = Clock()
    node_registry = NodeRegistry(wall_clock=clock)
    node_registry.apply_status(birth(T0))
    accountant = Accountant(None, node_registry, UsageSettings(), clock=clock)  # type: ignore[arg-type]
    start = T0 - T0 % HOUR_S
    series = ZoneSeries(
        zone="DE", start_s=start, carbon_g_per_kwh=np.array([420.0, 180.0]),
        price_per_mwh=np.array([95.0, np.nan]), currency="EUR", stale=True,
    )  # fmt: skip
    tenants = (
        TenantRecord(
            tenant_id="t1", name="acme", quotas={}, borrowing_limit={}, cohort=None,
            allowed_priorities=("p0", "p1", "p2"), admin=False, created_at=0.0,
        ),
    )  # fmt: skip
    accountant.note_pass(
        StoreSnapshot(tenants=tenants, work=(), allocations=snapshot().allocations,
                      node_generations={}),
        GridSignals(now_s=T0, zones={"DE": series}),
    )  # fmt: skip
    row = UsageHour(
        work_id="job-1", member_index=0, node_id="n1", hour_start=start, tenant_id="t1",
        work_kind="training", zone="DE", accelerator_kind="gpu", energy_j=7.2e6,
        measured_j=7.2e6, gap_s=0.0, gco2_g=840.0, cost=0.19, currency="EUR",
        counterfactual_gco2_g=1000.0, fallback=False,
    )  # fmt: skip
    totals = TenantTotals()
    totals.add(row)
    accountant.totals[("t1", "DE", "EUR")] = totals
    registry = CollectorRegistry()
    registry.register(UsageCollector(accountant))
    registry.register(GridCollector(accountant, node_registry, lambda zone: T0 - 1800.0))
    found = samples(registry)
    tenant_zone = {"tenant": "acme", "zone": "DE"}
    assert found["greenfed_usage_energy_kwh_total"] == [(tenant_zone, 2.0)]
    assert found["greenfed_usage_emissions_grams_total"] == [(tenant_zone, 840.0)]
    # Emissions avoided: the baseline's minus the work's, over the usage that has one.
    assert found["greenfed_usage_counterfactual_emissions_grams_total"] == [(tenant_zone, 1000.0)]
    assert found["greenfed_usage_emissions_with_counterfactual_grams_total"] == [
        (tenant_zone, 840.0)
    ]
    assert found["greenfed_usage_cost_total"] == [({**tenant_zone, "currency": "EUR"}, 0.19)]
    assert found["greenfed_grid_carbon_intensity_grams_per_kwh"] == [
        ({"zone": "DE", "signal_type": "average"}, 420.0)
    ]
    assert found["greenfed_grid_price_per_mwh"] == [({"zone": "DE", "currency": "EUR"}, 95.0)]
    assert found["greenfed_grid_signal_stale"] == [({"zone": "DE"}, 1.0)]
    assert found["greenfed_grid_signal_age_seconds"] == [({"zone": "DE"}, 1800.0)]
    assert found["greenfed_zone_accelerators_allocated"] == [({"zone": "DE", "kind": "gpu"}, 1.0)]

    # A replica that lost leadership exports none of the leader's grid and load: kept,
    # its last pass's allocations would be summed beside the new leader's, and a stale
    # signal's alert held firing. Leading again, they are back.
    leading = asyncio.Event()
    follower = CollectorRegistry()
    follower.register(GridCollector(accountant, node_registry, lambda zone: T0, leading))
    assert not {
        name for name in samples(follower) if name.startswith(("greenfed_grid_", "greenfed_zone_"))
    }
    leading.set()
    assert samples(follower)["greenfed_zone_accelerators_allocated"] == [
        ({"zone": "DE", "kind": "gpu"}, 1.0)
    ]


def serving(node_id: str, seq: int, requests: int, p95_ms: float) -> Telemetry:
    return Telemetry(
        node_id=node_id, instance_id="i1", seq=seq, sampled_at=T0 + seq, interval_s=1.0,
        cpu_utilization_pct=5.0, memory_used_bytes=1, memory_total_bytes=2,
        deployments=(DeploymentSample(
            deployment_id="dep-1", requests=requests, errors=1, rejected=0,
            requests_per_s=float(requests), latency_p50_ms=p95_ms / 2, latency_p95_ms=p95_ms,
        ),),
    )  # fmt: skip


def test_serving_counters_add_up_every_sample_and_quantiles_are_the_worst_replicas() -> None:
    clock = Clock()
    node_registry = NodeRegistry(wall_clock=clock)
    node_registry.apply_status(birth(T0))
    counters = InferenceCounters()
    for sample in (serving("n1", 1, 10, 20.0), serving("n1", 2, 30, 40.0)):
        assert node_registry.apply_telemetry(sample) is None
        counters.observe(sample)
    registry = CollectorRegistry()
    registry.register(InferenceCollector(counters, node_registry, lambda work_id: "acme"))
    found = samples(registry)
    key = {"deployment": "dep-1", "tenant": "acme"}
    assert found["greenfed_inference_requests_total"] == [(key, 40.0)]
    assert found["greenfed_inference_errors_total"] == [(key, 2.0)]
    assert found["greenfed_inference_requests_per_second"] == [(key, 30.0)]
    latency = {s[0]["quantile"]: s[1] for s in found["greenfed_inference_latency_milliseconds"]}
    assert latency == {"0.5": 20.0, "0.95": 40.0}


def test_a_node_counts_only_the_requests_of_deployments_it_serves() -> None:
    """Another tenant's deployment's figures, or made-up ids filling the table, are not
    a node's to give: only a replica the store placed on it counts."""
    index = AssignmentIndex()
    index.replace([("replica", "n1", "dep-1", 0)])
    counters = InferenceCounters(lambda node, work: index.holds("replica", node, work))
    counters.observe(serving("n1", 1, 10, 20.0))
    counters.observe(serving("n2", 2, 10**15, 59_000.0))  # n2 holds no replica of dep-1
    other = msgspec.structs.replace(
        serving("n1", 3, 5, 1.0),
        deployments=tuple(
            DeploymentSample(deployment_id=f"made-up-{i}", requests=1, errors=0, rejected=0,
                             requests_per_s=1.0)
            for i in range(100)
        ),
    )  # fmt: skip
    counters.observe(other)
    assert list(counters.by_deployment) == ["dep-1"]
    assert counters.by_deployment["dep-1"].requests == 10
    assert counters.by_deployment["dep-1"].nodes == {"n1"}
