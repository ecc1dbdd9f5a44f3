"""Per-accelerator series on `/metrics` (cloud/fleet/accelerator_metrics.py): dcgm-exporter's
names, types, units and labels for GPUs, `greenfed_accelerator_*` for NPUs and CPUs."""

from __future__ import annotations

import math
import re

import msgspec

from cloud.app_keys import SETTINGS
from cloud.fleet.ingest import Ingestor
from cloud.fleet.registry import NodeRegistry
from cloud.metrics import build_metrics_registry
from shared.messages import (
    Accelerator,
    AcceleratorSample,
    HostInfo,
    NodeStatus,
    Site,
    Telemetry,
)
from shared.settings import CloudSettings
from shared.topics import Topics
from tests.api.support import running_api
from tests.store.databases import DatabaseUnderTest
from tests.support.exported_metrics import exposed_families
from tests.support.fleet import running, simulated_agent
from tests.support.waiting import eventually_async

NOW_S = 1_700_000_000.0
GIB = 1024**3
MIB = 1024**2

A100 = Accelerator(
    id="gpu1",
    kind="gpu",
    vendor="nvidia",
    model="NVIDIA A100-SXM4-80GB",
    memory_bytes=80 * GIB,
    compute_units=108,
    uuid="GPU-1b2c3d4e-0000-1111-2222-333344445555",
    index=1,
    pci_bus_id="00000000:0F:00.0",
)
XEON = Accelerator(
    id="cpu0", kind="cpu", vendor="intel", model="Xeon", memory_bytes=64 * GIB, compute_units=32
)
HAILO = Accelerator(
    id="npu0", kind="npu", vendor="hailo", model="Hailo-8", memory_bytes=0, compute_units=1
)

GPU_LABELS = {
    # dcgm-exporter's (4.x; `Hostname` as its releases spell it)
    "gpu": "1",
    "UUID": "GPU-1b2c3d4e-0000-1111-2222-333344445555",
    "pci_bus_id": "00000000:0F:00.0",
    "device": "nvidia1",
    "modelName": "NVIDIA A100-SXM4-80GB",
    "Hostname": "host-gpu-node",
    # greenfed's
    "exporter": "greenfed",
    "node": "gpu-node",
    "site": "cloud",
    "zone": "DE",
}
# dcgm-exporter's etc/default-counters.csv, for the series greenfed has figures for.
DCGM_TYPES = {
    "DCGM_FI_DEV_GPU_UTIL": "gauge",
    "DCGM_FI_DEV_FB_USED": "gauge",
    "DCGM_FI_DEV_FB_FREE": "gauge",
    "DCGM_FI_DEV_POWER_USAGE": "gauge",
    "DCGM_FI_DEV_GPU_TEMP": "gauge",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "counter",
}


def birth(
    node_id: str, accelerators: tuple[Accelerator, ...], *, site: Site, zone: str
) -> NodeStatus:
    return NodeStatus(
        node_id=node_id,
        state="online",
        instance_id=f"{node_id}-i1",
        agent_version="test",
        site=site,
        zone=zone,
        region="europe-west3",
        host=HostInfo(
            hostname=f"host-{node_id}",
            os="Linux",
            arch="x86_64",
            cpu_logical_cores=32,
            memory_total_bytes=64 * GIB,
        ),
        accelerators=accelerators,
        telemetry_interval_s=5.0,
        started_at=NOW_S,
        sent_at=NOW_S,
    )


def telemetry(node_id: str, samples: tuple[AcceleratorSample, ...]) -> Telemetry:
    return Telemetry(
        node_id=node_id,
        instance_id=f"{node_id}-i1",
        seq=1,
        sampled_at=NOW_S,
        interval_s=5.0,
        cpu_utilization_pct=10.0,
        memory_used_bytes=GIB,
        memory_total_bytes=64 * GIB,
        accelerators=samples,
    )


