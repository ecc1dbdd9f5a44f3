"""A GPU in MIG mode is metered once, however many of its slices are announced: each
slice's sample repeats the whole GPU's power and energy counter (edge/discovery/nvidia.py,
docs/mqtt.md), so the GPU's energy is split among its slices by their part of its
compute, an idle slice's part billed to no one, and the zone's power counts the GPU once
(cloud/usage/meter.py `SlicedGpu`, cloud/usage/metrics.py `believed_node_power_w`)."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from cloud.fleet.registry import NodeRegistry
from cloud.store import AllocationRecord, StoreSnapshot, UsageQuery, open_store
from cloud.usage.accountant import Accountant
from cloud.usage.meter import MeteredAllocation, mark_of, meter
from cloud.usage.metrics import ZonePower, announced_samples, believed_node_power_w
from shared.messages import Accelerator, AcceleratorSample, HostInfo, NodeStatus, Telemetry
from shared.settings import UsageSettings
from tests.store.databases import DatabaseUnderTest
from tests.usage.test_accountant import T0, Clock, grid

pytestmark = pytest.mark.timeout(60)

GB = 1000**3
INTERVAL_S = 10.0
GPU_POWER_W = 200.0  # what the one physical A100 draws, all slices together
A100 = "NVIDIA A100-SXM4-80GB"


def mig_slice(index: int, profile: str, sms: int) -> Accelerator:
    """As discovery announces one (`_mig_accelerator`): its SM share of the GPU's 400 W
    (98 SMs in slices); the physical GPU itself is never announced."""
    share = sms / 98
    return Accelerator(
        id=f"gpu0-mig{index}", kind="gpu", vendor="nvidia", model=f"{A100} MIG {profile}",
        memory_bytes=int(profile.split(".")[1].removesuffix("gb")) * GB, compute_units=sms,
        idle_power_w=50.0 * share, max_power_w=400.0 * share, relative_speed=share,
        onnx_providers=("CUDAExecutionProvider",), uuid=f"MIG-{index}", parent_id="gpu0",
    )  # fmt: skip


# A 1g.10gb (14 SMs), a 2g.20gb (28 SMs) and an idle 4g.40gb (56 SMs): 1/7, 2/7, 4/7.
SLICES = (mig_slice(0, "1g.10gb", 14), mig_slice(1, "2g.20gb", 28), mig_slice(2, "4g.40gb", 56))
WHOLE_GPU = Accelerator(
    id="gpu1", kind="gpu", vendor="nvidia", model=A100, memory_bytes=80 * GB,
    compute_units=108, idle_power_w=50.0, max_power_w=400.0,
)  # fmt: skip


def birth(accelerators: tuple[Accelerator, ...] = SLICES) -> NodeStatus:
    return NodeStatus(
        node_id="n1", state="online", instance_id="i1", agent_version="test", site="cloud",
        zone="DE", region="europe-west3",
        host=HostInfo(hostname="h", os="Linux", arch="x86_64", cpu_logical_cores=32,
                      memory_total_bytes=64 * GB),
        accelerators=accelerators, telemetry_interval_s=INTERVAL_S, started_at=T0 - 100,
        sent_at=T0,
    )  # fmt: skip


def reading(
    at_s: float,
    *,
    power_w: float | None = GPU_POWER_W,
    counter: bool = True,
    devices: tuple[Accelerator, ...] = SLICES,
    seq: int | None = None,
) -> Telemetry:
    """Every slice carries the physical GPU's power and cumulative counter, as
    `_sample_device` and `_energy_j` send them; a whole GPU its own."""
    energy_j = GPU_POWER_W * (at_s - T0 + 1000.0) if counter else None
    return Telemetry(
        node_id="n1", instance_id="i1",
        seq=seq if seq is not None else round((at_s - T0) / INTERVAL_S) + 10,
        sampled_at=at_s, interval_s=INTERVAL_S, cpu_utilization_pct=5.0,
        memory_used_bytes=GB, memory_total_bytes=64 * GB,
        accelerators=tuple(
            AcceleratorSample(id=device.id, utilization_pct=50.0, memory_used_bytes=GB,
                              power_w=power_w, energy_j=energy_j)
            for device in devices
        ),
    )  # fmt: skip


def on_slice(tenant_id: str, slice_id: str) -> MeteredAllocation:
    return MeteredAllocation(
        f"job-{tenant_id}", 0, tenant_id, "n1", "gpu", 1, (slice_id,), "training", T0 - 100.0
    )


# Two tenants' jobs on the 1g and the 2g slice; the 4g slice is idle.
TENANTS = (on_slice("t1", "gpu0-mig0"), on_slice("t2", "gpu0-mig1"))


def billed_j(
    first: Telemetry, second: Telemetry, inventory: NodeStatus | None = None
) -> tuple[dict[str, float], dict[str, float], list[str]]:
    """Each tenant's energy and measured energy over the step, and the devices refused."""
    implausible: list[str] = []
    increments, _ = meter(
        inventory or birth(),
        second,
        mark_of(first),
        TENANTS,
        host_overhead_ratio=0.0,
        implausible=implausible,
    )
    energy = {i.allocation.tenant_id: i.energy_j for i in increments}
    measured = {i.allocation.tenant_id: i.measured_j for i in increments}
    return energy, measured, implausible


