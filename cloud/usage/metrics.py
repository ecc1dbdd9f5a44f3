"""Usage and grid series on /metrics: what tenants used, emitted, paid and avoided
(`UsageCollector`, series that name tenants: served only to an authenticated scrape);
the grid each zone is on and where the load runs (`GridCollector` and `ZonePower`, the
fleet's).

Usage counters are what this process wrote as the scheduling leader, per tenant, zone
and currency, from zero when it started (a restart reads as a counter reset) and on
from there each time it leads again; a replica exports them only while it leads (one
that lost leadership drops them). Summed across replicas, as the dashboards'
`sum(increase())` does, every hour row counts once: no replica's counter moves by what
another leader counted. Each only grows, as a Prometheus counter must (`increase()`
reads a drop as a restart): the emissions avoided, negative where the work emitted more
than the carbon-agnostic baseline would have, are the difference of two of them,
`greenfed_usage_counterfactual_emissions_grams_total` minus
`greenfed_usage_emissions_with_counterfactual_grams_total`. The grid is the leader's
latest pass's: the recorded value of the current hour, never a forecast.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from cloud.fleet.registry import NodeRegistry
from cloud.green.energy import J_PER_KWH
from cloud.signals.grid import HOUR_S
from cloud.usage.accountant import Accountant
from cloud.usage.meter import believed_gpu_power_w, believed_power_w
from shared.messages import Accelerator, AcceleratorSample, NodeStatus, Telemetry


class UsageCollector(Collector):
    """Per tenant and zone: energy, emissions, cost, and the baseline's emissions and the
    work's over the usage that has a counterfactual (their difference: emissions avoided)."""

    def __init__(self, accountant: Accountant) -> None:
        self._accountant = accountant

    def collect(self) -> Iterator[Metric]:
        names = self._accountant.tenant_names
        labels = ["tenant", "zone"]
        energy = CounterMetricFamily(
            "greenfed_usage_energy_kwh", "Energy used by tenants' work, kWh", labels=labels
        )
        emissions = CounterMetricFamily(
            "greenfed_usage_emissions_grams",
            "Emissions of tenants' work at the recorded grid intensity, gCO2eq",
            labels=labels,
        )
        counterfactual = CounterMetricFamily(
            "greenfed_usage_counterfactual_emissions_grams",
            "Emissions the carbon-agnostic baseline's placement would have had for the usage "
            "that has a counterfactual, gCO2eq",
            labels=labels,
        )
        with_counterfactual = CounterMetricFamily(
            "greenfed_usage_emissions_with_counterfactual_grams",
            "Emissions of tenants' usage that has a counterfactual (the baseline's emissions "
            "minus these are the emissions avoided), gCO2eq",
            labels=labels,
        )
        cost = CounterMetricFamily(
            "greenfed_usage_cost",
            "Electricity cost of tenants' work, in the zone's currency",
            labels=[*labels, "currency"],
        )
        by_tenant_zone: dict[tuple[str, str], list[float]] = {}
        for (tenant_id, zone, currency), totals in sorted(self._accountant.totals.items()):
            tenant = names.get(tenant_id, tenant_id)
            sums = by_tenant_zone.setdefault((tenant, zone), [0.0, 0.0, 0.0, 0.0])
            sums[0] += totals.energy_j / J_PER_KWH
            sums[1] += totals.gco2_g
            sums[2] += totals.counterfactual_gco2_g
            sums[3] += totals.gco2_with_counterfactual_g
            cost.add_metric([tenant, zone, currency], totals.cost)
        for (tenant, zone), (kwh, gco2, baseline, compared) in sorted(by_tenant_zone.items()):
            energy.add_metric([tenant, zone], kwh)
            emissions.add_metric([tenant, zone], gco2)
            counterfactual.add_metric([tenant, zone], baseline)
            with_counterfactual.add_metric([tenant, zone], compared)
        yield energy
        yield emissions
        yield counterfactual
        yield with_counterfactual
        yield cost


