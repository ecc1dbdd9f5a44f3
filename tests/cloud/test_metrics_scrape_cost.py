"""What keeps a 10,000-node scrape cheap leaves its contents as they were:
`greenfed_node_up` written by itself (cloud/fleet/node_up_metrics.py) is what
prometheus_client wrote, after every change the registry goes through; the fleet's
counts kept by registry version follow state changes; the per-accelerator text is
written in a worker thread and is the same text; sample values are written as
prometheus_client writes them."""

from __future__ import annotations

import asyncio
import math
import threading

import msgspec
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from cloud.fleet.accelerator_metrics import _number
from cloud.fleet.ingest import Ingestor
from cloud.fleet.node_up_metrics import NodeUpSeries
from cloud.fleet.registry import NodeRegistry
from cloud.metrics import build_metrics_registry
from shared.topics import Topics
from tests.cloud.test_accelerator_metrics import fleet_registry, series
from tests.loop.builders import node


class OldNodeUp(Collector):
    """`greenfed_node_up` as cloud/metrics.py collected it before it was written by
    itself."""

    def __init__(self, registry: NodeRegistry) -> None:
        self._registry = registry

    def collect(self) -> list[Metric]:
        up = GaugeMetricFamily(
            "greenfed_node_up",
            "1 while a node is online, 0 while it is offline",
            labels=["node", "site", "zone", "region"],
        )
        for record in self._registry.nodes():
            status = record.status
            up.add_metric(
                [status.node_id, status.site, status.zone, status.region],
                1 if record.state == "online" else 0,
            )
        return [up]


def test_node_up_is_what_prometheus_client_wrote_after_every_change() -> None:
    registry = NodeRegistry()
    old = CollectorRegistry()
    old.register(OldNodeUp(registry))
    new = NodeUpSeries(registry)

    def same() -> None:
        assert new.exposition() == generate_latest(old)

    same()  # no nodes: the family is declared all the same
    for number in range(4):
        registry.apply_status(node(f"node-{number}", zone="DE").status)
    same()
    registry.mark_offline(["node-1"], "telemetry-stale")
    same()
    record = registry.get("node-2")
    assert record is not None
    # A birth that names a zone a label value must escape.
    registry.apply_status(msgspec.structs.replace(record.status, zone='D"E\\\n'))
    same()
    registry.forget("node-3")
    registry.apply_status(node("node-0a").status)
    same()


def test_the_fleet_counts_follow_a_node_going_offline() -> None:
    registry = fleet_registry()
    metrics = build_metrics_registry(Ingestor(registry, Topics(), max_payload_bytes=1 << 20))

    def nodes_by_state() -> dict[str, float]:
        found = series(metrics.fleet_exposition().decode())
        return {
            labels["state"]: value
            for labels, value in found["greenfed_nodes"]
            if labels["site"] == "cloud"
        }

    assert nodes_by_state() == {"online": 1.0, "offline": 1.0}
    registry.mark_offline(["gpu-node"], "telemetry-stale")
    assert nodes_by_state() == {"online": 0.0, "offline": 2.0}


def test_the_scrape_is_written_in_a_worker_thread_and_is_the_same_text() -> None:
    registry = fleet_registry()
    metrics = build_metrics_registry(Ingestor(registry, Topics(), max_payload_bytes=1 << 20))
    accelerators = metrics.accelerators
    assert accelerators is not None
    render = accelerators.render
    threads: list[int] = []

    def recorded(*args: object, **kwargs: object) -> list[bytes]:
        threads.append(threading.get_ident())
        return render(*args, **kwargs)  # type: ignore[arg-type]

    accelerators.render = recorded  # type: ignore[method-assign]

    async def scrape() -> tuple[bytes, int]:
        chunks = await asyncio.wait_for(metrics.fleet_exposition_chunks(), 10)
        return b"".join(chunks), threading.get_ident()

    body, loop_thread = asyncio.run(scrape())
    assert threads
    assert threads[-1] != loop_thread
    expected = metrics.fleet_exposition()
    assert strip_process(body) == strip_process(expected)
    assert b"DCGM_FI_DEV_GPU_UTIL{" in body
    assert b'greenfed_node_up{node="gpu-node"' in body


def strip_process(body: bytes) -> list[bytes]:
    """The body without the process's own series (CPU seconds move between scrapes)."""
    return [
        line
        for line in body.splitlines()
        if not line.startswith((b"process_", b"python_gc"))
        and b" process_" not in line
        and b" python_gc" not in line
    ]


@given(
    st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(min_value=-(2**63), max_value=2**63),
        st.sampled_from([1e6, 999_999.999, 1e6 - 1e-9, 0.0, -0.0, 1e-7, 123456.0, 1e22]),
    )
)
def test_a_sample_value_is_written_as_prometheus_client_writes_it(value: float) -> None:
    expected = floatToGoString(value)  # type: ignore[no-untyped-call]
    assert _number(value) == expected
    if math.isnan(value):
        assert expected == "NaN"
