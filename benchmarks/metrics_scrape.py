"""How long the control plane's `GET /metrics` takes to generate for a large GPU fleet,
and how big it is.

`--nodes` simulated `h100-8x` nodes (8 GPUs and a CPU each; the default 1,250 is
10,000 GPUs) are born in a node registry and each sends one telemetry sample from its
simulated devices; then the exposition of the control plane's metrics registry (what
`/metrics` serves: fleet counts and the per-accelerator series of cloud/fleet/
accelerator_metrics.py) is generated `--runs` times and the median printed, once with
`cloud.accelerator_metrics` on and once off.

    python benchmarks/metrics_scrape.py --nodes 1250 --runs 7
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import statistics
import sys
import time
from collections.abc import Mapping
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cloud.fleet.ingest import Ingestor
from cloud.fleet.registry import NodeRegistry
from cloud.metrics import build_metrics_registry
from shared.messages import NodeStatus, Site, Telemetry
from shared.topics import Topics
from sim_devices.fleet import SimNodeSpec, expand_fleet, load_fleet, scale_fleet
from sim_devices.probes import SimulatedNode
from sim_devices.profiles import DeviceProfile, get_profile

PROFILE = "h100-8x"


def register_simulated(
    registry: NodeRegistry,
    index: int,
    node_id: str,
    profile: DeviceProfile,
    *,
    site: Site = "cloud",
    zone: str,
    region: str,
    labels: Mapping[str, str] | None = None,
    now_s: float,
) -> None:
    """Node `index` of a benchmark's fleet: a simulated node born in `registry` with its
    first telemetry sample, taken after two steps (power and energy integrated over a
    real interval)."""
    node = SimulatedNode(node_id, profile, random.Random(index))
    node.advance()
    node.advance()
    status = NodeStatus(
        node_id=node_id,
        state="online",
        instance_id=f"instance-{index}",
        agent_version="bench",
        site=site,
        zone=zone,
        region=region,
        labels=dict(labels or {}),
        host=node.host_info(),
        accelerators=node.accelerators,
        telemetry_interval_s=5.0,
        started_at=now_s,
        sent_at=now_s,
    )
    host = node.host_sample()
    telemetry = Telemetry(
        node_id=node_id,
        instance_id=status.instance_id,
        seq=0,
        sampled_at=now_s,
        interval_s=5.0,
        cpu_utilization_pct=host.cpu_utilization_pct,
        memory_used_bytes=host.memory_used_bytes,
        memory_total_bytes=host.memory_total_bytes,
        accelerators=tuple(node.accelerator_samples()),
    )
    registry.apply_status(status)
    registry.apply_telemetry(telemetry)


def register_simulated_fleet(
    registry: NodeRegistry, nodes: int, *, now_s: float
) -> list[SimNodeSpec]:
    """The default fleet scaled to `nodes`, each node born in `registry` with its first
    sample (`register_simulated`, node k seeded with k); their specs, in that order."""
    specs = expand_fleet(scale_fleet(load_fleet(), nodes))
    for index, spec in enumerate(specs):
        register_simulated(
            registry,
            index,
            spec.node_id,
            spec.profile,
            site=spec.site,
            zone=spec.zone,
            region=spec.region,
            labels=spec.labels,
            now_s=now_s,
        )
    return specs


def populated_registry(nodes: int) -> NodeRegistry:
    registry = NodeRegistry(max_nodes=nodes)
    now_s = time.time()
    profile = get_profile(PROFILE)
    for index in range(nodes):
        register_simulated(
            registry,
            index,
            f"h100-{index:05d}",
            profile,
            zone=("DE", "FR", "US-CAL-CISO", "CA-ON")[index % 4],
            region="europe-west3",
            now_s=now_s,
        )
    return registry


def measure(ingestor: Ingestor, *, accelerator_metrics: bool, runs: int) -> dict[str, object]:
    metrics = build_metrics_registry(ingestor, accelerator_metrics=accelerator_metrics)
    timings_s = []
    body = b""
    for _ in range(runs):
        started = time.perf_counter()
        body = metrics.fleet_exposition()
        timings_s.append(time.perf_counter() - started)
    return {
        "accelerator_metrics": accelerator_metrics,
        "median_s": round(statistics.median(timings_s), 4),
        "min_s": round(min(timings_s), 4),
        "max_s": round(max(timings_s), 4),
        "bytes": len(body),
        "gzip_bytes": len(gzip.compress(body, compresslevel=6)),  # what a gzip scrape moves
        "series": sum(1 for line in body.splitlines() if line and not line.startswith(b"#")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1250)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    started = time.perf_counter()
    registry = populated_registry(args.nodes)
    ingestor = Ingestor(registry, Topics(), max_payload_bytes=1 << 20)
    gpus = sum(
        1 for record in registry for device in record.status.accelerators if device.kind == "gpu"
    )
    print(
        json.dumps(
            {"nodes": args.nodes, "gpus": gpus, "setup_s": round(time.perf_counter() - started, 1)}
        )
    )
    for accelerator_metrics in (True, False):
        result = measure(ingestor, accelerator_metrics=accelerator_metrics, runs=args.runs)
        print(json.dumps(result))


if __name__ == "__main__":
    main()
