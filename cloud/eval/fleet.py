"""The evaluation's cluster: fleet files (``sim_devices`` format) as scheduler nodes.

Each node gets one pool per accelerator of its device profile and a ``cpu`` pool
for its host CPU, as a greenfed agent reports them (the CPU is one device whose
power profile also gives the host share in the energy model). Sites, zones,
regions, labels and taints come from the fleet file.
"""

from __future__ import annotations

from pathlib import Path

from cloud.scheduler import AcceleratorPool, Node, Taint
from shared.mig_profiles import COMPUTE_SLICES, compute_sevenths, mig_memory_bytes, slice_model
from sim_devices.fleet import Fleet, SimNodeSpec, expand_fleet, load_fleet
from sim_devices.profiles import CPU_PROVIDERS, AcceleratorProfile, DeviceProfile


def _pool(accelerator: AcceleratorProfile) -> AcceleratorPool:
    """The profile's accelerators as one pool; GPUs in MIG mode as the pool of their
    slices, as the control plane sees them (cloud/loop/nodes.py)."""
    profile = accelerator.mig_profile
    if profile is None:
        return AcceleratorPool(
            kind=accelerator.kind,
            count=accelerator.count,
            model=accelerator.model,
            memory_bytes=accelerator.memory_bytes,
            relative_speed=accelerator.relative_speed,
            idle_power_w=accelerator.idle_power_w,
            max_power_w=accelerator.max_power_w,
            onnx_providers=accelerator.onnx_providers,
        )
    share = compute_sevenths(profile) / COMPUTE_SLICES
    return AcceleratorPool(
        kind=accelerator.kind,
        count=accelerator.count * (COMPUTE_SLICES // compute_sevenths(profile)),
        model=slice_model(accelerator.model, profile),
        memory_bytes=mig_memory_bytes(profile),
        relative_speed=accelerator.relative_speed * share,
        idle_power_w=accelerator.idle_power_w * share,
        max_power_w=accelerator.max_power_w * share,
        onnx_providers=accelerator.onnx_providers,
    )


def pools(profile: DeviceProfile) -> tuple[AcceleratorPool, ...]:
    # The largest pool of a kind first: the node's main pool, as the control plane orders them.
    accelerators = sorted(
        (_pool(accelerator) for accelerator in profile.accelerators if accelerator.kind != "cpu"),
        key=lambda pool: (pool.kind, -pool.memory_bytes, -pool.relative_speed, pool.model),
    )
    cpu = AcceleratorPool(
        kind="cpu",
        count=1,
        model=profile.cpu_model,
        memory_bytes=profile.memory_bytes,
        relative_speed=profile.cpu_relative_speed,
        idle_power_w=profile.cpu_idle_power_w,
        max_power_w=profile.cpu_max_power_w,
        onnx_providers=CPU_PROVIDERS,
    )
    return (*accelerators, cpu)


def node_from_spec(spec: SimNodeSpec) -> Node:
    return Node(
        node_id=spec.node_id,
        site=spec.site,
        zone=spec.zone,
        region=spec.region,
        labels=spec.labels,
        host_memory_bytes=spec.profile.memory_bytes,
        pools=pools(spec.profile),
        taints=tuple(Taint(t.key, t.value, t.effect) for t in spec.taints),
    )


def fleet_nodes(fleet: Fleet) -> list[Node]:
    return [node_from_spec(spec) for spec in expand_fleet(fleet)]


def load_fleet_nodes(path: Path | None = None) -> list[Node]:
    """The nodes of a fleet file; None: the default fleet (40 nodes, four zones)."""
    return fleet_nodes(load_fleet(path))
