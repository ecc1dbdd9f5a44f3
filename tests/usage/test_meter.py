"""Energy of each allocation from telemetry (cloud/usage/meter.py) and its pricing on the
recorded grid (cloud/usage/pricing.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cloud.signals.grid import GridSignals, ZoneSeries
from cloud.store import CounterfactualRecord
from cloud.usage.meter import MeteredAllocation, NodeMark, held_power_limits_w, meter
from cloud.usage.pricing import Priced, price
from shared.messages import (
    Accelerator,
    AcceleratorSample,
    HostInfo,
    NodeStatus,
    ReportedState,
    ReportedTraining,
    Telemetry,
)

GIB = 1024**3
T0 = 1_700_000_000.0 - 1_700_000_000.0 % 3600  # on an hour
GPU = Accelerator(
    id="gpu0", kind="gpu", vendor="nvidia", model="A100", memory_bytes=80 * GIB,
    compute_units=108, idle_power_w=50.0, max_power_w=400.0,
)  # fmt: skip
GPU1 = Accelerator(
    id="gpu1", kind="gpu", vendor="nvidia", model="A100", memory_bytes=80 * GIB,
    compute_units=108, idle_power_w=50.0, max_power_w=400.0,
)  # fmt: skip
CPU = Accelerator(
    id="cpu0", kind="cpu", vendor="intel", model="Xeon", memory_bytes=64 * GIB,
    compute_units=32, idle_power_w=60.0, max_power_w=220.0,
)  # fmt: skip


def birth(*accelerators: Accelerator) -> NodeStatus:
    return NodeStatus(
        node_id="n1", state="online", instance_id="i1", agent_version="test", site="cloud",
        zone="DE", region="europe-west3",
        host=HostInfo(hostname="h", os="Linux", arch="x86_64", cpu_logical_cores=32,
                      memory_total_bytes=64 * GIB),
        accelerators=accelerators, telemetry_interval_s=10.0, started_at=T0, sent_at=T0,
    )  # fmt: skip


def sample(
    at: float, seq: int, *, energy: dict[str, float] | None = None,
    power: dict[str, float] | None = None, util: float = 80.0, instance: str = "i1",
) -> Telemetry:  # fmt: skip
    ids = sorted(set(energy or {}) | set(power or {})) or ["gpu0"]
    return Telemetry(
        node_id="n1", instance_id=instance, seq=seq, sampled_at=at, interval_s=10.0,
        cpu_utilization_pct=10.0, memory_used_bytes=GIB, memory_total_bytes=64 * GIB,
        accelerators=tuple(
            AcceleratorSample(
                id=i, utilization_pct=util, memory_used_bytes=0,
                power_w=(power or {}).get(i), energy_j=(energy or {}).get(i),
            )
            for i in ids
        ),
    )  # fmt: skip


def job(
    start: float = T0, end: float | None = None, ids: tuple[str, ...] = ("gpu0",)
) -> MeteredAllocation:
    return MeteredAllocation(
        work_id="job-1", member_index=0, tenant_id="t1", node_id="n1", accelerator_kind="gpu",
        accelerators=len(ids), accelerator_ids=ids, work_kind="training", started_at_s=start,
        ended_at_s=end,
    )  # fmt: skip


def test_counter_differences_are_the_energy_and_span_lost_samples() -> None:
    node = birth(GPU)
    _, mark = meter(node, sample(T0, 1, energy={"gpu0": 1000.0}), None, [job()])
    # Samples 2..9 never arrived: the counter still says what was used.
    increments, mark2 = meter(node, sample(T0 + 90, 10, energy={"gpu0": 28_000.0}), mark, [job()])
    (one,) = increments
    assert (one.start_s, one.end_s) == (T0, T0 + 90)
    # No CPU on the node: the energy model's 10 % host overhead.
    assert one.energy_j == pytest.approx(27_000.0 * 1.1)
    assert one.measured_j == pytest.approx(one.energy_j)
    assert one.gap_s == 0.0
    assert mark2 is not None
    assert mark2.seq == 10


def test_a_replayed_or_old_sample_counts_nothing_and_keeps_the_mark() -> None:
    node = birth(GPU)
    mark = NodeMark("i1", 5, T0 + 50, {"gpu0": 5000.0})
    for old in (sample(T0 + 50, 5, energy={"gpu0": 5000.0}), sample(T0 + 40, 4)):
        increments, kept = meter(node, old, mark, [job()])
        assert increments == []
        assert kept is mark


def test_power_samples_then_the_model_fill_a_gap_and_flag_it() -> None:
    node = birth(GPU)
    mark = NodeMark("i1", 1, T0, {})
    # 10 s interval, next sample after 100 s and no counter: 10 s measured, 90 s modelled.
    (one,), _ = meter(node, sample(T0 + 100, 2, power={"gpu0": 300.0}, util=50.0), mark, [job()])
    modelled_w = 50.0 + (400.0 - 50.0) * 0.5
    assert one.measured_j == pytest.approx(300.0 * 10 * 1.1)
    assert one.energy_j == pytest.approx((300.0 * 10 + modelled_w * 90) * 1.1)
    assert one.gap_s == pytest.approx(90.0)


def test_a_counter_or_a_power_no_device_could_draw_is_not_believed() -> None:
    # A node reports its own figures and its tenants are billed by them: a GPU of 400 W
    # may be believed up to 4 x 400 W on average over a step, no more.
    node = birth(GPU)
    refused: list[str] = []
    # 10 s after the mark the counter claims 1 GJ (100 MW): the power sample counts.
    lying_counter = sample(T0 + 10, 2, energy={"gpu0": 1e9}, power={"gpu0": 300.0})
    (one,), mark = meter(
        node, lying_counter, NodeMark("i1", 1, T0, {"gpu0": 0.0}), [job()], implausible=refused
    )
    assert one.energy_j == pytest.approx(300.0 * 10 * 1.1)
    assert one.measured_j == pytest.approx(one.energy_j)
    assert refused == ["gpu0"]
    assert mark is not None
    assert mark.energy_j == {"gpu0": 1e9}  # the next step starts from it: one step lost
    # 10 kW from a 400 W GPU: the model counts the step, measured nothing.
    refused.clear()
    lying_power = sample(T0 + 10, 2, power={"gpu0": 10_000.0}, util=80.0)
    (two,), _ = meter(node, lying_power, NodeMark("i1", 1, T0, {}), [job()], implausible=refused)
    assert two.energy_j == pytest.approx((50.0 + 350.0 * 0.8) * 10 * 1.1)
    assert two.measured_j == 0.0
    assert refused == ["gpu0"]
    # A real device's excursion (1.5 kW over the step, under 4 x 400 W) is believed.
    refused.clear()
    surge = sample(T0 + 10, 2, energy={"gpu0": 15_000.0})
    (three,), _ = meter(
        node, surge, NodeMark("i1", 1, T0, {"gpu0": 0.0}), [job()], implausible=refused
    )
    assert three.measured_j == pytest.approx(15_000.0 * 1.1)
    assert refused == []


def test_a_counter_that_moves_in_steps_is_judged_over_the_time_since_it_last_moved() -> None:
    # A cluster's energy accounting polls every half minute or so (cloud/clusters/): its
    # counter stays put for several samples, then takes the whole interval's energy in
    # one step. 48 kJ in 10 s would be 4.8 kW from a 400 W GPU; since the counter last
    # moved 40 s before, it is 1.2 kW, which a GPU and its share of the host can draw.
    node = birth(GPU)
    refused: list[str] = []
    mark = None
    total_j = 0.0
    for seq, (at, counter) in enumerate(
        [(T0, 0.0), (T0 + 10, 0.0), (T0 + 20, 0.0), (T0 + 30, 0.0), (T0 + 40, 48_000.0)], 1
    ):
        increments, mark = meter(
            node, sample(at, seq, energy={"gpu0": counter}), mark, [job()], implausible=refused
        )
        total_j += sum(one.measured_j for one in increments)
        if at == T0 + 30:
            assert mark is not None
            assert mark.moved_at_s == {"gpu0": T0}  # it has read 0 since T0
    assert refused == []
    assert total_j == pytest.approx(48_000.0 * 1.1)
    assert mark is not None
    assert mark.moved_at_s == {}  # it moved at this sample
    # The same jump again 10 s later cannot be true: the counter moved 10 s before.
    increments, _ = meter(
        node, sample(T0 + 50, 6, energy={"gpu0": 96_000.0}), mark, [job()], implausible=refused
    )
    assert refused == ["gpu0"]
    assert sum(one.measured_j for one in increments) == 0.0


def reported(*entries: ReportedTraining) -> ReportedState:
    return ReportedState(
        node_id="n1", instance_id="i1", observed_generation=1, reported_at=T0, training=entries
    )


def test_the_model_never_fills_a_gap_above_the_power_limit_the_node_holds() -> None:
    # A capped run's GPU draws at most its limit: a gap the model fills says so too,
    # or a capped job would be charged the uncapped draw whenever telemetry is lost.
    node = birth(GPU)
    mark = NodeMark("i1", 1, T0, {})
    reading = sample(T0 + 100, 2, power={"gpu0": 240.0}, util=100.0)
    held = held_power_limits_w(
        reported(ReportedTraining(job_id="job-1", state="running", power_limit_w=240.0)), [job()]
    )
    assert held == {"gpu0": 240.0}
    (capped,), _ = meter(node, reading, mark, [job()], power_limits_w=held)
    assert capped.energy_j == pytest.approx(240.0 * 100 * 1.1)  # 10 s measured, 90 s model
    (uncapped,), _ = meter(node, reading, mark, [job()])
    assert uncapped.energy_j == pytest.approx((240.0 * 10 + 400.0 * 90) * 1.1)


def test_only_a_limit_the_node_reports_holding_for_running_work_counts() -> None:
    allocation = job(ids=("gpu0", "gpu1"))
    # Asked but not applied (no permission): the node holds the default; nothing bounds it.
    refused = ReportedTraining(
        job_id="job-1", state="running", power_limit_note="power limit not applied: no permission"
    )
    assert held_power_limits_w(reported(refused), [allocation]) == {}
    # An ended run gave its limit back; another job's limit is not this one's.
    ended = ReportedTraining(job_id="job-1", state="succeeded", power_limit_w=200.0)
    other = ReportedTraining(job_id="job-9", state="running", power_limit_w=200.0)
    assert held_power_limits_w(reported(ended, other), [allocation]) == {}
    # The newest attempt's entry wins, for each of the worker's devices.
    old = ReportedTraining(job_id="job-1", attempt=0, state="running", power_limit_w=200.0)
    new = ReportedTraining(job_id="job-1", attempt=1, state="starting", power_limit_w=280.0)
    assert held_power_limits_w(reported(new, old), [allocation]) == {"gpu0": 280.0, "gpu1": 280.0}
    assert held_power_limits_w(None, [allocation]) == {}


def test_an_agent_restart_fills_the_time_between_instances_with_the_model() -> None:
    node = birth(GPU)
    mark = NodeMark("i1", 7, T0, {"gpu0": 99_999.0})
    increments, new = meter(
        node, sample(T0 + 60, 0, energy={"gpu0": 10.0}, power={"gpu0": 200.0}, instance="i2"),
        mark, [job()],
    )  # fmt: skip
    assert new is not None
    assert new.instance_id == "i2"
    measured = next(i for i in increments if i.measured_j > 0)
    gap = next(i for i in increments if i.measured_j == 0)
    assert (measured.start_s, measured.end_s) == (T0 + 50, T0 + 60)  # its own interval
    assert (gap.start_s, gap.end_s, gap.gap_s) == (T0, T0 + 50, 50.0)


def test_a_new_instances_first_sample_never_counts_what_the_last_ones_did() -> None:
    # The agent samples as soon as it starts: 3 s after the old instance's last sample,
    # its first sample's own interval (10 s) reaches back past it.
    node = birth(GPU)
    mark = NodeMark("i1", 7, T0 + 100, {"gpu0": 99_999.0})
    increments, _ = meter(
        node, sample(T0 + 103, 0, energy={"gpu0": 10.0}, power={"gpu0": 200.0}, instance="i2"),
        mark, [job()],
    )  # fmt: skip
    (step,) = increments
    assert (step.start_s, step.end_s, step.gap_s) == (T0 + 100, T0 + 103, 0.0)
    assert step.energy_j == pytest.approx(200.0 * 3 * 1.1)


def test_allocations_get_their_own_devices_their_share_of_the_host_and_of_the_step() -> None:
    node = birth(CPU, GPU, GPU1)
    mark = NodeMark("i1", 1, T0, {"gpu0": 0.0, "gpu1": 0.0, "cpu0": 0.0})
    reading = sample(T0 + 100, 2, energy={"gpu0": 30_000.0, "gpu1": 10_000.0, "cpu0": 8_000.0})
    first = job(ids=("gpu0",))
    # Placed half-way through the step, on the other GPU.
    second = MeteredAllocation(
        work_id="job-2", member_index=0, tenant_id="t1", node_id="n1", accelerator_kind="gpu",
        accelerators=1, accelerator_ids=("gpu1",), work_kind="training", started_at_s=T0 + 50,
    )  # fmt: skip
    cpu_work = MeteredAllocation(
        work_id="job-3", member_index=0, tenant_id="t1", node_id="n1", accelerator_kind="cpu",
        accelerators=8, accelerator_ids=(), work_kind="training", started_at_s=T0,
        ended_at_s=T0 + 25,
    )  # fmt: skip
    got = {
        i.allocation.work_id: i for i in meter(node, reading, mark, [first, second, cpu_work])[0]
    }
    # The CPU work held 8 of the 32 cores for a quarter of the step, 2 on average: what
    # it leaves of the CPU, 30/32, is the GPUs' host, half each.
    gpus_host_j = 8_000.0 * (1 - 2 / 32) / 2
    assert got["job-1"].energy_j == pytest.approx(30_000.0 + gpus_host_j)
    assert got["job-2"].energy_j == pytest.approx((10_000.0 + gpus_host_j) / 2)
    assert (got["job-2"].start_s, got["job-2"].end_s) == (T0 + 50, T0 + 100)
    assert got["job-3"].energy_j == pytest.approx(8_000.0 * 8 / 32 / 4)


def test_the_hosts_energy_is_billed_once_over_every_kind_and_the_cpu_work() -> None:
    # A GPU, an NPU and a 32-core CPU; over 10 s the node measured 4,700 J in all.
    npu = Accelerator(
        id="npu0", kind="npu", vendor="x", model="y", memory_bytes=8 * GIB, compute_units=8,
        idle_power_w=5.0, max_power_w=20.0,
    )  # fmt: skip
    node = birth(GPU, npu, CPU)
    mark = NodeMark("i1", 1, T0, {"gpu0": 0.0, "npu0": 0.0, "cpu0": 0.0})
    reading = sample(T0 + 10, 2, energy={"gpu0": 3_000.0, "npu0": 100.0, "cpu0": 1_600.0})
    on_gpu = job(ids=("gpu0",))
    on_npu = MeteredAllocation(
        work_id="job-2", member_index=0, tenant_id="t2", node_id="n1", accelerator_kind="npu",
        accelerators=1, accelerator_ids=("npu0",), work_kind="training", started_at_s=T0,
    )  # fmt: skip
    on_cpu = MeteredAllocation(
        work_id="job-3", member_index=0, tenant_id="t3", node_id="n1", accelerator_kind="cpu",
        accelerators=16, accelerator_ids=(), work_kind="training", started_at_s=T0,
    )  # fmt: skip

    def billed(allocations: list[MeteredAllocation]) -> dict[str, float]:
        increments, _ = meter(node, reading, mark, allocations)
        return {i.allocation.work_id: i.energy_j for i in increments}

    # CPU work gets its cores' part of the CPU; the rest is the host of every device,
    # whatever its kind.
    got = billed([on_gpu, on_npu, on_cpu])
    assert got == pytest.approx({"job-1": 3_000.0 + 400.0, "job-2": 100.0 + 400.0, "job-3": 800.0})
    assert sum(got.values()) == pytest.approx(4_700.0)
    # Without CPU work the devices share the whole CPU; each is billed its half once.
    got = billed([on_gpu, on_npu])
    assert got == pytest.approx({"job-1": 3_000.0 + 800.0, "job-2": 100.0 + 800.0})
    # CPU work holding every core gets the whole CPU, and the devices none of it.
    whole = MeteredAllocation(
        work_id="job-3", member_index=0, tenant_id="t3", node_id="n1", accelerator_kind="cpu",
        accelerators=32, accelerator_ids=(), work_kind="training", started_at_s=T0,
    )  # fmt: skip
    got = billed([on_gpu, on_npu, whole])
    assert got == pytest.approx({"job-1": 3_000.0, "job-2": 100.0, "job-3": 1_600.0})


def grid(carbon: list[float], price_per_mwh: list[float], currency: str = "EUR") -> GridSignals:
    series = ZoneSeries(
        zone="DE", start_s=T0, carbon_g_per_kwh=np.array(carbon),
        price_per_mwh=np.array(price_per_mwh), currency=currency,
    )  # fmt: skip
    other = ZoneSeries(
        zone="FR", start_s=T0, carbon_g_per_kwh=np.full(len(carbon), 50.0),
        price_per_mwh=np.full(len(carbon), 80.0), currency="EUR",
    )  # fmt: skip
    return GridSignals(now_s=T0 + 2 * 3600, zones={"DE": series, "FR": other})


def test_pricing_splits_at_hours_and_uses_each_hours_recorded_intensity() -> None:
    node = birth(GPU)
    (increment,), _ = meter(
        node, sample(T0 + 5400, 2, energy={"gpu0": 3.6e6}),
        NodeMark("i1", 1, T0 + 1800, {"gpu0": 0.0}), [job()], host_overhead_ratio=0.0,
    )  # fmt: skip
    rows = price([Priced(increment, "DE")], grid([400.0, 100.0, 0.0], [100.0, 50.0, 0.0]), {})
    assert [r.hour_start for r in rows] == [T0, T0 + 3600]
    assert [r.energy_j for r in rows] == pytest.approx([1.8e6, 1.8e6])  # 1 kWh, half each
    assert sum(r.gco2_g for r in rows) == pytest.approx(0.5 * 400.0 + 0.5 * 100.0)
    assert sum(r.cost for r in rows) == pytest.approx(0.5 * 100.0 / 1000 + 0.5 * 50.0 / 1000)
    assert {r.currency for r in rows} == {"EUR"}
    assert not any(r.fallback for r in rows)
    assert all(r.counterfactual_gco2_g is None for r in rows)


def test_the_counterfactual_prices_the_same_energy_on_the_baselines_zones() -> None:
    node = birth(GPU)
    (increment,), _ = meter(
        node, sample(T0 + 3600, 2, energy={"gpu0": 3.6e6}), NodeMark("i1", 1, T0, {"gpu0": 0.0}),
        [job()], host_overhead_ratio=0.0,
    )  # fmt: skip
    # The baseline would have used 20 % more energy, half of it in FR.
    baseline = CounterfactualRecord(
        work_id="job-1", tenant_id="t1", decided_at=T0, baseline="fifo-binpack",
        zone_factors={"DE": 0.6, "FR": 0.6},
    )  # fmt: skip
    (row,) = price([Priced(increment, "FR")], grid([400.0] * 3, [1.0] * 3), {"job-1": baseline})
    assert row.gco2_g == pytest.approx(50.0)
    assert row.counterfactual_gco2_g == pytest.approx(0.6 * 400.0 + 0.6 * 50.0)


def test_a_zone_without_a_signal_is_priced_conservatively_and_flagged() -> None:
    node = birth(GPU)
    (increment,), _ = meter(
        node, sample(T0 + 3600, 2, energy={"gpu0": 3.6e6}), NodeMark("i1", 1, T0, {"gpu0": 0.0}),
        [job()], host_overhead_ratio=0.0,
    )  # fmt: skip
    (row,) = price([Priced(increment, "XX-UNKNOWN")], grid([400.0] * 3, [1.0] * 3), {})
    assert row.fallback
    assert row.gco2_g >= 400.0  # never cleaner than the dirtiest known zone
    assert math.isfinite(row.cost)
