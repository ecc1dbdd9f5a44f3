"""Per-deployment inference series live as long as the deployment is placed, and a
linger more: a cancelled deployment's series go (with the tenant they were exported
with until then), and however many deployments served before, a live one is counted
(cloud/fleet/inference_metrics.py)."""

from __future__ import annotations

import re

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import cloud.fleet.inference_metrics as inference_metrics
from cloud.app_keys import INGESTOR, SCHEDULER
from cloud.fleet.assignments import AssignmentIndex
from cloud.fleet.inference_metrics import InferenceCollector, InferenceCounters
from cloud.fleet.registry import NodeRegistry
from shared.messages import DeploymentSample, Telemetry
from tests.api.support import Api, bearer
from tests.store.databases import DatabaseUnderTest
from tests.support.control_plane import cancel, fleet, reaches
from tests.support.waiting import eventually, eventually_async

pytestmark = pytest.mark.timeout(120)

LINGER_S = 60.0


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def serving(node_id: str, seq: int, *deployment_ids: str) -> Telemetry:
    return Telemetry(
        node_id=node_id, instance_id="i1", seq=seq, sampled_at=1.0e9 + seq, interval_s=1.0,
        cpu_utilization_pct=5.0, memory_used_bytes=1, memory_total_bytes=2,
        deployments=tuple(
            DeploymentSample(deployment_id=deployment_id, requests=10, errors=0, rejected=0,
                             requests_per_s=10.0)
            for deployment_id in deployment_ids
        ),
    )  # fmt: skip


class Serving:
    """Counters following an assignment index, scraped through their collector."""

    def __init__(self) -> None:
        self.clock = Clock()
        self.index = AssignmentIndex(linger_s=LINGER_S, monotonic=self.clock)
        index = self.index
        # What the accountant knows: the tenant of work still in the store.
        self.tenants: dict[str, str] = {}

        def tenant_of(work_id: str) -> str:
            return self.tenants.get(work_id, "")

        self.counters = InferenceCounters(
            lambda node_id, work_id: index.holds("replica", node_id, work_id),
            tenant_of=tenant_of,
            linger_s=LINGER_S,
            monotonic=self.clock,
        )
        self.counters.follow(index)
        self.registry = CollectorRegistry()
        self.registry.register(InferenceCollector(self.counters, NodeRegistry(), tenant_of))
        self.seq = 0

    def place(self, *deployment_ids: str) -> None:
        """The store's assignments now: one replica of each on n1."""
        self.index.replace([("replica", "n1", d, 0) for d in deployment_ids])
        for deployment_id in deployment_ids:
            self.tenants[deployment_id] = "acme"
        for gone in set(self.tenants) - set(deployment_ids):
            del self.tenants[gone]  # cancelled: no longer in the store's snapshot

    def serve(self, *deployment_ids: str) -> None:
        self.seq += 1
        self.counters.observe(serving("n1", self.seq, *deployment_ids))

    def requests(self) -> dict[str, tuple[str, float]]:
        """greenfed_inference_requests_total: deployment -> (tenant, value)."""
        found: dict[str, tuple[str, float]] = {}
        for family in text_string_to_metric_families(generate_latest(self.registry).decode()):
            for sample in family.samples:
                if sample.name == "greenfed_inference_requests_total":
                    found[sample.labels["deployment"]] = (sample.labels["tenant"], sample.value)
        return found