def fleet_registry() -> NodeRegistry:
    """A GPU node with a CPU, an edge node with an NPU (no power, temperature or energy
    in its sample), and an offline node that still has a sample."""
    registry = NodeRegistry(monotonic=lambda: 100.0, wall_clock=lambda: NOW_S)
    registry.apply_status(birth("gpu-node", (XEON, A100), site="cloud", zone="DE"))
    registry.apply_telemetry(
        telemetry(
            "gpu-node",
            (
                AcceleratorSample(
                    id="cpu0", utilization_pct=12.5, memory_used_bytes=4 * GIB, power_w=95.0
                ),
                AcceleratorSample(
                    id="gpu1",
                    utilization_pct=87.0,
                    memory_used_bytes=30 * GIB + 512 * 1024,  # a partial MiB is dropped
                    power_w=312.5,
                    temperature_c=64.0,
                    energy_j=1234.5678,
                ),
            ),
        )
    )
    registry.apply_status(birth("npu-node", (HAILO,), site="edge", zone="CA-ON"))
    registry.apply_telemetry(
        telemetry(
            "npu-node",
            (AcceleratorSample(id="npu0", utilization_pct=40.0, memory_used_bytes=3 * MIB),),
        )
    )
    offline = birth("gone-node", (A100,), site="cloud", zone="FR")
    registry.apply_status(offline)
    registry.apply_telemetry(
        telemetry(
            "gone-node",
            (AcceleratorSample(id="gpu1", utilization_pct=99.0, memory_used_bytes=GIB),),
        )
    )
    registry.mark_offline(["gone-node"], "telemetry-stale")
    return registry


