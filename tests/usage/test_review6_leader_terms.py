"""Each term as leader meters from the store's state, in the order the live loop uses:
`begin` (marks loaded), samples while the first pass runs, then the pass's `note_pass`.

- Samples that come before the term's first pass are counted for the allocations that
  pass tells, from the previous leader's mark: none of the span since its last flush is
  lost (a node without counters gets it from the model, flagged as a gap).
- An agent that restarts before that pass keeps its earlier instance's last sample: its
  counters cover the span up to the restart, measured, not modelled.
- A replica that leads again knows nothing of its earlier term: work that another leader
  saw end is not billed again, and what ran in its place gets the node's energy.
"""

from __future__ import annotations

import asyncio
import dataclasses

import msgspec
import pytest

from cloud.fleet.registry import NodeRegistry
from cloud.store import LeadershipLease, Store, StoreSnapshot, UsageQuery, open_store
from cloud.usage.accountant import Accountant
from cloud.usage.views import WorkUsage, usage_summary
from shared.messages import Telemetry
from shared.settings import UsageSettings
from tests.store.databases import DatabaseUnderTest
from tests.usage.test_accountant import (
    POWER_W,
    T0,
    Clock,
    birth,
    expected_kwh,
    feed,
    grid,
    reading,
    snapshot,
)

pytestmark = pytest.mark.timeout(60)


def running(work_id: str, started_at_s: float) -> StoreSnapshot:
    """A pass's snapshot: `work_id` holds n1's GPU since `started_at_s`."""
    (allocation,) = snapshot(started_at_s).allocations
    allocation = dataclasses.replace(allocation, work_id=work_id)
    return StoreSnapshot(tenants=(), work=(), allocations=(allocation,), node_generations={})


async def leadership(store: Store) -> LeadershipLease:
    async with asyncio.timeout(10):
        while True:
            lease = await store.try_acquire_leadership()
            if lease is not None:
                return lease
            await asyncio.sleep(0.05)


def accountant_of(store: Store, clock: Clock) -> Accountant:
    registry = NodeRegistry(wall_clock=clock)
    registry.apply_status(birth(clock.now))
    return Accountant(store, registry, UsageSettings(), clock=clock)


async def usage_of(store: Store, *work_ids: str) -> WorkUsage:
    return usage_summary(await store.usage(UsageQuery(work_ids=list(work_ids))))


@pytest.mark.parametrize(
    ("counter", "flush_before_pass"),
    [(False, False), (False, True), (True, False), (True, True)],
    ids=["power-only", "power-only-flushed-before-the-pass", "counters", "counters-flushed"],
)
async def test_samples_before_a_new_leaders_first_pass_count_from_the_last_mark(
    database: DatabaseUnderTest, counter: bool, flush_before_pass: bool
) -> None:
    clock = Clock()
    store = await open_store(database.settings, clock=clock)
    try:
        # Leader A meters job-1 on n1 from T0 to T0+300, flushes, and dies.
        lease = await leadership(store)
        first = accountant_of(store, clock)
        await first.begin(lease)
        first.note_pass(running("job-1", T0), grid(clock.now))
        feed(first, [T0 + 10 * i for i in range(31)], clock, counter=counter)
        await first.flush(lease)
        await lease.release()

        # Leader B (a fresh process) begins at T0+600; a sample comes while its first
        # pass runs, and maybe a flush.
        clock.now = T0 + 600
        lease = await leadership(store)
        second = accountant_of(store, clock)
        await second.begin(lease)
        feed(second, [T0 + 600], clock, counter=counter)
        if flush_before_pass:
            await second.flush(lease)
            # Nothing counted, no mark moved: the pass has not said what ran there.
            assert (await store.usage_marks())["n1"].sampled_at == T0 + 300
        second.note_pass(running("job-1", T0), grid(clock.now))
        feed(second, [T0 + 600 + 10 * i for i in range(1, 31)], clock, counter=counter)
        await second.flush(lease)

        usage = await usage_of(store, "job-1")
        assert usage.energy_kwh == pytest.approx(expected_kwh(T0, T0 + 900), rel=0.01)
        if counter:
            assert usage.gap_filled_s == 0.0  # the counters span the leader change
        else:
            # From A's last flush to B's held sample, but for that sample's own interval:
            # the model's, and said so.
            assert usage.gap_filled_s == pytest.approx(290.0)
    finally:
        await store.close()