def test_a_cancelled_deployment_s_series_stay_a_linger_under_its_tenant_then_go() -> None:
    serving = Serving()
    serving.place("dep-1", "dep-2")
    serving.serve("dep-1", "dep-2")
    assert serving.requests() == {"dep-1": ("acme", 10.0), "dep-2": ("acme", 10.0)}

    serving.place("dep-2")  # dep-1 cancelled
    serving.clock.now_s += LINGER_S - 1
    serving.place("dep-2")
    # A final scrape sees its last counts, under the label set it always had.
    assert serving.requests() == {"dep-1": ("acme", 10.0), "dep-2": ("acme", 10.0)}

    serving.clock.now_s += 1
    serving.place("dep-2")
    assert serving.requests() == {"dep-2": ("acme", 10.0)}
    # One that served and ended between two scrapes keeps its tenant too.
    serving.place("dep-2", "dep-3")
    serving.serve("dep-3")
    serving.place("dep-2")
    assert serving.requests() == {"dep-2": ("acme", 10.0), "dep-3": ("acme", 10.0)}
    serving.clock.now_s += LINGER_S
    serving.place("dep-2")
    # A deployment still placed keeps counting, however long it lives.
    serving.clock.now_s += 10 * LINGER_S
    serving.place("dep-2")
    serving.serve("dep-2")
    assert serving.requests() == {"dep-2": ("acme", 20.0)}


def test_a_live_deployment_is_counted_however_many_served_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(inference_metrics, "MAX_DEPLOYMENTS", 2)
    serving = Serving()
    for number in range(4):  # churn: each served, then cancelled
        serving.place(f"old-{number}")
        serving.serve(f"old-{number}")
        serving.place()
    serving.place("live-1", "live-2")
    serving.serve("live-1", "live-2")
    # Within the old ones' linger too: those that ended make way for the live.
    assert serving.requests() == {"live-1": ("acme", 10.0), "live-2": ("acme", 10.0)}

    # The cap holds for what is placed at once: a third is not counted.
    serving.place("live-1", "live-2", "live-3")
    serving.serve("live-1", "live-2", "live-3")
    assert set(serving.requests()) == {"live-1", "live-2"}


INFERENCE_SERIES = re.compile(
    r'^greenfed_inference_\w+\{deployment="(?P<id>[^"]+)",tenant="(?P<tenant>[^"]*)"'
)


async def inference_series(api: Api) -> dict[str, set[str]]:
    """The tenant labels of each deployment's greenfed_inference_* series on /metrics."""
    response = await api.client.get("/metrics", headers=bearer(api.admin_token))
    assert response.status == 200, await response.text()
    found: dict[str, set[str]] = {}
    for line in (await response.text()).splitlines():
        if match := INFERENCE_SERIES.match(line):
            found.setdefault(match["id"], set()).add(match["tenant"])
    return found


async def test_a_control_plane_with_deployment_churn_exports_the_live_ones(
    database: DatabaseUnderTest,
    mosquitto_root: tuple[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The table is full of one cancelled deployment: a new one still gets its series,
    and the cancelled one never shows under a tenant it did not have."""
    monkeypatch.setattr(inference_metrics, "MAX_DEPLOYMENTS", 1)
    async with fleet(database, mosquitto_root, edge_nodes=1) as running:
        api = running.api
        token = await api.tenant("acme")
        model_id = await api.model(token)
        spec = {"name": "first", "model_id": model_id, "replicas": 1}
        first = await api.submitted(token, spec, collection="deployments")
        seen: dict[str, set[str]] = {}

        async def exported(deployment_id: str) -> bool:
            seen.clear()
            seen.update(await inference_series(api))
            return seen.get(deployment_id) == {"acme"}

        await eventually_async(
            lambda: exported(first), timeout_s=30, message=lambda: f"not exported: {seen}"
        )
        await cancel(api, token, first, "deployments")
        await reaches(api, token, first, "cancelled", collection="deployments")
        # Passes after the cancellation: the accountant no longer knows its tenant.
        passes = api.app[SCHEDULER].stats.passes
        api.app[INGESTOR].notify_change()
        await eventually(lambda: api.app[SCHEDULER].stats.passes >= passes + 2, timeout_s=10)
        assert (await inference_series(api)).get(first) == {"acme"}  # not tenant=""

        spec = {"name": "second", "model_id": model_id, "replicas": 1}
        second = await api.submitted(token, spec, collection="deployments")
        await eventually_async(
            lambda: exported(second), timeout_s=30, message=lambda: f"not exported: {seen}"
        )
        assert first not in seen  # made way for the live one
