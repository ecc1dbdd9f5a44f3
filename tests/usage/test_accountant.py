"""The live accountant against the real store: a node with a known power profile, its
job's energy and emissions, a telemetry gap, replays and a control-plane restart."""

from __future__ import annotations

import asyncio
import dataclasses

import msgspec
import numpy as np
import pytest
from structlog.testing import capture_logs

from cloud.fleet.registry import NodeRegistry
from cloud.signals.grid import GridSignals, ZoneSeries
from cloud.store import (
    AllocationRecord,
    CounterfactualRecord,
    StoreSnapshot,
    StoreUnavailableError,
    UsageHour,
    UsageQuery,
    UsageWrite,
    WorkRecord,
    open_store,
)
from cloud.usage.accountant import Accountant
from cloud.usage.views import usage_summary
from shared.messages import Accelerator, AcceleratorSample, HostInfo, NodeStatus, Telemetry
from shared.settings import UsageSettings
from shared.tasks import stop_task
from tests.store.databases import DatabaseUnderTest

pytestmark = pytest.mark.timeout(60)

GIB = 1024**3
HOUR_S = 3600.0
T0 = 1_800_000_000.0 - 1_800_000_000.0 % HOUR_S + 600.0  # ten minutes into an hour
POWER_W = 300.0  # the GPU's constant draw; the node reports no CPU (10 % host overhead)
INTERVAL_S = 10.0
CARBON = [420.0, 180.0, 90.0]  # DE's recorded intensity, hour by hour from the hour of T0
GPU = Accelerator(
    id="gpu0", kind="gpu", vendor="nvidia", model="A100", memory_bytes=80 * GIB,
    compute_units=108, idle_power_w=50.0, max_power_w=400.0,
)  # fmt: skip


def birth(now: float) -> NodeStatus:
    return NodeStatus(
        node_id="n1", state="online", instance_id="i1", agent_version="test", site="cloud",
        zone="DE", region="europe-west3",
        host=HostInfo(hostname="h", os="Linux", arch="x86_64", cpu_logical_cores=32,
                      memory_total_bytes=64 * GIB),
        accelerators=(GPU,), telemetry_interval_s=INTERVAL_S, started_at=T0 - 100, sent_at=now,
    )  # fmt: skip


def reading(at: float, *, counter: bool = True) -> Telemetry:
    seq = round((at - T0) / INTERVAL_S) + 10
    return Telemetry(
        node_id="n1", instance_id="i1", seq=seq, sampled_at=at, interval_s=INTERVAL_S,
        cpu_utilization_pct=5.0, memory_used_bytes=GIB, memory_total_bytes=64 * GIB,
        accelerators=(AcceleratorSample(
            id="gpu0", utilization_pct=71.4, memory_used_bytes=GIB, power_w=POWER_W,
            energy_j=POWER_W * (at - T0 + 1000.0) if counter else None,
        ),),
    )  # fmt: skip


def snapshot(started_at: float = T0) -> StoreSnapshot:
    allocation = AllocationRecord(
        work_id="job-1", member_index=0, node_id="n1", accelerator_kind="gpu", accelerators=1,
        accelerator_ids=("gpu0",), host_memory_bytes=0, started_at=started_at, expected_end=None,
        borrowed=False, state="running", tenant_id="t1", work_kind="training", priority="p1",
    )  # fmt: skip
    return StoreSnapshot(tenants=(), work=(), allocations=(allocation,), node_generations={})


def grid(now: float) -> GridSignals:
    """On the same clock as the samples (`now`: when the pass read it)."""
    start = T0 - T0 % HOUR_S
    series = ZoneSeries(
        zone="DE", start_s=start, carbon_g_per_kwh=np.array(CARBON),
        price_per_mwh=np.array([100.0, 80.0, 60.0]), currency="EUR",
    )  # fmt: skip
    return GridSignals(now_s=now, zones={"DE": series})


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


