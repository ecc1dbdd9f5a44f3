"""Prometheus metrics of the control plane, read from live state at scrape time.

A collector reads the ingestion counters and the registry when scraped, so the
ingestion hot path only increments plain integers.

Series come in two sets (`MetricsRegistries`): the fleet's (nodes, accelerators,
ingestion, the scheduler, the queue, the grid), which `/metrics` serves to anyone, and
those that name a tenant, a job or a deployment (usage per tenant, deployments'
replicas, inference per deployment), served only to a scrape that authenticates
(cloud/api/system.py). A collector belongs to one set: one that would mix them is two
collectors.
"""

from __future__ import annotations

import asyncio
import platform
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    Info,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from cloud.fleet.accelerator_metrics import AcceleratorMetrics, online_samples
from cloud.fleet.ingest import Ingestor
from cloud.fleet.node_up_metrics import NodeUpSeries
from cloud.fleet.registry import FleetCounts, NodeRegistry
from cloud.loop.loop import SchedulingLoop
from cloud.loop.queue_metrics import WaitHistogram
from shared import __version__
from shared.build import commit
from shared.messages import NodeStatus, Telemetry
from shared.work_literals import PriorityClass


class ControlPlaneCollector(Collector):
    """Ingestion's counters and the fleet's counts (`greenfed_node_up`, one series per
    node, is written by cloud/fleet/node_up_metrics.py)."""

    def __init__(self, ingestor: Ingestor) -> None:
        self._ingestor = ingestor
        # The counts by the registry version they were taken at: every birth, state
        # change and departure bumps it, and nothing else changes them.
        self._counts: tuple[int, FleetCounts, Counter[tuple[str, str]]] | None = None

    def _fleet_counts(self) -> tuple[FleetCounts, Counter[tuple[str, str]]]:
        registry = self._ingestor.registry
        kept = self._counts
        if kept is None or kept[0] != registry.version:
            records = list(registry)
            by_version: Counter[tuple[str, str]] = Counter(
                (record.status.agent_version, record.state) for record in records
            )
            kept = self._counts = (registry.version, FleetCounts.of(records), by_version)
        return kept[1], kept[2]

    def collect(self) -> Iterator[Metric]:
        stats = self._ingestor.stats
        ingested = CounterMetricFamily(
            "greenfed_mqtt_messages_ingested",
            "MQTT messages applied, by channel",
            labels=["channel"],
        )
        for channel, count in sorted(stats.ingested.items()):
            ingested.add_metric([channel], count)
        yield ingested
        invalid = CounterMetricFamily(
            "greenfed_mqtt_messages_invalid",
            "MQTT messages dropped (or, for a birth's sealing key, the key dropped), by "
            "channel and reason",
            labels=["channel", "reason"],
        )
        for (channel, reason), count in sorted(stats.invalid.items()):
            invalid.add_metric([channel, reason], count)
        yield invalid
        # Not a client's fault: a message the control plane failed to handle is a bug,
        # which would otherwise show only in the log.
        yield CounterMetricFamily(
            "greenfed_mqtt_ingest_failures",
            "MQTT messages whose handling raised (a bug in the control plane, logged as "
            "'ingestion failed')",
            value=stats.failures,
        )
        yield CounterMetricFamily(
            "greenfed_node_instance_conflicts",
            "Times a node was claimed by two agent instances at once (a birth held back "
            "while the current instance holds the node, or a node won back from one that "
            "never sent telemetry)",
            value=self._ingestor.registry.instance_conflicts,
        )

        counts, by_version = self._fleet_counts()
        nodes = GaugeMetricFamily(
            "greenfed_nodes", "Known nodes, by state and site", labels=["state", "site"]
        )
        for state in ("online", "offline"):
            for site in ("cloud", "edge"):
                nodes.add_metric([state, site], counts.nodes_by_state_site.get((state, site), 0))
        yield nodes
        by_kind = GaugeMetricFamily(
            "greenfed_nodes_with_accelerator",
            "Nodes with at least one accelerator of a kind, by kind and state",
            labels=["kind", "state"],
        )
        accelerators = GaugeMetricFamily(
            "greenfed_accelerators", "Accelerators, by kind and state", labels=["kind", "state"]
        )
        for kind in ("gpu", "npu", "cpu"):
            for state in ("online", "offline"):
                by_kind.add_metric([kind, state], counts.nodes_by_kind_state.get((kind, state), 0))
                accelerators.add_metric(
                    [kind, state], counts.accelerators_by_kind_state.get((kind, state), 0)
                )
        yield by_kind
        yield accelerators
        versions = GaugeMetricFamily(
            "greenfed_agent_versions",
            "Nodes by the agent version their birth announces, and state (upgrades over "
            "the air: cloud/upgrades/)",
            labels=["version", "state"],
        )
        for (version, state), count in sorted(by_version.items()):
            versions.add_metric([version, state], count)
        yield versions


