"""Serving figures per deployment, summed over its replicas from nodes' telemetry.

Each telemetry sample carries, per deployment on the node, the requests, errors and
rejections since the previous sample: ingestion adds them to plain counters here (so
the counters survive a replica's restart, not the control plane's, as Prometheus
expects of counters). Rates and latency quantiles are the latest sample's, per
replica; a deployment's quantile is its worst replica's (what an SLO sees).

**Summed across control-plane replicas, the counters count no request twice.** With
a shared subscription (`mqtt.shared_group`) each replica takes its share of the samples
and counts it. Without one every replica takes every sample, so only the scheduling
leader counts (`counting`): from zero when its process started, on from there each time
it leads again, and exported only while it leads (a replica that lost leadership drops
them: the new leader counts from then on), as the usage counters are
(cloud/usage/metrics.py). The rates and quantiles, read from the registry, are every
replica's.

**A deployment's series last as long as it is placed, and `ENDED_LINGER_S` more**
(`follow`): then a few scrapes see its last counts, and the samples its replicas still
ship as they stop (counted as long: cloud/fleet/assignments.py) add to them. Its tenant
label stays the tenant it served for. `MAX_DEPLOYMENTS` bounds the table (ids come
from the wire); a deployment that ended makes way for a new one before its linger ends,
so only the deployments placed at once can fill it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from cloud.fleet.assignments import LINGER_S as ASSIGNMENT_LINGER_S
from cloud.fleet.registry import NodeRegistry
from shared.messages import Telemetry

if TYPE_CHECKING:
    from cloud.fleet.assignments import AssignmentIndex

QUANTILES = (("0.5", "latency_p50_ms"), ("0.95", "latency_p95_ms"), ("0.99", "latency_p99_ms"))
# A deployment id comes from the wire: at most this many are tracked (read at call time).
MAX_DEPLOYMENTS = 10_000
# How long a deployment no longer placed keeps its series: as long as the assignment index
# lets its withdrawn replicas' samples count (its `linger_s`).
ENDED_LINGER_S: Final = ASSIGNMENT_LINGER_S


@dataclass(slots=True)
class _Counts:
    requests: int = 0
    errors: int = 0
    rejected: int = 0
    nodes: set[str] = field(default_factory=set)
    # Its tenant, as soon as it is known: the accountant forgets cancelled work, and a
    # new label set (tenant="") would start the counters again from zero.
    tenant: str = ""


class InferenceCounters:
    """A telemetry listener (`Ingestor.telemetry_listeners`)."""

    def __init__(
        self,
        holds: Callable[[str, str], bool] = lambda node_id, work_id: True,
        *,
        tenant_of: Callable[[str], str] = lambda work_id: "",
        counting: Callable[[], bool] | None = None,
        linger_s: float = ENDED_LINGER_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """`holds(node id, deployment id)`: whether the node serves some of it (a node
        counts only its own replicas' requests: another deployment's figures, or made-up
        ids filling the table, are not its to give); `tenant_of`: a deployment's tenant
        name ("" when not known here), noted as it serves; `counting`: whether the
        requests in the samples this replica takes now are its to count and export (where
        every replica takes every sample: while it leads scheduling), None where they
        always are; `linger_s`: how long the counters of a deployment no longer placed
        are kept."""
        self.by_deployment: dict[str, _Counts] = {}
        self._holds = holds
        self._tenant_of = tenant_of
        self._counting = counting
        self._linger_s = linger_s
        self._monotonic = monotonic
        # Deployments counted here that are no longer placed: when each left (monotonic),
        # oldest first.
        self._ended: dict[str, float] = {}

    def follow(self, index: AssignmentIndex) -> None:
        """Keep the counters of the deployments `index` places (and `linger_s` more)."""

        def updated() -> None:
            if self.by_deployment:  # most fleets serve nothing: no walk of the index
                self.keep_placed(
                    {work_id for kind, _, work_id, _ in index.current if kind == "replica"}
                )

        index.listeners.append(updated)

    def keep_placed(self, placed: Collection[str]) -> None:
        """`placed`: every deployment with a replica placed now. The counters of any other
        are dropped once it has been gone `linger_s`."""
        now = self._monotonic()
        for deployment_id in self.by_deployment:
            if deployment_id in placed:
                self._ended.pop(deployment_id, None)
            elif deployment_id not in self._ended:
                self._ended[deployment_id] = now
        while self._ended:
            deployment_id, ended = next(iter(self._ended.items()))
            if now - ended < self._linger_s:
                break
            self._drop_oldest_ended()

    def _drop_oldest_ended(self) -> bool:
        """Make room: drop the deployment that ended first; False when none has."""
        if not self._ended:
            return False
        deployment_id = next(iter(self._ended))
        del self._ended[deployment_id]
        del self.by_deployment[deployment_id]
        return True

    def counting(self) -> bool:
        """Whether this replica counts (and exports) the requests of the samples it takes
        now: the counters then go on from where they stood when it last did."""
        return self._counting is None or self._counting()

    def observe(self, telemetry: Telemetry) -> None:
        # The deployment and its nodes are followed all the same: the rates and quantiles
        # are every replica's to export.
        counting = self.counting()
        for sample in telemetry.deployments:
            if not self._holds(telemetry.node_id, sample.deployment_id):
                continue
            counts = self.by_deployment.get(sample.deployment_id)
            if counts is None:
                if len(self.by_deployment) >= MAX_DEPLOYMENTS and not self._drop_oldest_ended():
                    continue  # as many placed as the table holds
                counts = self.by_deployment[sample.deployment_id] = _Counts()
            if not counts.tenant:
                counts.tenant = self._tenant_of(sample.deployment_id)
            if counting:
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
        # Another replica counts these requests now (the leader, where every replica
        # takes every sample): exported here too, they would be summed twice.
        counting = self._counters.counting()
        for deployment_id, counts in sorted(self._counters.by_deployment.items()):
            counts.tenant = self._tenant_of(deployment_id) or counts.tenant
            key = [deployment_id, counts.tenant]
            if counting:
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