async def start(
    database: DatabaseUnderTest, clock: Clock, registry: NodeRegistry | None = None
) -> tuple[Accountant, object, object]:
    store = await open_store(database.settings, clock=clock)
    lease = None
    async with asyncio.timeout(10):
        while lease is None:
            lease = await store.try_acquire_leadership()
    registry = registry or NodeRegistry(wall_clock=clock)
    registry.apply_status(birth(clock.now))
    accountant = Accountant(store, registry, UsageSettings(), clock=clock)
    accountant.note_pass(snapshot(), grid(clock.now))
    await accountant.begin(lease)
    accountant.note_pass(snapshot(), grid(clock.now))
    return accountant, store, lease


def feed(accountant: Accountant, times: list[float], clock: Clock, *, counter: bool = True) -> None:
    for at in times:
        clock.now = at
        accountant.observe(reading(at, counter=counter))


async def totals(store: object) -> tuple[float, float, float, float]:
    rows = await store.usage(UsageQuery(work_ids=["job-1"]))  # type: ignore[attr-defined]
    summary = usage_summary(rows)
    return summary.energy_kwh, summary.gco2eq_g, summary.gap_filled_s, summary.measured_share or 0.0


def expected_kwh(start_s: float, end_s: float) -> float:
    return POWER_W * 1.1 * (end_s - start_s) / 3.6e6


def expected_gco2(start_s: float, end_s: float) -> float:
    """∫ P(t)·I(t) dt over the hours the interval crosses."""
    grams, hour0 = 0.0, T0 - T0 % HOUR_S
    for number, intensity in enumerate(CARBON):
        lo, hi = max(start_s, hour0 + number * HOUR_S), min(end_s, hour0 + (number + 1) * HOUR_S)
        if hi > lo:
            grams += POWER_W * 1.1 * (hi - lo) / 3.6e6 * intensity
    return grams


async def test_an_accountant_meters_only_while_it_leads(database: DatabaseUnderTest) -> None:
    # What a replica's ingestion asks before it decodes other replicas' samples for it
    # (cloud/app.py: `relayed_wanted`).
    clock = Clock()
    store = await open_store(database.settings, clock=clock)
    try:
        accountant = Accountant(store, NodeRegistry(wall_clock=clock), UsageSettings(), clock=clock)
        assert not accountant.metering()
        assert not accountant.relayed("n1", "i1")  # nothing is decoded for it
        lease = None
        async with asyncio.timeout(10):
            while lease is None:
                lease = await store.try_acquire_leadership()
        running = asyncio.create_task(accountant.run(lease))
        async with asyncio.timeout(10):
            await accountant.started.wait()
        assert accountant.metering()
        # A node it has no mark of: its sample is wanted now, to start one.
        assert accountant.relayed("n1", "i1")
        await stop_task(running)
        assert not accountant.metering()
        assert not accountant.relayed("n1", "i1")
    finally:
        await store.close()


async def test_a_known_power_profile_is_metered_and_priced_on_the_recorded_grid(
    database: DatabaseUnderTest,
) -> None:
    clock = Clock()
    accountant, store, lease = await start(database, clock)
    try:
        # 70 minutes of samples: the job crosses into the next hour.
        end = T0 + 4200.0
        feed(accountant, [float(t) for t in np.arange(T0, end + 1, INTERVAL_S)], clock)
        await accountant.flush(lease)  # type: ignore[arg-type]
        kwh, gco2, gap_s, measured = await totals(store)
        assert kwh == pytest.approx(expected_kwh(T0, end), rel=0.02)
        assert gco2 == pytest.approx(expected_gco2(T0, end), rel=0.02)
        assert gap_s == 0.0
        assert measured == pytest.approx(1.0)
        # The per-tenant counters of /metrics say the same.
        (total,) = accountant.totals.values()
        assert total.energy_j / 3.6e6 == pytest.approx(kwh)
    finally:
        await store.close()  # type: ignore[attr-defined]


