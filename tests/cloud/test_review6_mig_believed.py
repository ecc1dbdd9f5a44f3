"""What the scheduler believes of MIG slices as agents announce them, the physical GPU
never listed (docs/mqtt.md): each slice its GPU's power and speed by its share of the
GPU (cloud/fleet/envelope.py `trusted_speed_and_power`; docs/rest.md, "What a node may
be"), never the whole GPU's."""

from __future__ import annotations

import random

import msgspec
import pytest

from cloud.fleet.registry import NodeRegistry
from cloud.loop.nodes import scheduler_node
from shared.accelerators import AcceleratorFacts, nvidia_gpu_facts, required
from shared.messages import Accelerator, HostInfo, NodeStatus
from sim_devices.probes import SimulatedNode
from sim_devices.profiles import get_profile

GB = 1000**3
A100_80GB = "NVIDIA A100-SXM4-80GB"


def table() -> AcceleratorFacts:
    facts = nvidia_gpu_facts(A100_80GB)
    assert facts is not None
    return facts


TABLE = table()
TABLE_SMS = required(TABLE.compute_units, TABLE, "compute_units")
TABLE_MEMORY_BYTES = required(TABLE.memory_bytes, TABLE, "memory_bytes")
TABLE_IDLE_W = required(TABLE.idle_power_w, TABLE, "idle_power_w")
TABLE_MAX_W = required(TABLE.max_power_w, TABLE, "max_power_w")


def mig_slice(index: int, **fields: object) -> Accelerator:
    """A 1g.10gb slice as discovery announces it: 14 SMs, parent_id set; its own speed
    and power, which the control plane does not take."""
    accelerator = Accelerator(
        id=f"gpu0-mig{index}", kind="gpu", vendor="nvidia", model=f"{A100_80GB} MIG 1g.10gb",
        memory_bytes=10 * GB, compute_units=14, idle_power_w=1.0, max_power_w=2.0,
        relative_speed=None, onnx_providers=("CUDAExecutionProvider",), uuid=f"MIG-{index}",
        parent_id="gpu0",
    )  # fmt: skip
    return msgspec.structs.replace(accelerator, **fields)


def birth(accelerators: tuple[Accelerator, ...]) -> NodeStatus:
    return NodeStatus(
        node_id="n1", state="online", instance_id="i1", agent_version="test", site="cloud",
        zone="DE", region="eu",
        host=HostInfo(hostname="h", os="Linux", arch="x86_64", cpu_logical_cores=32,
                      memory_total_bytes=64 * GB),
        accelerators=accelerators, telemetry_interval_s=10.0, started_at=0.0, sent_at=0.0,
    )  # fmt: skip


def believed(accelerators: tuple[Accelerator, ...]) -> dict[str, Accelerator]:
    registry = NodeRegistry()
    registry.apply_status(birth(accelerators))
    record = registry.get("n1")
    assert record is not None
    return {accelerator.id: accelerator for accelerator in record.believed_accelerators}


def test_a_slice_draws_and_runs_at_its_share_of_its_gpu_by_compute_units() -> None:
    slices = believed((mig_slice(0), mig_slice(1)))
    share = 14 / TABLE_SMS
    for accelerator in slices.values():
        assert accelerator.idle_power_w == pytest.approx(TABLE_IDLE_W * share)
        assert accelerator.max_power_w == pytest.approx(TABLE_MAX_W * share)
        # It sent no speed: the table's, by its share (not the whole GPU's).
        assert accelerator.relative_speed == pytest.approx(share)


def test_a_slice_without_compute_units_shares_by_its_memory_against_the_table_s() -> None:
    (accelerator,) = believed((mig_slice(0, compute_units=0),)).values()
    share = 10 * GB / TABLE_MEMORY_BYTES
    assert accelerator.max_power_w == pytest.approx(TABLE_MAX_W * share)
    assert accelerator.relative_speed == pytest.approx(share)


def test_the_scheduler_s_pool_of_a_simulated_mig_server_is_its_slices_not_seven_gpus() -> None:
    node = SimulatedNode("mig", get_profile("a100-mig"), random.Random(1))
    registry = NodeRegistry()
    registry.apply_status(birth(tuple(node.accelerators)))
    record = registry.get("n1")
    assert record is not None
    slices = [a for a in node.accelerators if a.parent_id is not None]
    assert slices
    (pool,) = [p for p in scheduler_node(record).pools if p.model == slices[0].model]
    # Seven 1g slices of one A100: each about a seventh of its power, not all of it.
    assert pool.max_power_w < TABLE_MAX_W / 5
    assert pool.relative_speed < 1 / 5