def test_the_gpu_s_counter_is_billed_once_by_each_slice_s_share_of_its_compute() -> None:
    energy, measured, implausible = billed_j(reading(T0), reading(T0 + INTERVAL_S))
    gpu_j = GPU_POWER_W * INTERVAL_S
    assert energy == pytest.approx({"t1": gpu_j / 7, "t2": gpu_j * 2 / 7})
    assert measured == energy
    assert implausible == []
    # The idle 4g slice's four sevenths are billed to no one: never more than the GPU drew.
    assert sum(energy.values()) == pytest.approx(gpu_j * 3 / 7)


def test_the_gpu_s_power_sample_is_integrated_once_without_a_counter() -> None:
    energy, measured, _ = billed_j(
        reading(T0, counter=False), reading(T0 + INTERVAL_S, counter=False)
    )
    gpu_j = GPU_POWER_W * INTERVAL_S
    assert energy == pytest.approx({"t1": gpu_j / 7, "t2": gpu_j * 2 / 7})
    assert measured == energy


def test_the_model_fills_in_for_the_gpu_once_from_its_slices_power_together() -> None:
    energy, measured, _ = billed_j(
        reading(T0, power_w=None, counter=False),
        reading(T0 + INTERVAL_S, power_w=None, counter=False),
    )
    # Slices' idle and maximum together: 50 and 400 W at 50 %: 225 W for the GPU.
    gpu_j = 225.0 * INTERVAL_S
    assert energy == pytest.approx({"t1": gpu_j / 7, "t2": gpu_j * 2 / 7})
    assert measured == {"t1": 0.0, "t2": 0.0}


def test_plausibility_is_judged_against_the_slices_maximum_power_together() -> None:
    # 1 kW: more than 4 times any one slice's maximum (229 W at most), within 4 times
    # the slices' together (1,600 W): believed.
    power_w = 1000.0
    energy, _, implausible = billed_j(
        reading(T0, power_w=power_w, counter=False),
        reading(T0 + INTERVAL_S, power_w=power_w, counter=False),
    )
    assert implausible == []
    assert energy["t1"] == pytest.approx(power_w * INTERVAL_S / 7)
    # Beyond what the slices together can draw: refused once, naming the GPU, and the
    # model counts it.
    power_w = 2000.0
    energy, measured, implausible = billed_j(
        reading(T0, power_w=power_w, counter=False),
        reading(T0 + INTERVAL_S, power_w=power_w, counter=False),
    )
    assert implausible == ["gpu0"]
    assert energy["t1"] == pytest.approx(225.0 * INTERVAL_S / 7)
    assert measured["t1"] == 0.0


def test_a_slice_without_a_sample_does_not_change_what_the_gpu_bills() -> None:
    # The first slice's sample failed this time: the GPU's figures come from another,
    # and the first slice still gets its share.
    second = reading(T0 + INTERVAL_S, devices=SLICES[1:])
    energy, _, _ = billed_j(reading(T0), second)
    gpu_j = GPU_POWER_W * INTERVAL_S
    assert energy == pytest.approx({"t1": gpu_j / 7, "t2": gpu_j * 2 / 7})