async def test_a_restart_mid_job_and_replayed_telemetry_leave_the_totals_unchanged(
    database: DatabaseUnderTest,
) -> None:
    clock = Clock()
    accountant, store, lease = await start(database, clock)
    feed(accountant, [T0 + 10 * i for i in range(31)], clock)  # 0..300 s
    await accountant.flush(lease)  # type: ignore[arg-type]
    # Counted after the flush, then the process dies: lost from memory, not from the marks.
    feed(accountant, [T0 + 310, T0 + 320], clock)
    await lease.release()  # type: ignore[attr-defined]
    await store.close()  # type: ignore[attr-defined]

    clock.now = T0 + 900
    accountant, store, lease = await start(database, clock)
    try:
        # Retained or replayed copies of what was counted count nothing...
        feed(accountant, [T0 + 200, T0 + 300], clock)
        assert accountant.stats.replays == 2
        # ... and the first sample after the outage spans it with the counter's difference.
        feed(accountant, [T0 + 900 + 10 * i for i in range(31)], clock)  # to 1200 s
        await accountant.flush(lease)  # type: ignore[arg-type]
        kwh, gco2, gap_s, _ = await totals(store)
        assert kwh == pytest.approx(expected_kwh(T0, T0 + 1200), rel=0.02)
        assert gco2 == pytest.approx(expected_gco2(T0, T0 + 1200), rel=0.02)
        assert gap_s == 0.0
    finally:
        await store.close()  # type: ignore[attr-defined]


async def test_a_job_that_ends_is_counted_to_its_end_and_then_let_go(
    database: DatabaseUnderTest,
) -> None:
    clock = Clock()
    accountant, store, lease = await start(database, clock)
    try:
        feed(accountant, [T0 + 10 * i for i in range(31)], clock)  # 0..300 s
        clock.now = T0 + 305
        # The pass after the job ended: it is no longer allocated.
        empty = StoreSnapshot(tenants=(), work=(), allocations=(), node_generations={})
        accountant.note_pass(empty, grid(clock.now))
        (ended,) = accountant.allocations_on("n1")
        assert ended.ended_at_s == T0 + 305
        # The sample that covers its end counts it to there, and lets it go.
        feed(accountant, [T0 + 310], clock)
        assert accountant.allocations_on("n1") == ()
        feed(accountant, [T0 + 320, T0 + 330], clock)  # nothing runs: nothing counted
        await accountant.flush(lease)  # type: ignore[arg-type]
        kwh, gco2, _, _ = await totals(store)
        assert kwh == pytest.approx(expected_kwh(T0, T0 + 305), rel=0.02)
        assert gco2 == pytest.approx(expected_gco2(T0, T0 + 305), rel=0.02)
    finally:
        await store.close()  # type: ignore[attr-defined]


async def test_a_node_claiming_more_energy_than_its_gpu_can_draw_bills_no_more(
    database: DatabaseUnderTest,
) -> None:
    clock = Clock()
    accountant, store, lease = await start(database, clock)
    try:
        with capture_logs() as logs:
            # A flush after every sample: each is metered as a step of its own.
            for at in (T0, T0 + 10, T0 + 20, T0 + 30, T0 + 40, T0 + 50):
                clock.now = at
                sample = reading(at)
                if at in (T0 + 20, T0 + 30):  # the counter jumps by a terajoule, twice
                    (gpu,) = sample.accelerators
                    lie = msgspec.structs.replace(gpu, energy_j=(gpu.energy_j or 0.0) + 1e12 * at)
                    sample = msgspec.structs.replace(sample, accelerators=(lie,))
                accountant.observe(sample)
                await accountant.flush(lease)  # type: ignore[arg-type]
        kwh, _, _, measured = await totals(store)
        # Its 300 W power samples count instead: what it drew, measured.
        assert kwh == pytest.approx(expected_kwh(T0, T0 + 50), rel=0.02)
        assert measured == pytest.approx(1.0)
        assert accountant.stats.implausible == 2
        said = [line for line in logs if line["event"] == "implausible energy figures not metered"]
        assert len(said) == 1  # once per node, not once per sample
        assert said[0]["node_id"] == "n1"
        assert said[0]["devices"] == ["gpu0"]
    finally:
        await store.close()  # type: ignore[attr-defined]


