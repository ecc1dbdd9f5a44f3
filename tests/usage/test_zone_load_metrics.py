"""The load by zone on /metrics (cloud/usage/metrics.py) as the walk over every node gave
it, without that walk on the event loop: accelerators allocated are counted from the
open allocations, and power is summed from the scrape's samples in its worker thread,
with or without the per-accelerator series."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Iterator, Sequence

import msgspec
import pytest
from prometheus_client import CollectorRegistry

from cloud.fleet.ingest import Ingestor
from cloud.fleet.registry import NodeRecord, NodeRegistry
from cloud.loop.nodes import device_power_w
from cloud.metrics import build_metrics_registry
from cloud.store import AllocationRecord, StoreSnapshot
from cloud.usage.accountant import Accountant
from cloud.usage.meter import PLAUSIBLE_POWER_FACTOR
from cloud.usage.metrics import GridCollector, ZonePower
from shared.messages import AcceleratorSample, NodeStatus, Telemetry
from shared.settings import UsageSettings
from shared.topics import Topics
from tests.cloud.test_accelerator_metrics import A100, GIB, NOW_S, XEON, birth, series, telemetry
from tests.usage.test_metrics import samples

ZONES = ("DE", "FR", "CA-ON")


class CountingRegistry(NodeRegistry):
    """Counts the walks over every node."""

    walks = 0

    def __iter__(self) -> Iterator[NodeRecord]:
        self.walks += 1
        return super().__iter__()

    def nodes(self, node_filter: object = None) -> list[NodeRecord]:
        self.walks += 1
        return super().nodes(node_filter)  # type: ignore[arg-type]


def random_fleet(seed: int, nodes: int = 60) -> CountingRegistry:
    """Nodes with a CPU and a GPU in three zones, power figures with every digit (some
    missing); some offline, some without a sample yet."""
    rng = random.Random(seed)
    registry = CountingRegistry(monotonic=lambda: 100.0, wall_clock=lambda: NOW_S)
    for number in rng.sample(range(nodes), nodes):  # born in no particular order
        node_id = f"node-{number:03d}"
        registry.apply_status(birth(node_id, (XEON, A100), site="cloud", zone=rng.choice(ZONES)))
        if rng.random() < 0.1:
            continue  # no sample yet
        registry.apply_telemetry(
            telemetry(
                node_id,
                (
                    AcceleratorSample(
                        id="cpu0",
                        utilization_pct=10.0,
                        memory_used_bytes=GIB,
                        power_w=None if rng.random() < 0.2 else rng.uniform(20, 200),
                    ),
                    AcceleratorSample(
                        id="gpu1",
                        utilization_pct=50.0,
                        memory_used_bytes=GIB,
                        power_w=None if rng.random() < 0.2 else rng.uniform(50, 700),
                    ),
                ),
            )
        )
        if rng.random() < 0.15:
            registry.mark_offline([node_id], "telemetry-stale")
    return registry


def power_as_the_walk_summed(registry: NodeRegistry) -> dict[str, float]:
    """`greenfed_zone_power_watts` as `GridCollector._load` summed it, on the loop."""
    watts: dict[str, float] = {}
    for record in registry.nodes():
        zone = record.status.zone
        if record.state == "online" and record.telemetry is not None:
            watts[zone] = watts.get(zone, 0.0) + sum(
                s.power_w for s in record.telemetry.accelerators if s.power_w is not None
            )
    return watts


class ThreadRecordingZonePower(ZonePower):
    def __init__(self) -> None:
        self.threads: list[int] = []

    def render(self, samples: Sequence[tuple[NodeStatus, Telemetry]]) -> bytes:
        self.threads.append(threading.get_ident())
        return super().render(samples)


def test_a_node_cannot_inflate_its_zones_power() -> None:
    # A GPU claiming 9 kW counts what the model says it draws at its utilisation (as
    # metering counts it: cloud/usage/meter.py), and a device the node never announced
    # counts nothing.
    status = birth("liar", (XEON, A100), site="cloud", zone="DE")
    sample = telemetry(
        "liar",
        tuple(
            AcceleratorSample(
                id=device, utilization_pct=busy_pct, memory_used_bytes=GIB, power_w=power_w
            )
            for device, busy_pct, power_w in (
                ("cpu0", 10.0, 80.0),
                ("gpu1", 50.0, 9e3),
                ("gpu9", 90.0, 300.0),
            )
        ),
    )
    idle_w, max_w = device_power_w(A100)
    assert PLAUSIBLE_POWER_FACTOR * max_w < 9e3
    (power,) = series(ZonePower().render([(status, sample)]).decode())["greenfed_zone_power_watts"]
    assert power == ({"zone": "DE"}, 80.0 + idle_w + (max_w - idle_w) * 0.5)
    # A figure the device can draw is taken as it is.
    honest = msgspec.structs.replace(
        sample, accelerators=(msgspec.structs.replace(sample.accelerators[1], power_w=350.0),)
    )
    (power,) = series(ZonePower().render([(status, honest)]).decode())["greenfed_zone_power_watts"]
    assert power == ({"zone": "DE"}, 350.0)


@pytest.mark.parametrize("accelerator_metrics", [True, False])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_zone_power_is_the_walks_sum_written_in_the_scrapes_worker_thread(
    seed: int, accelerator_metrics: bool
) -> None:
    registry = random_fleet(seed)
    metrics = build_metrics_registry(
        Ingestor(registry, Topics(), max_payload_bytes=1 << 20),
        accelerator_metrics=accelerator_metrics,
    )
    zone_power = ThreadRecordingZonePower()
    metrics.sampled.append(zone_power)

    async def scrape() -> tuple[bytes, int]:
        chunks = await asyncio.wait_for(metrics.fleet_exposition_chunks(), 10)
        return b"".join(chunks), threading.get_ident()

    body, loop_thread = asyncio.run(scrape())
    expected = power_as_the_walk_summed(registry)
    assert len(expected) == len(ZONES)
    for text in (body.decode(), metrics.fleet_exposition().decode()):
        found = series(text)
        power = {labels["zone"]: value for labels, value in found["greenfed_zone_power_watts"]}
        assert power == expected  # to the last bit: the same sums in the same order
        assert ("DCGM_FI_DEV_POWER_USAGE" in found) == accelerator_metrics
        assert "greenfed_node_up" in found
    assert zone_power.threads[0] != loop_thread

    metrics.sampled.remove(zone_power)
    assert b"greenfed_zone_power_watts" not in metrics.fleet_exposition()


def allocation(work_id: str, node_id: str, kind: str, count: int) -> AllocationRecord:
    return AllocationRecord(
        work_id=work_id, member_index=0, node_id=node_id, accelerator_kind=kind,  # type: ignore[arg-type]
        accelerators=count, accelerator_ids=(), host_memory_bytes=0, started_at=NOW_S,
        expected_end=None, borrowed=False, state="running", tenant_id="t1",
        work_kind="training", priority="p1",
    )  # fmt: skip


def allocated_as_the_walk_counted(
    accountant: Accountant, registry: NodeRegistry
) -> dict[tuple[str, str], int]:
    """`greenfed_zone_accelerators_allocated` as `GridCollector._load` counted it."""
    counts: dict[tuple[str, str], int] = {}
    for record in registry.nodes():
        for one in accountant.allocations_on(record.node_id):
            if one.ended_at_s is None:
                key = (record.status.zone, one.accelerator_kind)
                counts[key] = counts.get(key, 0) + one.accelerators
    return counts


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_allocated_accelerators_are_counted_from_the_open_allocations_without_a_walk(
    seed: int,
) -> None:
    rng = random.Random(seed)
    registry = random_fleet(seed)
    clock = iter(range(10**6))
    accountant = Accountant(
        None,  # type: ignore[arg-type]
        registry,
        UsageSettings(),
        clock=lambda: NOW_S + next(clock),
    )
    node_ids = [record.node_id for record in registry.nodes()] + ["not-in-the-registry"]
    first = (
        allocation("job-gone", "not-in-the-registry", "gpu", 2),
        *(
            allocation(
                f"job-{n}", rng.choice(node_ids), rng.choice(("gpu", "cpu")), rng.randint(1, 8)
            )
            for n in range(40)
        ),
    )
    collector = GridCollector(accountant, registry, lambda zone: None)
    scraped = CollectorRegistry()
    scraped.register(collector)
    # The second pass ends a third of them (kept, ended, until their nodes' samples
    # cover them) and places new ones.
    second = (
        first[:1]
        + tuple(one for one in first[1:] if rng.random() < 0.66)
        + tuple(allocation(f"new-{number}", rng.choice(node_ids), "gpu", 1) for number in range(10))
    )
    for placed in (first, second):
        accountant.note_pass(
            StoreSnapshot(tenants=(), work=(), allocations=placed, node_generations={}),
            accountant.grid,
        )
        expected = allocated_as_the_walk_counted(accountant, registry)
        registry.walks = 0
        found = samples(scraped)
        assert registry.walks == 0
        counts = {
            (labels["zone"], labels["kind"]): value
            for labels, value in found["greenfed_zone_accelerators_allocated"]
        }
        assert counts == expected
        assert sum(one.accelerators for one in accountant.open_allocations()) > sum(
            expected.values()
        )  # the node not in the registry's are left out