class SchedulingCollector(Collector):
    """The scheduling loop's counters (cloud.loop.loop.LoopStats)."""

    def __init__(self, loop: SchedulingLoop) -> None:
        self._loop = loop

    def collect(self) -> Iterator[Metric]:
        stats = self._loop.stats
        yield GaugeMetricFamily(
            "greenfed_scheduling_leader",
            "1 while this process holds scheduling leadership",
            value=1 if self._loop.leading.is_set() else 0,
        )
        for name, help_text, value in (
            ("passes", "Scheduling passes run", stats.passes),
            ("commits", "Plans committed to the store", stats.commits),
            ("placements", "Work items placed", stats.placed),
            ("preemptions", "Work items that lost allocations to preemption", stats.evicted),
            ("migrations", "Running jobs moved to cleaner capacity", stats.migrated),
            ("conflicts", "Passes planned again because work changed under them", stats.conflicts),
            ("errors", "Passes that failed (logged)", stats.errors),
            (
                "hook_failures",
                "Work items left pending because an extension hook failed for them (logged)",
                self._loop.hook_failures.total,
            ),
        ):
            yield CounterMetricFamily(f"greenfed_scheduling_{name}", help_text, value=value)
        last_pass = GaugeMetricFamily(
            "greenfed_scheduling_last_pass_seconds",
            "Duration of the leader's latest scheduling pass (no series on a replica that "
            "does not lead)",
        )
        # A former leader's last pass is no pass of the cluster's: the dashboards take
        # the max across replicas, which would show it for as long as that replica runs.
        if self._loop.leading.is_set():
            last_pass.add_metric([], stats.last_pass_ms / 1000.0)
        yield last_pass
        yield from self._queue()

    def _queue(self) -> Iterator[Metric]:
        queue = self._loop.queue
        pending = GaugeMetricFamily(
            "greenfed_work_pending",
            "Work the leader's latest pass left waiting, by priority class, kind and the "
            "scheduler's reason code (no series on a replica that does not lead)",
            labels=["priority", "kind", "reason"],
        )
        if queue.pending is not None:
            for (priority, kind, reason), count in queue.pending.items():
                pending.add_metric([priority, kind, reason], count)
        yield pending
        yield _histogram(
            "greenfed_queue_wait_seconds",
            "Time from submission, or the requeue, to placement, by priority class",
            queue.queue_wait,
        )
        yield _histogram(
            "greenfed_submission_to_running_seconds",
            "Time from submission to running (first placement), by priority class",
            queue.submission_to_running,
        )


class DeploymentReplicasCollector(Collector):
    """Placed deployments' replicas, by deployment and tenant (a tenant series)."""

    def __init__(self, loop: SchedulingLoop) -> None:
        self._loop = loop

    def collect(self) -> Iterator[Metric]:
        replicas = GaugeMetricFamily(
            "greenfed_deployment_replicas",
            "Placed deployments' replicas: desired (the spec, or the autoscaler's count) and "
            "serving (replicas their online nodes report ready); the leader's only",
            labels=["deployment", "tenant", "state"],
        )
        for deployment_id, (tenant, desired, serving) in sorted(
            self._loop.deployments.replicas.items()
        ):
            replicas.add_metric([deployment_id, tenant, "desired"], desired)
            replicas.add_metric([deployment_id, tenant, "serving"], serving)
        yield replicas


def _histogram(
    name: str, help_text: str, by_priority: dict[PriorityClass, WaitHistogram]
) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, help_text, labels=["priority"])
    for priority, histogram in by_priority.items():
        family.add_metric([priority], histogram.cumulative(), histogram.sum_s)
    return family


class SampledFamilies(Protocol):
    """Families written from the online nodes' latest samples (`online_samples`) in the
    scrape's worker thread (cloud/usage/metrics.py `ZonePower`)."""

    def render(self, samples: Sequence[tuple[NodeStatus, Telemetry]]) -> bytes: ...