async def test_a_gap_without_counters_is_filled_by_the_model_and_flagged(
    database: DatabaseUnderTest,
) -> None:
    clock = Clock()
    accountant, store, lease = await start(database, clock)
    try:
        feed(accountant, [T0 + 10 * i for i in range(7)], clock, counter=False)  # to 60 s
        feed(accountant, [T0 + 660], clock, counter=False)  # ten minutes without a sample
        await accountant.flush(lease)  # type: ignore[arg-type]
        rows = await store.usage(UsageQuery(work_ids=["job-1"]))  # type: ignore[attr-defined]
        summary = usage_summary(rows)
        assert summary.gap_filled_s == pytest.approx(590.0)
        assert summary.measured_share is not None
        assert summary.measured_share < 0.2
        # The model at the sample's utilisation: 50 + 350 × 0.714 ≈ 300 W, so close.
        assert summary.energy_kwh == pytest.approx(expected_kwh(T0, T0 + 660), rel=0.02)
    finally:
        await store.close()  # type: ignore[attr-defined]


async def test_metering_stopped_during_a_flush_keeps_that_flushs_usage(
    database: DatabaseUnderTest,
) -> None:
    """A leader that stops (cancelled: shutdown, leadership lost) while a periodic flush
    writes: that flush ends first, then the last one; nothing metered is dropped."""
    clock = Clock()
    store = await open_store(database.settings, clock=clock)
    try:
        lease = await store.try_acquire_leadership()
        assert lease is not None
        registry = NodeRegistry(wall_clock=clock)
        registry.apply_status(birth(clock.now))
        accountant = Accountant(store, registry, UsageSettings(flush_interval_s=0.01), clock=clock)
        accountant.note_pass(snapshot(), grid(clock.now))
        await accountant.begin(lease)
        accountant.note_pass(snapshot(), grid(clock.now))
        feed(accountant, [T0 + 10 * i for i in range(31)], clock)  # 0..300 s

        writing, release = asyncio.Event(), asyncio.Event()
        write_usage = store.write_usage

        async def slow_write(*args: object, **kwargs: object) -> list[UsageHour]:
            writing.set()
            await release.wait()
            return await write_usage(*args, **kwargs)  # type: ignore[arg-type]

        store.write_usage = slow_write  # type: ignore[method-assign]
        metering = asyncio.create_task(accountant.run(lease))
        await asyncio.wait_for(writing.wait(), 10)
        metering.cancel()
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await metering

        kwh, _, _, _ = await totals(store)
        assert kwh == pytest.approx(expected_kwh(T0, T0 + 300), rel=0.02)
    finally:
        await store.close()


async def test_a_flush_moves_the_mark_of_every_node_with_a_new_sample(
    database: DatabaseUnderTest,
) -> None:
    """More nodes than one statement's chunk of marks (the rows are made off the event
    loop and written a chunk at a time): every node's mark is the latest sample counted,
    flush after flush."""
    clock = Clock()
    store = await open_store(database.settings, clock=clock)
    try:
        lease = await store.try_acquire_leadership()
        assert lease is not None
        registry = NodeRegistry(wall_clock=clock)
        node_ids = [f"n{number:04d}" for number in range(1_201)]
        for node_id in node_ids:
            registry.apply_status(msgspec.structs.replace(birth(clock.now), node_id=node_id))
        accountant = Accountant(store, registry, UsageSettings(), clock=clock)
        await accountant.begin(lease)
        # The term's first pass: nothing runs anywhere (until a pass says so, no mark moves).
        nothing = StoreSnapshot(tenants=(), work=(), allocations=(), node_generations={})
        accountant.note_pass(nothing, grid(clock.now))
        for step in range(2):
            clock.now = T0 + INTERVAL_S * step
            for node_id in node_ids:
                sample = msgspec.structs.replace(reading(clock.now), node_id=node_id)
                accountant.observe(sample)
            await accountant.flush(lease)
            marks = await store.usage_marks()
            assert sorted(marks) == node_ids
            assert {(mark.seq, mark.sampled_at) for mark in marks.values()} == {
                (reading(clock.now).seq, clock.now)
            }
    finally:
        await store.close()