def test_slices_that_name_no_compute_units_share_by_their_mig_profile() -> None:
    no_sms = tuple(msgspec.structs.replace(s, compute_units=0) for s in SLICES)
    energy, _, _ = billed_j(reading(T0), reading(T0 + INTERVAL_S), birth(no_sms))
    gpu_j = GPU_POWER_W * INTERVAL_S
    assert energy == pytest.approx({"t1": gpu_j / 7, "t2": gpu_j * 2 / 7})


def test_a_new_agent_instance_s_gap_is_modelled_once_for_the_gpu() -> None:
    # The agent restarted: the time between the old instance's last sample and the new
    # one's first interval is a gap, modelled for the GPU as a whole.
    restarted = msgspec.structs.replace(reading(T0 + 100.0, seq=1), instance_id="i2")
    increments, _ = meter(
        birth(), restarted, mark_of(reading(T0)), TENANTS, host_overhead_ratio=0.0
    )
    t1_j = sum(i.energy_j for i in increments if i.allocation.tenant_id == "t1")
    # 90 s modelled at 225 W and the new instance's first 10 s measured at 200 W, 1/7.
    assert t1_j == pytest.approx((225.0 * 90.0 + GPU_POWER_W * INTERVAL_S) / 7)


def test_the_zone_and_the_node_count_the_gpu_s_power_once() -> None:
    devices = (*SLICES, WHOLE_GPU)
    inventory = birth(devices)
    sample = reading(T0, devices=devices)
    # The MIG GPU's 200 W once, and the whole GPU's own 200 W.
    assert believed_node_power_w(announced_samples(inventory, sample)) == 400.0
    text = ZonePower().render([(inventory, sample)]).decode()
    assert 'greenfed_zone_power_watts{zone="DE"} 400.0' in text.splitlines()
    # A power that the slices together could not draw: the model's figure, once.
    lying = reading(T0, power_w=5000.0)
    assert believed_node_power_w(announced_samples(birth(), lying)) == pytest.approx(225.0)


def running(allocation: MeteredAllocation) -> AllocationRecord:
    return AllocationRecord(
        work_id=allocation.work_id, member_index=0, node_id="n1", accelerator_kind="gpu",
        accelerators=1, accelerator_ids=allocation.accelerator_ids, host_memory_bytes=0,
        started_at=T0, expected_end=None, borrowed=False, state="running",
        tenant_id=allocation.tenant_id, work_kind="training", priority="p1",
    )  # fmt: skip


def snapshot() -> StoreSnapshot:
    allocations = tuple(running(allocation) for allocation in TENANTS)
    return StoreSnapshot(tenants=(), work=(), allocations=allocations, node_generations={})


async def test_two_tenants_on_slices_of_one_gpu_are_billed_what_it_drew_in_the_store(
    database: DatabaseUnderTest,
) -> None:
    clock = Clock()
    store = await open_store(database.settings, clock=clock)
    try:
        lease = None
        async with asyncio.timeout(10):
            while lease is None:
                lease = await store.try_acquire_leadership()
        registry = NodeRegistry(wall_clock=clock)
        registry.apply_status(birth())
        accountant = Accountant(store, registry, UsageSettings(), clock=clock)
        accountant.note_pass(snapshot(), grid(clock.now))
        await accountant.begin(lease)
        accountant.note_pass(snapshot(), grid(clock.now))
        for step in range(31):  # 300 s
            clock.now = T0 + step * INTERVAL_S
            accountant.observe(reading(clock.now))
        await accountant.flush(lease)
        rows = await store.usage(UsageQuery())
        by_job: dict[str, float] = {}
        for row in rows:
            by_job[row.work_id] = by_job.get(row.work_id, 0.0) + row.energy_j
        # No CPU reported: 10 % host overhead on each slice's share of the GPU's 60 kJ.
        gpu_j = GPU_POWER_W * 300.0 * 1.1
        assert by_job == pytest.approx({"job-t1": gpu_j / 7, "job-t2": gpu_j * 2 / 7})
    finally:
        await store.close()
