"""The registry's live nodes as the scheduler's immutable `Node`s.

Devices of a kind (healthy ones: a device its agent reports failing is left out
until it recovers) form one pool per model: a GPU split into MIG slices beside
whole GPUs gives a pool of each slice profile (NVML names them "A100-SXM4-40GB MIG
3g.20gb") and one of the whole GPUs, each with its own memory, speed and count,
the largest first (the node's main pool). Devices of one model are folded into
their pool conservatively: the smallest memory and the slowest speed (a job must
fit and finish on whichever device it gets), the mean power, the providers every
device offers, the mean measured utilisation. An allocation holds devices of one
pool; which one is read from the model of the devices it was given (`pool_model`).

A CPU is divisible: its pool counts logical cores, with the CPU's power shared out
per core, so that a small edge device can serve several CPU models side by side
(one core each by default) and the energy model's host share (cores × power per
core) is the whole CPU's. The speed stays the CPU's: a request to a small model
takes about as long on one core as on all of them.

A device's speed and power are what the control plane believes
(`NodeRecord.believed_accelerators`, cloud/fleet/envelope.py): the model table's
figures for a model it knows, never the node's say-so unless an admin trusts the
node's figures. What neither tells (a CPU's power, an unknown GPU's speed) comes from
the defaults below, deliberately middle-of-the-road figures.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cloud.fleet.envelope import runs_training
from cloud.fleet.node_overlay import effective_labels, effective_taints
from cloud.fleet.registry import NodeRecord
from cloud.fleet.secret_receivers import receives_secrets
from cloud.scheduler import AcceleratorPool, Node, NodeTableCache, Taint
from shared.messages import Accelerator, AcceleratorKind, Telemetry, common_providers

# Relative speed (A100 = 1.0) when a device reports none.
DEFAULT_RELATIVE_SPEED: Mapping[AcceleratorKind, float] = MappingProxyType(
    {"gpu": 1.0, "npu": 0.02, "cpu": 0.01}
)
# (idle, max) watts per device when unknown; CPUs per logical core.
DEFAULT_POWER_W: Mapping[AcceleratorKind, tuple[float, float]] = MappingProxyType(
    {"gpu": (50.0, 300.0), "npu": (0.5, 5.0), "cpu": (0.5, 3.0)}
)
# Grid zone -> local time, for start windows ("20:00-06:00 in the site's local time").
# A node label greenfed.io/timezone overrides it.
ZONE_TIMEZONES: Mapping[str, str] = MappingProxyType(
    {
        "CA-ON": "America/Toronto",
        "US-CAL-CISO": "America/Los_Angeles",
        "DE": "Europe/Berlin",
        "ZA": "Africa/Johannesburg",
        "GB": "Europe/London",
        "FR": "Europe/Paris",
        "JP-TK": "Asia/Tokyo",
        "SG": "Asia/Singapore",
        "US-NY-NYIS": "America/New_York",
        "US-MIDA-PJM": "America/New_York",
    }
)
TIMEZONE_LABEL = "greenfed.io/timezone"


def device_power_w(accelerator: Accelerator) -> tuple[float, float]:
    """(idle, max) watts of one device: its own figures, else the defaults (a CPU's
    per core, times its cores)."""
    idle_default, max_default = DEFAULT_POWER_W[accelerator.kind]
    scale = (
        accelerator.compute_units if accelerator.kind == "cpu" and accelerator.compute_units else 1
    )
    return (
        accelerator.idle_power_w if accelerator.idle_power_w is not None else idle_default * scale,
        accelerator.max_power_w if accelerator.max_power_w is not None else max_default * scale,
    )


def _power_w(accelerators: Sequence[Accelerator], kind: AcceleratorKind) -> tuple[float, float]:
    powers = [device_power_w(accelerator) for accelerator in accelerators]
    return sum(p[0] for p in powers) / len(powers), sum(p[1] for p in powers) / len(powers)


def _pool(
    kind: AcceleratorKind, accelerators: Sequence[Accelerator], utilisation: Mapping[str, float]
) -> AcceleratorPool:
    idle_w, max_w = _power_w(accelerators, kind)
    speeds = [a.relative_speed or DEFAULT_RELATIVE_SPEED[kind] for a in accelerators]
    count = len(accelerators)
    if kind == "cpu":
        cores = sum(max(1, a.compute_units) for a in accelerators)
        idle_w, max_w = idle_w * count / cores, max_w * count / cores
        count = cores
    return AcceleratorPool(
        kind=kind,
        count=count,
        model=accelerators[0].model,
        memory_bytes=min(a.memory_bytes for a in accelerators),
        relative_speed=min(speeds),
        idle_power_w=idle_w,
        max_power_w=max_w,
        onnx_providers=common_providers(accelerators),
        utilisation=_pool_utilisation([a.id for a in accelerators], utilisation),
    )


def _pool_utilisation(device_ids: Sequence[str], utilisation: Mapping[str, float]) -> float:
    """The mean measured utilisation of a pool's devices (0 when none was measured)."""
    measured = [utilisation[device_id] for device_id in device_ids if device_id in utilisation]
    return min(1.0, max(0.0, sum(measured) / len(measured))) if measured else 0.0


def _sampled(record: NodeRecord) -> dict[str, float]:
    """Each device's utilisation in the latest sample, as a share."""
    # The wire reports percent; inside the cloud utilisation is a share, 0..1.
    return (
        {sample.id: sample.utilization_pct / 100.0 for sample in record.telemetry.accelerators}
        if record.telemetry is not None
        else {}
    )