def series(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample of the exposition, by the name the text gives it, as prometheus_client's
    parser reads them."""
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in exposed_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((sample.labels, sample.value))
    return found


def types(text: str) -> dict[str, str]:
    return {family.name: family.type for family in exposed_families(text)}


def scrape(registry: NodeRegistry, *, accelerator_metrics: bool = True) -> str:
    """What `/metrics` serves of the fleet's registry."""
    ingestor = Ingestor(registry, Topics(), max_payload_bytes=1 << 20)
    metrics = build_metrics_registry(ingestor, accelerator_metrics=accelerator_metrics)
    return metrics.fleet_exposition().decode()


def test_a_gpu_has_dcgm_exporters_names_labels_and_units() -> None:
    found = series(scrape(fleet_registry()))
    assert found["DCGM_FI_DEV_GPU_UTIL"] == [(GPU_LABELS, 87.0)]
    assert found["DCGM_FI_DEV_FB_USED"] == [(GPU_LABELS, 30 * 1024)]  # MiB
    assert found["DCGM_FI_DEV_FB_FREE"] == [(GPU_LABELS, 50 * 1024 - 1)]
    assert found["DCGM_FI_DEV_POWER_USAGE"] == [(GPU_LABELS, 312.5)]  # W
    assert found["DCGM_FI_DEV_GPU_TEMP"] == [(GPU_LABELS, 64.0)]  # C
    assert found["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == [(GPU_LABELS, 1234568.0)]  # mJ


def test_a_counter_too_large_for_millijoules_is_written_and_the_scrape_still_answers() -> None:
    """Ingestion refuses such a counter (cloud/fleet/plausibility.py); the text must not
    depend on that, or one node's sample would fail every scrape of the fleet."""
    registry = fleet_registry()
    registry.apply_status(birth("odd-node", (A100,), site="cloud", zone="DE"))
    huge = AcceleratorSample(id="gpu1", utilization_pct=1.0, memory_used_bytes=0, energy_j=1e306)
    registry.apply_telemetry(telemetry("odd-node", (huge,)))

    found = series(scrape(registry))

    energy_mj = {
        labels["node"]: value for labels, value in found["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]
    }
    assert energy_mj == {"gpu-node": 1234568.0, "odd-node": math.inf}


def test_every_gpu_series_has_dcgm_exporters_type() -> None:
    assert {name: types(scrape(fleet_registry()))[name] for name in DCGM_TYPES} == DCGM_TYPES


def test_the_energy_counter_keeps_dcgm_exporters_name_without_total() -> None:
    text = scrape(fleet_registry())
    # As dcgm-exporter writes it: the TYPE line and the samples under the DCGM field name.
    assert "\n# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n" in text
    assert "\nDCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{" in text
    assert "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total" not in text
    # greenfed's own counters keep prometheus_client's `_total`.
    assert "# TYPE greenfed_accelerator_energy_joules_total counter" in text


def test_the_gpu_labels_are_dcgm_exporters_plus_greenfeds_own() -> None:
    # dcgm-exporter's GPU template (internal/pkg/rendermetrics/render_metrics.go) writes
    # gpu, UUID, pci_bus_id, device and modelName, then Hostname when it knows one.
    dcgm_exporter_labels = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname"}
    found = series(scrape(fleet_registry()))
    for name in DCGM_TYPES:
        [(labels, _)] = found[name]
        assert set(labels) == dcgm_exporter_labels | {"exporter", "node", "site", "zone"}, name
        assert labels["exporter"] == "greenfed"


def test_a_birth_without_a_hostname_is_labelled_with_its_node_id() -> None:
    registry = fleet_registry()
    status = birth("gpu-node", (XEON, A100), site="cloud", zone="DE")
    registry.apply_status(
        msgspec.structs.replace(status, host=msgspec.structs.replace(status.host, hostname=""))
    )
    [(labels, _)] = series(scrape(registry))["DCGM_FI_DEV_GPU_UTIL"]
    assert labels["Hostname"] == "gpu-node"


def test_a_mig_instance_is_labelled_with_its_id_and_its_gpus_pci_address() -> None:
    mig = Accelerator(
        id="gpu0-mig1",
        kind="gpu",
        vendor="nvidia",
        model="NVIDIA A100-SXM4-40GB MIG 3g.20gb",
        memory_bytes=20 * GIB,
        compute_units=42,
        uuid="MIG-0a1b2c3d-0000-1111-2222-333344445555",
        parent_id="gpu0",
        pci_bus_id="00000000:07:00.0",
    )
    registry = NodeRegistry(monotonic=lambda: 100.0, wall_clock=lambda: NOW_S)
    registry.apply_status(birth("mig-node", (mig,), site="cloud", zone="DE"))
    registry.apply_telemetry(
        telemetry(
            "mig-node",
            (AcceleratorSample(id="gpu0-mig1", utilization_pct=5.0, memory_used_bytes=GIB),),
        )
    )
    [(labels, _)] = series(scrape(registry))["DCGM_FI_DEV_GPU_UTIL"]
    assert (labels["gpu"], labels["device"]) == ("gpu0-mig1", "")
    assert (labels["UUID"], labels["pci_bus_id"]) == (mig.uuid, "00000000:07:00.0")
    assert labels["modelName"] == "NVIDIA A100-SXM4-40GB MIG 3g.20gb"


def test_label_values_from_the_wire_are_escaped_as_the_text_format_wants() -> None:
    registry = NodeRegistry(monotonic=lambda: 100.0, wall_clock=lambda: NOW_S)
    odd = msgspec.structs.replace(A100, model='A100 "SXM4"\\80GB\nrev. 2')
    status = birth("odd-node", (odd,), site="cloud", zone="DE")
    registry.apply_status(
        msgspec.structs.replace(status, host=msgspec.structs.replace(status.host, hostname="h\\1"))
    )
    registry.apply_telemetry(
        telemetry(
            "odd-node",
            (AcceleratorSample(id="gpu1", utilization_pct=5.0, memory_used_bytes=GIB),),
        )
    )
    [(labels, value)] = series(scrape(registry))["DCGM_FI_DEV_GPU_UTIL"]
    assert (labels["modelName"], labels["Hostname"], value) == (odd.model, "h\\1", 5.0)


def test_an_inventory_without_pci_addresses_leaves_the_label_empty() -> None:
    registry = NodeRegistry(monotonic=lambda: 100.0, wall_clock=lambda: NOW_S)
    older = msgspec.structs.replace(A100, pci_bus_id="")  # an agent older than 1.11
    registry.apply_status(birth("old-node", (older,), site="cloud", zone="DE"))
    registry.apply_telemetry(
        telemetry(
            "old-node",
            (AcceleratorSample(id="gpu1", utilization_pct=5.0, memory_used_bytes=GIB),),
        )
    )
    [(labels, _)] = series(scrape(registry))["DCGM_FI_DEV_GPU_UTIL"]
    assert labels["pci_bus_id"] == ""  # Prometheus stores an empty label as none


def test_npus_and_cpus_have_greenfed_series_in_base_units() -> None:
    found = series(scrape(fleet_registry()))
    cpu = {
        "node": "gpu-node",
        "accelerator": "cpu0",
        "kind": "cpu",
        "model": "Xeon",
        "site": "cloud",
        "zone": "DE",
    }
    npu = {
        "node": "npu-node",
        "accelerator": "npu0",
        "kind": "npu",
        "model": "Hailo-8",
        "site": "edge",
        "zone": "CA-ON",
    }
    assert found["greenfed_accelerator_utilization_pct"] == [(cpu, 12.5), (npu, 40.0)]
    assert found["greenfed_accelerator_memory_used_bytes"] == [(cpu, 4 * GIB), (npu, 3 * MIB)]
    assert found["greenfed_accelerator_power_watts"] == [(cpu, 95.0)]
    # Neither sample has a temperature or an energy counter: no series, not a zero.
    assert "greenfed_accelerator_temperature_celsius" not in found
    assert "greenfed_accelerator_energy_joules_total" not in found
    # GPUs are in the DCGM series only; NPUs and CPUs never there.
    assert all(labels["node"] == "gpu-node" for labels, _ in found["DCGM_FI_DEV_GPU_UTIL"])


def accelerator_lines(text: str) -> str:
    """The scrape without the per-node series (`greenfed_node_up` names every node)."""
    return "\n".join(line for line in text.splitlines() if "greenfed_node_up" not in line)


def test_offline_nodes_and_nodes_without_a_sample_are_absent() -> None:
    registry = fleet_registry()
    registry.apply_status(birth("silent-node", (A100,), site="cloud", zone="DE"))
    text = accelerator_lines(scrape(registry))
    assert "gone-node" not in text
    assert "silent-node" not in text
    # ... and a node that comes back is exported again.
    registry.apply_status(birth("gone-node", (A100,), site="cloud", zone="FR"))
    record = registry.get("gone-node")
    assert record is not None
    assert record.telemetry is not None  # kept: the same agent instance
    assert 'node="gone-node"' in accelerator_lines(scrape(registry))


def test_a_new_birth_relabels_the_series() -> None:
    registry = fleet_registry()
    ingestor = Ingestor(registry, Topics(), max_payload_bytes=1 << 20)
    metrics = build_metrics_registry(ingestor)
    assert 'zone="DE"' in metrics.fleet_exposition().decode()
    renamed = msgspec.structs.replace(A100, model="NVIDIA A100-SXM4-40GB")
    registry.apply_status(birth("gpu-node", (XEON, renamed), site="cloud", zone="NL"))
    after = series(metrics.fleet_exposition().decode())
    (labels, _), *_ = after["DCGM_FI_DEV_GPU_UTIL"]
    assert (labels["zone"], labels["modelName"]) == ("NL", "NVIDIA A100-SXM4-40GB")


def test_the_setting_turns_the_per_accelerator_series_off() -> None:
    text = scrape(fleet_registry(), accelerator_metrics=False)
    assert "DCGM_FI_DEV" not in text
    assert "greenfed_accelerator_" not in text
    assert "greenfed_nodes" in text  # the fleet counts stay
    assert CloudSettings().accelerator_metrics is True


async def test_a_running_control_plane_serves_a_simulated_a100s_gpu_metrics(
    database: DatabaseUnderTest,
) -> None:
    async with running_api(database) as api:
        settings = api.app[SETTINGS].mqtt
        agent = simulated_agent("a100-0", settings, "a100-4x", site="cloud", zone="DE")

        text = ""

        async def gpu_series() -> list[tuple[dict[str, str], float]]:
            nonlocal text
            response = await api.client.get("/metrics")
            assert response.status == 200
            text = await response.text()
            return series(text).get("DCGM_FI_DEV_GPU_UTIL", [])

        async def four_gpus() -> bool:
            return len(await gpu_series()) == 4

        async with running(agent):
            await eventually_async(four_gpus, message="no DCGM_FI_DEV_GPU_UTIL for 4 GPUs")
            found = await gpu_series()
        assert sorted(labels["gpu"] for labels, _ in found) == ["0", "1", "2", "3"]
        assert len({labels["pci_bus_id"] for labels, _ in found}) == 4
        for labels, value in found:
            assert labels["modelName"] == "NVIDIA A100-SXM4-80GB"
            assert labels["UUID"].startswith("GPU-")
            assert labels["device"] == f"nvidia{labels['gpu']}"
            assert re.fullmatch(r"00000000:[0-9A-F]{2}:00\.0", labels["pci_bus_id"]), labels
            assert labels["exporter"] == "greenfed"
            assert (labels["node"], labels["Hostname"], labels["site"], labels["zone"]) == (
                "a100-0",
                "a100-0",
                "cloud",
                "DE",
            )
            assert 0.0 <= value <= 100.0
        assert types(text)["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == "counter"