async def test_power_samples_between_flushes_are_each_counted(
    database: DatabaseUnderTest,
) -> None:
    # A node without energy counters: its power, which changes sample by sample, is
    # integrated one sample at a time, not read from the last sample before a flush.
    clock = Clock()
    accountant, store, lease = await start(database, clock)
    try:
        powers = [300.0 if step % 2 else 100.0 for step in range(13)]
        for step, power_w in enumerate(powers):
            clock.now = T0 + INTERVAL_S * step
            sample = reading(clock.now, counter=False)
            (gpu,) = sample.accelerators
            power = msgspec.structs.replace(gpu, power_w=power_w)
            accountant.observe(msgspec.structs.replace(sample, accelerators=(power,)))
        await accountant.flush(lease)  # type: ignore[arg-type]
        kwh, _, gap_s, measured = await totals(store)
        # Each step [t - 10 s, t) at the power sampled at t, from the first sample on.
        assert kwh == pytest.approx(sum(powers[1:]) * INTERVAL_S * 1.1 / 3.6e6, rel=1e-6)
        assert gap_s == 0.0
        assert measured == pytest.approx(1.0)
    finally:
        await store.close()  # type: ignore[attr-defined]


async def test_an_agent_restart_between_flushes_keeps_the_last_instances_counters(
    database: DatabaseUnderTest,
) -> None:
    # Samples held for the flush: the last of the old instance is counted before the
    # new instance's first, so its counters cover the old instance to its end.
    clock = Clock()
    registry = NodeRegistry(wall_clock=clock)
    accountant, store, lease = await start(database, clock, registry)
    try:
        feed(accountant, [T0 + 10 * i for i in range(11)], clock)  # instance i1, 0..100 s
        clock.now = T0 + 105
        registry.apply_status(
            msgspec.structs.replace(birth(clock.now), instance_id="i2", started_at=clock.now)
        )
        for at in [T0 + 110 + 10 * i for i in range(10)]:  # instance i2, its counter anew
            clock.now = at
            sample = reading(at)
            (gpu,) = sample.accelerators
            anew = msgspec.structs.replace(gpu, energy_j=POWER_W * (at - T0 - 100))
            accountant.observe(
                msgspec.structs.replace(
                    sample, instance_id="i2", seq=sample.seq - 10, accelerators=(anew,)
                )
            )
        await accountant.flush(lease)  # type: ignore[arg-type]
        kwh, _, gap_s, measured = await totals(store)
        assert kwh == pytest.approx(expected_kwh(T0, T0 + 200), rel=1e-6)
        assert gap_s == 0.0
        assert measured == pytest.approx(1.0)
    finally:
        await store.close()  # type: ignore[attr-defined]


