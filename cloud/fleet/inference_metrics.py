"""Serving figures per deployment, summed over its replicas from nodes' telemetry.

Each telemetry sample carries, per deployment on the node, the requests, errors and
rejections since the previous sample: ingestion adds them to plain counters here (so
the counters survive a replica's restart, not the control plane's, as Prometheus
expects of counters). Rates and latency quantiles are the latest sample's, per
replica; a deployment's quantile is its worst replica's (what an SLO sees).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from cloud.fleet.registry import NodeRegistry
from shared.messages import Telemetry

QUANTILES = (("0.5", "latency_p50_ms"), ("0.95", "latency_p95_ms"), ("0.99", "latency_p99_ms"))
# A deployment id comes from the wire: at most this many are tracked.
MAX_DEPLOYMENTS = 10_000


@dataclass(slots=True)
class _Counts:
    requests: int = 0
    errors: int = 0
    rejected: int = 0
    nodes: set[str] = field(default_factory=set)


class InferenceCounters:
    """A telemetry listener (`Ingestor.telemetry_listeners`)."""

    def __init__(self, holds: Callable[[str, str], bool] = lambda node_id, work_id: True) -> None:
        """`holds(node id, deployment id)`: whether the node serves some of it (a node
        counts only its own replicas' requests: another deployment's figures, or made-up
        ids filling the table, are not its to give)."""
        self.by_deployment: dict[str, _Counts] = {}
        self._holds = holds

    def observe(self, telemetry: Telemetry) -> None:
        for sample in telemetry.deployments:
            if not self._holds(telemetry.node_id, sample.deployment_id):
                continue
            counts = self.by_deployment.get(sample.deployment_id)
            if counts is None:
                if len(self.by_deployment) >= MAX_DEPLOYMENTS:
                    continue
                counts = self.by_deployment[sample.deployment_id] = _Counts()
            counts.requests += sample.requests
            counts.errors += sample.errors
            counts.rejected += sample.rejected
            counts.nodes.add(telemetry.node_id)


class InferenceCollector(Collector):
    def __init__(
        self,
        counters: InferenceCounters,
        registry: NodeRegistry,
        tenant_of: Callable[[str], str],
    ) -> None:
        """`tenant_of`: a deployment's tenant name ("" when not known here)."""
        self._counters = counters
        self._registry = registry
        self._tenant_of = tenant_of

    def collect(self) -> Iterator[Metric]:
        labels = ["deployment", "tenant"]
        families = {
            name: CounterMetricFamily(f"greenfed_inference_{name}", text, labels=labels)
            for name, text in (
                ("requests", "Inference requests served, per deployment"),
                ("errors", "Inference requests that failed, per deployment"),
                ("rejected", "Inference requests refused with 429 (queue full), per deployment"),
            )
        }
        rate = GaugeMetricFamily(
            "greenfed_inference_requests_per_second",
            "Requests per second over the latest samples of a deployment's replicas",
            labels=labels,
        )
        latency = GaugeMetricFamily(
            "greenfed_inference_latency_milliseconds",
            "Latency quantiles of a deployment: its worst replica's latest sample",
            labels=[*labels, "quantile"],
        )
        for deployment_id, counts in sorted(self._counters.by_deployment.items()):
            key = [deployment_id, self._tenant_of(deployment_id)]
            families["requests"].add_metric(key, counts.requests)
            families["errors"].add_metric(key, counts.errors)
            families["rejected"].add_metric(key, counts.rejected)
            samples = [
                sample
                for node_id in sorted(counts.nodes)
                if (record := self._registry.get(node_id)) is not None
                and record.state == "online"
                and (sample := record.serving_sample(deployment_id)) is not None
            ]
            if not samples:
                continue
            rate.add_metric(key, sum(s.requests_per_s for s in samples))
            for quantile, attribute in QUANTILES:
                values = [v for s in samples if (v := getattr(s, attribute)) is not None]
                if values:
                    latency.add_metric([*key, quantile], max(values))
        yield from families.values()
        yield rate
        yield latency