class GridCollector(Collector):
    """Per zone: the grid's recorded carbon intensity and price, and the accelerators
    allocated there (their power: `ZonePower`)."""

    def __init__(
        self,
        accountant: Accountant,
        registry: NodeRegistry,
        newest_reading_s: Callable[[str], float | None],
        leading: asyncio.Event | None = None,
    ) -> None:
        """`newest_reading_s`: on the clock of the signal service's snapshots
        (`SignalService.newest_reading_s`); `leading`: set while this process holds
        scheduling leadership (`SchedulingLoop.leading`), None where it always does."""
        self._accountant = accountant
        self._registry = registry
        self._newest_reading_s = newest_reading_s
        self._leading = leading

    def collect(self) -> Iterator[Metric]:
        # The grid and the allocations are the leader's latest pass's: a replica that
        # lost leadership would go on exporting them as they stood, summed beside the new
        # leader's by the dashboards and a stale signal's alert held firing.
        if self._leading is not None and not self._leading.is_set():
            return
        yield from self._grid()
        yield from self._load()

    def _grid(self) -> Iterator[Metric]:
        grid = self._accountant.grid
        now = self._accountant.grid_now_s()
        carbon = GaugeMetricFamily(
            "greenfed_grid_carbon_intensity_grams_per_kwh",
            "Recorded carbon intensity of the current hour, gCO2eq/kWh",
            labels=["zone", "signal_type"],
        )
        price = GaugeMetricFamily(
            "greenfed_grid_price_per_mwh",
            "Recorded electricity price of the current hour, per MWh",
            labels=["zone", "currency"],
        )
        stale = GaugeMetricFamily(
            "greenfed_grid_signal_stale",
            "1 while a zone's signal is old or a fallback",
            labels=["zone"],
        )
        age = GaugeMetricFamily(
            "greenfed_grid_signal_age_seconds",
            "Time since the start of a zone's newest reading from a provider",
            labels=["zone"],
        )
        for zone, series in sorted(grid.zones.items()):
            hour = int((now - series.start_s) // HOUR_S)
            hour = min(max(hour, 0), series.carbon_g_per_kwh.size - 1)
            carbon.add_metric([zone, series.signal_type], float(series.carbon_g_per_kwh[hour]))
            value = float(series.price_per_mwh[hour])
            if value == value:  # not NaN
                price.add_metric([zone, series.currency], value)
            stale.add_metric([zone], 1.0 if series.stale else 0.0)
            newest = self._newest_reading_s(zone)
            if newest is not None:
                age.add_metric([zone], max(0.0, now - newest))
        yield carbon
        yield price
        yield stale
        yield age

    def _load(self) -> Iterator[Metric]:
        allocated = GaugeMetricFamily(
            "greenfed_zone_accelerators_allocated",
            "Accelerators (CPU: cores) allocated to work, by zone and kind",
            labels=["zone", "kind"],
        )
        # From the open allocations, not from every node's: on the event loop, a step per
        # allocation (a node not in the registry has no zone and is left out, as before).
        counts: dict[tuple[str, str], int] = {}
        nodes = self._registry
        for allocation in self._accountant.open_allocations():
            record = nodes.get(allocation.node_id)
            if record is not None:
                key = (record.status.zone, allocation.accelerator_kind)
                counts[key] = counts.get(key, 0) + allocation.accelerators
        for (zone, kind), count in sorted(counts.items()):
            allocated.add_metric([zone, kind], count)
        yield allocated


class ZonePower:
    """`greenfed_zone_power_watts`, the load's power by zone: online nodes' accelerators'
    power in their latest samples, as metering believes it (`believed_node_power_w`), summed
    from the samples a scrape takes on the event loop (cloud/fleet/accelerator_metrics.py
    `online_samples`) in the scrape's worker thread (cloud/metrics.py
    `MetricsRegistries.fleet_exposition_chunks`): the sum reads every device of the
    fleet, 30,000 at 10,000 nodes, which held the loop on every scrape when
    `GridCollector` summed them."""

    def render(self, samples: Sequence[tuple[NodeStatus, Telemetry]]) -> bytes:
        """The family in the text format, as prometheus_client writes it. Reads immutable
        messages only: safe in any thread."""
        watts: dict[str, float] = {}
        # Nodes in id order, each node's devices first: the same sums, to the last bit,
        # as a walk of `NodeRegistry.nodes()`.
        for status, telemetry in sorted(samples, key=_node_id):
            zone = status.zone
            watts[zone] = watts.get(zone, 0.0) + (
                believed_node_power_w(announced_samples(status, telemetry)) or 0.0
            )
        power = GaugeMetricFamily(
            "greenfed_zone_power_watts",
            "Power of online nodes' accelerators in their latest samples, by zone",
            labels=["zone"],
        )
        for zone, total in sorted(watts.items()):
            power.add_metric([zone], total)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Families(power))
        return generate_latest(registry)


def announced_samples(
    status: NodeStatus, telemetry: Telemetry
) -> list[tuple[Accelerator, AcceleratorSample]]:
    """The node's latest samples of the devices its birth announced, each with its
    device: a sample of any other device is the node's word alone, and counts nowhere
    (not in metering, the zone's power, nor the node's own view)."""
    devices = {accelerator.id: accelerator for accelerator in status.accelerators}
    return [
        (devices[sample.id], sample) for sample in telemetry.accelerators if sample.id in devices
    ]


def believed_node_power_w(
    samples: Sequence[tuple[Accelerator, AcceleratorSample]],
) -> float | None:
    """The power of a node's announced devices (`announced_samples`) as usage metering
    believes it (cloud/usage/meter.py `believed_power_w`): a node may not inflate its
    power beyond what its devices can draw. The MIG slices of one GPU each repeat the
    GPU's power: it counts once (`believed_gpu_power_w`). None where no device gave a
    figure."""
    believed: list[float | None] = []
    slices_by_gpu: dict[str, list[tuple[Accelerator, AcceleratorSample]]] = {}
    for device, sample in samples:
        if device.parent_id is None:
            believed.append(believed_power_w(device, sample))
        else:
            slices_by_gpu.setdefault(device.parent_id, []).append((device, sample))
    believed.extend(believed_gpu_power_w(slices) for slices in slices_by_gpu.values())
    known_w = [power_w for power_w in believed if power_w is not None]
    return sum(known_w) if known_w else None


def _node_id(sample: tuple[NodeStatus, Telemetry]) -> str:
    return sample[0].node_id


class _Families(Collector):
    """Families made already, to be written by prometheus_client."""

    def __init__(self, *families: Metric) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        yield from self._families