async def test_a_restart_keeps_pricing_running_work_against_its_counterfactual(
    database: DatabaseUnderTest,
) -> None:
    # The baseline would have used twice the energy in the same zone: half of the
    # baseline's emissions are avoided, before the restart and after it.
    decided = CounterfactualRecord(
        work_id="job-1", tenant_id="t1", decided_at=T0, baseline="fifo-binpack",
        zone_factors={"DE": 2.0},
    )  # fmt: skip
    clock = Clock()
    accountant, store, lease = await start(database, clock)
    accountant.note_pass(snapshot(), grid(clock.now), [decided])
    feed(accountant, [T0 + 10 * i for i in range(11)], clock)  # 0..100 s
    await accountant.flush(lease)  # type: ignore[arg-type]
    await lease.release()  # type: ignore[attr-defined]
    await store.close()  # type: ignore[attr-defined]

    accountant, store, lease = await start(database, clock)  # no new counterfactual: it runs
    try:
        feed(accountant, [T0 + 110 + 10 * i for i in range(10)], clock)  # to 200 s
        await accountant.flush(lease)  # type: ignore[arg-type]
        rows = await store.usage(UsageQuery(work_ids=["job-1"]))  # type: ignore[attr-defined]
        assert all(row.counterfactual_gco2_g is not None for row in rows)
        summary = usage_summary(rows)
        assert summary.gco2eq_g == pytest.approx(expected_gco2(T0, T0 + 200), rel=1e-6)
        assert summary.avoided_gco2eq_g == pytest.approx(summary.gco2eq_g, rel=1e-6)
    finally:
        await store.close()  # type: ignore[attr-defined]


async def test_a_flush_that_cannot_read_the_store_keeps_its_usage_for_the_next(
    database: DatabaseUnderTest,
) -> None:
    clock = Clock()
    accountant, store, lease = await start(database, clock)
    try:
        work = WorkRecord(
            work_id="job-1", tenant_id="t1", kind="training", spec=b"{}", priority="p1",
            state="running", state_reason=None, attempts=1, submitted_at=T0, updated_at=T0,
            idempotency_key=None, version=1,
        )  # fmt: skip
        running = StoreSnapshot(
            tenants=(), work=(work,), allocations=snapshot().allocations, node_generations={}
        )
        accountant.note_pass(running, grid(clock.now))
        feed(accountant, [T0 + 10 * i for i in range(11)], clock)  # 0..100 s
        clock.now = T0 + 105
        empty = StoreSnapshot(tenants=(), work=(), allocations=(), node_generations={})
        accountant.note_pass(empty, grid(clock.now))  # the job ended
        feed(accountant, [T0 + 110, T0 + 150], clock)  # its final figures are due
        read = store.usage  # type: ignore[attr-defined]
        failures: list[UsageQuery] = []

        async def unavailable_once(query: UsageQuery) -> object:
            if not failures:
                failures.append(query)
                raise StoreUnavailableError("the database went away")
            return await read(query)

        store.usage = unavailable_once  # type: ignore[attr-defined]
        await accountant.flush(lease)  # type: ignore[arg-type]
        assert failures
        assert accountant.stats.failed_flushes == 1
        await accountant.flush(lease)  # type: ignore[arg-type]
        kwh, gco2, _, _ = await totals(store)
        assert kwh == pytest.approx(expected_kwh(T0, T0 + 105), rel=1e-6)
        assert gco2 == pytest.approx(expected_gco2(T0, T0 + 105), rel=1e-6)
    finally:
        await store.close()  # type: ignore[attr-defined]


async def test_work_placed_again_where_it_runs_is_counted_without_a_break(
    database: DatabaseUnderTest,
) -> None:
    # A pass that rewrites placed work's allocations (a deployment scaled, say) gives the
    # member that keeps running a new start: the time to it is the old allocation's.
    clock = Clock()
    accountant, store, lease = await start(database, clock)
    try:
        feed(accountant, [T0 + 10 * i for i in range(6)], clock)  # 0..50 s
        await accountant.flush(lease)  # type: ignore[arg-type]
        feed(accountant, [T0 + 60, T0 + 70], clock)  # held for the next flush
        clock.now = T0 + 75
        accountant.note_pass(snapshot(started_at=T0 + 75), grid(clock.now))
        accountant.note_pass(snapshot(started_at=T0 + 75), grid(clock.now))  # and the next pass
        feed(accountant, [T0 + 80, T0 + 90, T0 + 100], clock)
        await accountant.flush(lease)  # type: ignore[arg-type]
        kwh, _, gap_s, _ = await totals(store)
        assert kwh == pytest.approx(expected_kwh(T0, T0 + 100), rel=1e-6)
        assert gap_s == 0.0
    finally:
        await store.close()  # type: ignore[attr-defined]