async def test_a_replica_leading_again_bills_only_what_ran_in_its_new_term(
    database: DatabaseUnderTest,
) -> None:
    """A leads (job-1 on n1's GPU, T0..T0+300) and loses leadership; B leads: job-1 has
    ended, job-2 runs on the GPU from T0+300, B meters to T0+600. A leads again at T0+900
    (the same process, the same accountant): samples come while its first pass runs."""
    clock = Clock()
    store_a = await open_store(database.settings, clock=clock)
    store_b = await open_store(database.settings, clock=clock)
    try:
        lease = await leadership(store_a)
        replica_a = accountant_of(store_a, clock)
        metering = asyncio.create_task(replica_a.run(lease))
        async with asyncio.timeout(10):
            await replica_a.started.wait()
        replica_a.note_pass(running("job-1", T0), grid(clock.now))
        feed(replica_a, [T0 + 10 * i for i in range(31)], clock)
        metering.cancel()  # leadership lost: its last flush, then it stops leading
        with pytest.raises(asyncio.CancelledError):
            await metering
        assert not replica_a.metering()
        await lease.release()

        lease = await leadership(store_b)
        replica_b = accountant_of(store_b, clock)
        await replica_b.begin(lease)
        replica_b.note_pass(running("job-2", T0 + 300), grid(clock.now))
        feed(replica_b, [T0 + 300 + 10 * i for i in range(1, 31)], clock)
        await replica_b.flush(lease)
        await lease.release()

        clock.now = T0 + 900
        lease = await leadership(store_a)
        await replica_a.begin(lease)
        feed(replica_a, [T0 + 900, T0 + 905], clock)
        clock.now = T0 + 906
        replica_a.note_pass(running("job-2", T0 + 300), grid(clock.now))
        feed(replica_a, [T0 + 900 + 10 * i for i in range(1, 31)], clock)
        await replica_a.flush(lease)

        job_1 = (await usage_of(store_a, "job-1")).energy_kwh
        job_2 = (await usage_of(store_a, "job-2")).energy_kwh
        assert job_1 == pytest.approx(expected_kwh(T0, T0 + 300), rel=0.01)
        assert job_2 == pytest.approx(expected_kwh(T0 + 300, T0 + 1200), rel=0.01)
        # The node's energy, counted once.
        assert job_1 + job_2 == pytest.approx(expected_kwh(T0, T0 + 1200), rel=0.01)
    finally:
        await store_b.close()
        await store_a.close()


def restarted(at_s: float) -> Telemetry:
    """n1's agent as instance i2, started at T0+605: its energy counter from 0 there."""
    sample = reading(at_s)
    (device,) = sample.accelerators
    return msgspec.structs.replace(
        sample,
        instance_id="i2",
        seq=round(at_s - T0),
        accelerators=(msgspec.structs.replace(device, energy_j=POWER_W * (at_s - (T0 + 605))),),
    )


@pytest.mark.parametrize("pass_first", [True, False], ids=["pass-first", "samples-first"])
async def test_an_agent_restarted_before_the_first_pass_is_measured_to_its_restart(
    database: DatabaseUnderTest, pass_first: bool
) -> None:
    clock = Clock()
    store = await open_store(database.settings, clock=clock)
    try:
        lease = await leadership(store)
        first = accountant_of(store, clock)
        await first.begin(lease)
        first.note_pass(running("job-1", T0), grid(clock.now))
        feed(first, [T0 + 10 * i for i in range(31)], clock, counter=True)
        await first.flush(lease)
        await lease.release()

        clock.now = T0 + 600
        lease = await leadership(store)
        second = accountant_of(store, clock)
        await second.begin(lease)
        if pass_first:
            second.note_pass(running("job-1", T0), grid(clock.now))
        second.observe(reading(T0 + 600))  # instance i1's last sample
        clock.now = T0 + 610
        second.observe(restarted(clock.now))  # the agent restarted: i2's first
        if not pass_first:
            second.note_pass(running("job-1", T0), grid(clock.now))
        for at_s in range(620, 900, 10):
            clock.now = T0 + at_s
            second.observe(restarted(clock.now))
        await second.flush(lease)
        used = await usage_of(store, "job-1")
        # The same either way: i1's counters to T0+600, i2's from its start.
        assert used.energy_kwh == pytest.approx(expected_kwh(T0, T0 + 890), rel=1e-6)
        assert used.gap_filled_s == 0.0
        assert used.measured_share == 1.0
        await lease.release()
    finally:
        await store.close()
