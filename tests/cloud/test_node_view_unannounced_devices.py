"""A node's power and utilisation, as `GET /v1/nodes/{id}` and the `greenfed up` fleet
line show them, count only the devices its birth announced, and a device's power as
usage metering believes it: a node's telemetry alone cannot inflate either."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cloud.app_keys import INGESTOR, REGISTRY
from cloud.fleet.registry import NodeRecord, NodeRegistry
from cloud.fleet.views import summary_sample_fields
from cloud.loop.nodes import device_power_w
from cloud.summary import fleet_summary_line
from cloud.usage.meter import PLAUSIBLE_POWER_FACTOR
from shared.messages import AcceleratorSample, Telemetry, encode
from shared.topics import Channel, Topics
from tests.api.support import Api
from tests.api.test_enrolment import RecordingAccounts, create_token, enrol, enrolment_api
from tests.api.test_node_approval import announce, gpu, node_view
from tests.api.test_node_approval import birth as edge_birth
from tests.cloud.test_accelerator_metrics import A100, GIB, NOW_S, XEON, birth, telemetry
from tests.store.databases import DatabaseUnderTest

GHOSTS = 255  # devices the node never announced, each claiming 10 kW at full load


def sample(device_id: str, utilization_pct: float, power_w: float | None) -> AcceleratorSample:
    return AcceleratorSample(
        id=device_id, utilization_pct=utilization_pct, memory_used_bytes=GIB, power_w=power_w
    )


def ghosts() -> tuple[AcceleratorSample, ...]:
    return tuple(sample(f"ghost{index}", 100.0, 10_000.0) for index in range(GHOSTS))


def registered(*samples: AcceleratorSample) -> tuple[NodeRegistry, NodeRecord]:
    """An online node that announced a CPU and an A100, with `samples` as its latest."""
    registry = NodeRegistry(monotonic=lambda: 100.0, wall_clock=lambda: NOW_S)
    registry.apply_status(birth("liar", (XEON, A100), site="cloud", zone="DE"))
    registry.apply_telemetry(telemetry("liar", samples))
    record = registry.get("liar")
    assert record is not None
    assert record.telemetry is not None
    return registry, record


def test_devices_the_node_never_announced_count_for_nothing() -> None:
    registry, record = registered(
        sample("cpu0", 10.0, 80.0), sample("gpu1", 40.0, 250.0), *ghosts()
    )
    fields = summary_sample_fields(record)
    assert fields["power_w"] == 330.0
    assert fields["accelerator_utilization_pct"] == 40.0  # its GPU's, not the ghosts'
    assert fleet_summary_line(registry).endswith("drawing 0.3 kW")


def test_a_power_the_device_cannot_draw_counts_what_metering_believes() -> None:
    idle_w, max_w = device_power_w(A100)
    assert PLAUSIBLE_POWER_FACTOR * max_w < 9_000.0
    registry, record = registered(sample("cpu0", 10.0, 80.0), sample("gpu1", 50.0, 9_000.0))
    modelled_w = 80.0 + idle_w + (max_w - idle_w) * 0.5
    assert summary_sample_fields(record)["power_w"] == round(modelled_w, 2)
    assert fleet_summary_line(registry).endswith(f"drawing {modelled_w / 1000:.1f} kW")


def test_only_unannounced_samples_show_no_figures() -> None:
    registry, record = registered(*ghosts())
    fields = summary_sample_fields(record)
    assert (fields["power_w"], fields["accelerator_utilization_pct"]) == (None, None)
    assert fleet_summary_line(registry).endswith("drawing 0.0 kW")


def test_a_node_without_a_power_figure_shows_none() -> None:
    _, record = registered(sample("cpu0", 30.0, None), sample("gpu1", 60.0, None))
    fields = summary_sample_fields(record)
    assert (fields["power_w"], fields["accelerator_utilization_pct"]) == (None, 60.0)


@pytest.fixture
async def api(tmp_path: Path, database: DatabaseUnderTest) -> AsyncIterator[Api]:
    async with enrolment_api(database, RecordingAccounts(), require_enrolment=True) as running:
        yield running


async def test_an_enrolled_node_cannot_inflate_its_view_with_ghost_devices(api: Api) -> None:
    token = await create_token(api, max_accelerators={"gpu": 1})
    assert (await enrol(api, token["token"], "e1")).status == 200
    announce(api, edge_birth("e1", gpus=(gpu(0),)))  # one T4
    t4 = api.app[REGISTRY].get("e1")
    assert t4 is not None
    idle_w, max_w = device_power_w(t4.status.accelerators[0])
    sampled = Telemetry(
        node_id="e1",
        instance_id="i1",
        seq=1,
        sampled_at=time.time(),
        interval_s=5.0,
        cpu_utilization_pct=1.0,
        memory_used_bytes=1,
        memory_total_bytes=2,
        accelerators=(sample("gpu0", 5.0, 9_999.0), *ghosts()),
    )
    api.app[INGESTOR].handle(Topics("enroltest").node("e1", Channel.TELEMETRY), encode(sampled))
    record = api.app[REGISTRY].get("e1")
    assert record is not None
    assert record.telemetry is not None  # accepted
    view = await node_view(api, "e1")
    assert view["power_w"] == round(idle_w + (max_w - idle_w) * 0.05, 2)
    assert view["accelerator_utilization_pct"] == 5.0