@pytest.mark.parametrize("committed", [True, False])
async def test_a_flush_whose_answer_was_lost_is_counted_once(
    database: DatabaseUnderTest, committed: bool
) -> None:
    # The connection drops during the commit: the store may have committed it (only the
    # answer lost) or not. Either way the usage is counted exactly once.
    clock = Clock()
    accountant, store, lease = await start(database, clock)
    try:
        write = store.write_usage  # type: ignore[attr-defined]

        async def connection_lost(*args: object, **kwargs: object) -> None:
            store.write_usage = write  # type: ignore[attr-defined]
            if committed:
                await write(*args, **kwargs)
            raise StoreUnavailableError("connection lost during the commit")

        store.write_usage = connection_lost  # type: ignore[attr-defined]
        feed(accountant, [T0 + 10 * i for i in range(11)], clock)  # 0..100 s
        await accountant.flush(lease)  # type: ignore[arg-type]
        assert accountant.stats.failed_flushes == 1
        feed(accountant, [T0 + 110 + 10 * i for i in range(10)], clock)  # to 200 s
        await accountant.flush(lease)  # type: ignore[arg-type]
        kwh, gco2, _, _ = await totals(store)
        assert kwh == pytest.approx(expected_kwh(T0, T0 + 200), rel=1e-6)
        assert gco2 == pytest.approx(expected_gco2(T0, T0 + 200), rel=1e-6)
        ((_, zone_totals),) = accountant.totals.items()  # what /metrics shows agrees
        assert zone_totals.energy_j == pytest.approx(kwh * 3.6e6, rel=1e-6)
    finally:
        await store.close()  # type: ignore[attr-defined]


async def test_an_hour_priced_in_two_currencies_never_sums_them(
    database: DatabaseUnderTest,
) -> None:
    # DE's prices were lost for a while: the static table's dollars priced the same hour.
    clock = Clock()
    store = await open_store(database.settings, clock=clock)
    try:
        lease = None
        async with asyncio.timeout(10):
            while lease is None:
                lease = await store.try_acquire_leadership()
        hour = UsageHour(
            work_id="job-1", member_index=0, node_id="n1", hour_start=T0 - T0 % HOUR_S,
            tenant_id="t1", work_kind="training", zone="DE", accelerator_kind="gpu",
            energy_j=1000.0, measured_j=1000.0, gap_s=0.0, gco2_g=10.0, cost=0.5,
            currency="EUR", counterfactual_gco2_g=None, fallback=False,
        )  # fmt: skip
        await store.write_usage(UsageWrite(rows=[hour]), lease=lease)
        in_dollars = dataclasses.replace(hour, cost=0.7, currency="USD")
        await store.write_usage(UsageWrite(rows=[in_dollars]), lease=lease)

        (row,) = await store.usage(UsageQuery(work_ids=["job-1"]))
        assert (row.energy_j, row.gco2_g) == (2000.0, 20.0)
        assert (row.cost, row.currency) == (0.5, "EUR")
        assert row.fallback  # its cost is incomplete
        assert [(t.currency, t.cost) for t in await store.usage_totals()] == [("EUR", 0.5)]
    finally:
        await store.close()


def grid_without_prices(now: float) -> GridSignals:
    """DE's prices lost: the static table's dollars price its usage from now on."""
    series = ZoneSeries(
        zone="DE", start_s=T0 - T0 % HOUR_S, carbon_g_per_kwh=np.array(CARBON),
        price_per_mwh=np.full(len(CARBON), np.nan), currency="EUR",
    )  # fmt: skip
    return GridSignals(now_s=now, zones={"DE": series})


