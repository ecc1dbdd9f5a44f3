"""The one-line fleet summary printed by `greenfed up`."""

from __future__ import annotations

from collections import Counter

from cloud.fleet.registry import NodeRegistry
from cloud.usage.metrics import announced_samples, believed_node_power_w


def fleet_summary_line(registry: NodeRegistry) -> str:
    records = registry.nodes()
    online = [record for record in records if record.state == "online"]
    sites = Counter(record.status.site for record in online)
    zones = Counter(record.status.zone for record in online)
    kinds: Counter[str] = Counter()
    power_w = 0.0
    for record in online:
        kinds.update(accelerator.kind for accelerator in record.status.accelerators)
        if record.telemetry is not None:
            samples = announced_samples(record.status, record.telemetry)
            power_w += believed_node_power_w(samples) or 0.0
    parts = [
        f"fleet: {len(online)}/{len(records)} online",
        f"cloud {sites['cloud']}, edge {sites['edge']}",
        "accelerators " + ", ".join(f"{kind} {kinds[kind]}" for kind in ("gpu", "npu", "cpu")),
        "zones " + ", ".join(f"{zone} {count}" for zone, count in sorted(zones.items())),
        f"drawing {power_w / 1000:.1f} kW",
    ]
    return " · ".join(parts)
