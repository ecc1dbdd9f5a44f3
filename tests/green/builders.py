"""Small scenarios for the green scheduling tests: nodes with power profiles, flat or
hand-made hourly grid series."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from cloud.scheduler import AcceleratorPool, Allocation, Node, Snapshot, TrainingJob, Work
from cloud.signals.grid import GridSignals, ZoneSeries

T0 = 1_686_787_200.0  # 2023-06-15T00:00:00Z, an hour boundary
HOUR = 3600.0


def gpu_server(
    node_id: str,
    zone: str,
    *,
    region: str = "r",
    count: int = 4,
    speed: float = 1.0,
    idle_w: float = 50.0,
    max_w: float = 400.0,
    cpu: tuple[float, float] | None = (100.0, 500.0),
    site: str = "cloud",
) -> Node:
    """A GPU server; ``cpu`` is the host CPU's (idle, max) power, None for no CPU pool."""
    pools = [
        AcceleratorPool(
            kind="gpu",
            count=count,
            model="A100",
            relative_speed=speed,
            idle_power_w=idle_w,
            max_power_w=max_w,
            onnx_providers=("CUDAExecutionProvider",),
        )
    ]
    if cpu is not None:
        pools.append(
            AcceleratorPool(
                kind="cpu",
                count=1,
                relative_speed=0.01,
                idle_power_w=cpu[0],
                max_power_w=cpu[1],
                onnx_providers=("CPUExecutionProvider",),
            )
        )
    return Node(
        node_id=node_id,
        site="cloud" if site == "cloud" else "edge",
        zone=zone,
        region=region,
        pools=tuple(pools),
    )


def series(
    zone: str,
    carbon: Sequence[float],
    *,
    price: Sequence[float] | None = None,
    start: float = T0,
    currency: str = "USD",
) -> ZoneSeries:
    values = np.array(carbon, dtype=np.float64)
    return ZoneSeries(
        zone=zone,
        start_s=start,
        carbon_g_per_kwh=values,
        price_per_mwh=np.array(price if price is not None else [50.0] * len(carbon)),
        currency=currency,
    )


def flat(zone: str, carbon: float, *, hours: int = 72, price: float = 50.0) -> ZoneSeries:
    return series(zone, [carbon] * hours, price=[price] * hours)


def grid(*zones: ZoneSeries, now: float = T0) -> GridSignals:
    return GridSignals(now_s=now, zones={z.zone: z for z in zones})


def snapshot(nodes: Sequence[Node], queue: Sequence[Work] = (), *, now: float = T0) -> Snapshot:
    return Snapshot.build(now=now, nodes=nodes, queue=queue)


def by_node(snap: Snapshot, values: np.ndarray, nodes: np.ndarray) -> Mapping[str, float]:
    return {snap.nodes.node_ids[n]: float(v) for n, v in zip(nodes, values, strict=True)}


def running_on(node_id: str, job: TrainingJob, *, started: float = T0) -> Allocation:
    """`job`'s one worker, running on `node_id` since `started`."""
    return Allocation(
        allocation_id=f"{job.work_id}/0",
        work_id=job.work_id,
        work_kind="training",
        tenant=job.tenant,
        priority=job.priority,
        preemptible=job.preemptible,
        node_id=node_id,
        accelerator_kind="gpu",
        accelerators=job.accelerators_per_worker,
        started_at=started,
        expected_end=started + job.duration_s,
    )