async def counted_and_stored(
    accountant: Accountant, store: object
) -> tuple[dict[tuple[str, str, str], list[float]], dict[tuple[str, str, str], list[float]]]:
    """Per (tenant id, zone, currency): (energy, cost), as /metrics counts it and as the
    store holds it (what a restarted leader counts from)."""
    counted = {key: [t.energy_j, t.cost] for key, t in accountant.totals.items()}
    stored = {
        (t.tenant_id, t.zone, t.currency): [t.energy_j, t.cost]
        for t in await store.usage_totals()  # type: ignore[attr-defined]
    }
    return counted, stored


async def test_the_cost_counters_count_only_what_the_store_keeps(
    database: DatabaseUnderTest,
) -> None:
    clock = Clock()
    accountant, store, lease = await start(database, clock)
    try:
        feed(accountant, [T0 + INTERVAL_S * k for k in range(7)], clock)
        await accountant.flush(lease)  # type: ignore[arg-type]  # priced in EUR
        accountant.note_pass(snapshot(), grid_without_prices(clock.now))
        feed(accountant, [T0 + INTERVAL_S * k for k in range(7, 13)], clock)
        # The same hour priced in dollars: its row keeps its euros and drops the dollars.
        await accountant.flush(lease)  # type: ignore[arg-type]
        counted, stored = await counted_and_stored(accountant, store)
        assert set(counted) == set(stored) == {("t1", "DE", "EUR")}
        assert counted[("t1", "DE", "EUR")] == pytest.approx(stored[("t1", "DE", "EUR")])
        # A leader starting again counts from the store: no counter goes back.
        await accountant.begin(lease)  # type: ignore[arg-type]
        (again,) = (await counted_and_stored(accountant, store))[0].values()
        assert again == pytest.approx(counted[("t1", "DE", "EUR")])
    finally:
        await store.close()  # type: ignore[attr-defined]


async def test_the_final_figures_are_the_ones_the_store_keeps(
    database: DatabaseUnderTest,
) -> None:
    # The job's last usage, priced in dollars, is written with its final figures: they
    # must say what its view will say, not count the dollars its row drops.
    clock = Clock()
    accountant, store, lease = await start(database, clock)
    try:
        work = WorkRecord(
            work_id="job-1", tenant_id="t1", kind="training", spec=b"{}", priority="p1",
            state="running", state_reason=None, attempts=1, submitted_at=T0, updated_at=T0,
            idempotency_key=None, version=1,
        )  # fmt: skip
        running = StoreSnapshot(
            tenants=(), work=(work,), allocations=snapshot().allocations, node_generations={}
        )
        accountant.note_pass(running, grid(clock.now))
        feed(accountant, [T0 + INTERVAL_S * k for k in range(7)], clock)
        await accountant.flush(lease)  # type: ignore[arg-type]  # priced in EUR
        accountant.note_pass(running, grid_without_prices(clock.now))
        feed(accountant, [T0 + INTERVAL_S * k for k in range(7, 11)], clock)
        clock.now = T0 + 105
        empty = StoreSnapshot(tenants=(), work=(), allocations=(), node_generations={})
        accountant.note_pass(empty, grid_without_prices(clock.now))  # the job ended
        feed(accountant, [T0 + 110, T0 + 150], clock)  # its final figures are due
        await accountant.flush(lease)  # type: ignore[arg-type]

        events = await store.list_events(tenant_id=None, work_id="job-1")  # type: ignore[attr-defined]
        (final,) = [e for e in events if e.kind == "work.usage"]
        told = msgspec.json.decode(final.payload)["usage"]
        stored = usage_summary(await store.usage(UsageQuery(work_ids=["job-1"])))  # type: ignore[attr-defined]
        assert told["costs"] == pytest.approx(stored.costs)
        assert set(stored.costs) == {"EUR"}
        assert told["energy_kwh"] == pytest.approx(stored.energy_kwh)
        assert told["fallback"] is stored.fallback is True
    finally:
        await store.close()  # type: ignore[attr-defined]