def _valid_timezone(name: str | None) -> str | None:
    """A node's own label must not break a scheduling pass: an unknown zone name is ignored."""
    if not name:
        return None
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return None
    return name


def scheduler_node(record: NodeRecord) -> Node:
    return _scheduler_node(record)[0]


def _pool_order(pool: AcceleratorPool) -> tuple[str, int, float, str]:
    return (pool.kind, -pool.memory_bytes, -pool.relative_speed, pool.model)


def _scheduler_node(record: NodeRecord) -> tuple[Node, tuple[tuple[str, ...], ...]]:
    """The scheduler's view of the node, and the ids of the devices in each of its pools
    (in pool order: what a new sample's utilisation is averaged over, `NodeViews`)."""
    status = record.status
    utilisation = _sampled(record)
    by_pool: dict[tuple[AcceleratorKind, str], list[Accelerator]] = {}
    # Speed and power as the control plane takes them, not as the node says.
    for accelerator in record.believed_accelerators:
        if accelerator.healthy:  # an unhealthy device takes no work until it recovers
            # A CPU is one pool of cores whatever its sockets report.
            model = "" if accelerator.kind == "cpu" else accelerator.model
            by_pool.setdefault((accelerator.kind, model), []).append(accelerator)
    pools = sorted(
        (
            (_pool(kind, devices, utilisation), tuple(device.id for device in devices))
            for (kind, _), devices in by_pool.items()
        ),
        key=lambda item: _pool_order(item[0]),
    )
    timezone = _valid_timezone(status.labels.get(TIMEZONE_LABEL)) or ZONE_TIMEZONES.get(status.zone)
    node = Node(
        node_id=status.node_id,
        site=status.site,
        zone=status.zone,
        region=status.region,
        labels=effective_labels(record),
        healthy=record.state == "online",
        host_memory_bytes=status.host.memory_total_bytes,
        timezone=timezone,
        pools=tuple(pool for pool, _ in pools),
        runs_training=runs_training(status),
        # An agent older than schema 1.8 runs workers as its own user: "none".
        isolation=status.isolation or "none",
        runs_containers=bool(status.container_runtimes),
        receives_secrets=receives_secrets(record),
        approved=not record.awaiting_approval,
        taints=tuple(Taint(t.key, t.value, t.effect) for t in effective_taints(record)),
    )
    return node, tuple(device_ids for _, device_ids in pools)


def pool_model(record: NodeRecord | None, accelerator_ids: Sequence[str]) -> str:
    """The model of the pool an allocation's devices belong to ("" when unknown: the
    scheduler then counts it in the node's main pool of the kind)."""
    if record is None or not accelerator_ids:
        return ""
    first = accelerator_ids[0]
    for accelerator in record.status.accelerators:
        if accelerator.id == first:
            return accelerator.model
    return ""


class NodeViews:
    """`scheduler_node` of each record, made again only when something it reads apart
    from the sample changed: a pass over ten thousand nodes spent most of its time
    remaking nodes of which only a sample had moved. Records are compared by what
    `scheduler_node` reads (the objects a change replaces); nodes gone from the registry
    are dropped. A node keeps the utilisation of the sample its view was made from; a
    newer sample's is in `measured` (for `Snapshot.build(utilisation=...)`, which takes
    it over the pools' figure). `tables` keeps the scheduler's columns of these nodes
    from one snapshot to the next (`Snapshot.build(tables=...)`)."""

    def __init__(self) -> None:
        self._views: dict[str, _View] = {}
        self.tables = NodeTableCache()

    def of(self, records: Iterable[NodeRecord]) -> list[Node]:
        views: dict[str, _View] = {}
        for record in records:
            view = self._views.get(record.node_id)
            key = _view_key(record)
            if view is None or view.key != key:
                node, pool_devices = _scheduler_node(record)
                view = _View(key, record.telemetry, node, pool_devices)
            elif view.telemetry is not record.telemetry:
                # Only a new sample: the pools' utilisation is all that may have moved.
                sampled = _sampled(record)
                view.telemetry = record.telemetry
                view.measured = tuple(_pool_utilisation(ids, sampled) for ids in view.pool_devices)
            views[record.node_id] = view
        self._views = views
        return [view.node for view in views.values()]

    def measured(self) -> dict[str, tuple[float, ...]]:
        """Per node whose sample is newer than its view's node (as of the last `of`):
        its pools' utilisation in that sample, in pool order."""
        return {
            node_id: view.measured
            for node_id, view in self._views.items()
            if view.measured is not None
        }


@dataclass(slots=True)
class _View:
    key: tuple[object, ...]  # what scheduler_node reads apart from telemetry
    telemetry: Telemetry | None  # the latest sample seen (compared by identity)
    node: Node  # as made from `key` and the sample of that time
    pool_devices: tuple[tuple[str, ...], ...]  # the device ids of each of node.pools
    # The latest sample's utilisation of each of node.pools, once newer than node's.
    measured: tuple[float, ...] | None = None


def _view_key(record: NodeRecord) -> tuple[object, ...]:
    # Tuples compare their items by identity first: unchanged records cost that.
    return (
        record.status,
        record.state,
        record.admin,
        record.awaiting_approval,
        record.believed_accelerators,
    )