@dataclass(frozen=True, slots=True)
class MetricsRegistries:
    """`fleet` and `accelerators`: served to anyone. `tenants`: series that name a tenant,
    a job or a deployment, served only with the scrape token or an admin's token."""

    fleet: CollectorRegistry = field(default_factory=lambda: CollectorRegistry(auto_describe=True))
    tenants: CollectorRegistry = field(
        default_factory=lambda: CollectorRegistry(auto_describe=True)
    )
    # Written by itself, not by prometheus_client (cloud/fleet/accelerator_metrics.py);
    # None: `cloud.accelerator_metrics = false`.
    accelerators: AcceleratorMetrics | None = None
    # `greenfed_node_up`, written by itself as well (cloud/fleet/node_up_metrics.py).
    nodes: NodeUpSeries | None = None
    # Where `online_samples` are taken for `sampled` (with or without `accelerators`).
    node_registry: NodeRegistry | None = None
    # Served to anyone, right after `fleet`'s families: added and removed by their owner
    # (the scheduling leader's accountant: cloud/app.py).
    sampled: list[SampledFamilies] = field(default_factory=list)

    def _samples(self, sampled: Sequence[SampledFamilies]) -> list[tuple[NodeStatus, Telemetry]]:
        """What the worker thread writes from, taken on the event loop."""
        if self.accelerators is not None:
            return self.accelerators.online_samples()
        if sampled and self.node_registry is not None:
            return online_samples(self.node_registry)
        return []

    def _fleet_head(self) -> bytes:
        """The registry's families: read on the event loop (the collectors read what
        the loop changes), cheap."""
        return generate_latest(self.fleet)

    def _node_up(self) -> bytes:
        """`greenfed_node_up`: cheap on the loop (the per-node text is kept)."""
        return self.nodes.exposition() if self.nodes is not None else b""

    def _rendered(
        self,
        sampled: Sequence[SampledFamilies],
        samples: Sequence[tuple[NodeStatus, Telemetry]],
    ) -> list[bytes]:
        """`sampled`'s text and the per-accelerator text: what reads every device, in
        any thread."""
        chunks = [family.render(samples) for family in sampled]
        if self.accelerators is not None:
            chunks.extend(self.accelerators.render(samples))
        return chunks

    def fleet_exposition(self) -> bytes:
        """The series served to anyone, in the Prometheus text format."""
        sampled = tuple(self.sampled)
        rendered = self._rendered(sampled, self._samples(sampled))
        return b"".join(_in_order(self._fleet_head(), self._node_up(), len(sampled), rendered))

    async def fleet_exposition_chunks(self) -> list[bytes]:
        """`fleet_exposition` in chunks, what reads every device (the per-accelerator text
        is tens of megabytes for 10,000 nodes) written in a worker thread: the loop goes
        on serving requests and ingesting telemetry meanwhile."""
        head, node_up = self._fleet_head(), self._node_up()
        sampled = tuple(self.sampled)  # as it stands: its owner may go meanwhile
        if not sampled and self.accelerators is None:
            return [head, node_up]
        rendered = await asyncio.to_thread(self._rendered, sampled, self._samples(sampled))
        return _in_order(head, node_up, len(sampled), rendered)


def _in_order(head: bytes, node_up: bytes, sampled: int, rendered: list[bytes]) -> list[bytes]:
    """The registry's families, the `sampled` families written from samples,
    `greenfed_node_up`, the per-accelerator families."""
    return [head, *rendered[:sampled], node_up, *rendered[sampled:]]


def build_metrics_registry(
    ingestor: Ingestor, *, accelerator_metrics: bool = True
) -> MetricsRegistries:
    """The fleet's collectors registered; `accelerator_metrics`: whether per-accelerator
    series are exported (`cloud.accelerator_metrics`)."""
    registries = MetricsRegistries(
        accelerators=AcceleratorMetrics(ingestor.registry) if accelerator_metrics else None,
        nodes=NodeUpSeries(ingestor.registry),
        node_registry=ingestor.registry,
    )
    # What runs (greenfed_build_info) and how the process does (process_*, python_*),
    # as every Prometheus exporter shows them.
    Info("greenfed_build", "The greenfed control plane's version", registry=registries.fleet).info(
        {"version": __version__, "commit": commit(), "python": platform.python_version()}
    )
    ProcessCollector(registry=registries.fleet)
    PlatformCollector(registry=registries.fleet)
    GCCollector(registry=registries.fleet)
    registries.fleet.register(ControlPlaneCollector(ingestor))
    return registries
