"""A work item's counterfactual is the one decided at its first placement, whichever
leader prices its usage; and the emissions-avoided counters of /metrics count what the
store keeps, so that a new leader (which counts from the store) moves none back."""

from __future__ import annotations

import numpy as np
import pytest

from cloud.signals.grid import GridSignals, ZoneSeries
from cloud.store import CounterfactualRecord, StoreSnapshot, UsageQuery, WorkRecord
from cloud.usage.views import usage_summary
from tests.store.databases import DatabaseUnderTest
from tests.usage.test_accountant import HOUR_S, T0, Clock, feed, snapshot, start
from tests.usage.test_usage_review5_final_events import lead

pytestmark = pytest.mark.timeout(60)

WORK = WorkRecord(
    work_id="job-1", tenant_id="t1", kind="training", spec=b"{}", priority="p1",
    state="running", state_reason=None, attempts=1, submitted_at=T0, updated_at=T0,
    idempotency_key=None, version=1,
)  # fmt: skip
RUNNING = StoreSnapshot(
    tenants=(), work=(WORK,), allocations=snapshot().allocations, node_generations={}
)


def two_zones(now: float) -> GridSignals:
    """DE (where the work runs) at 420 g/kWh, FR at 50 g/kWh, from the hour of T0 to
    three hours past `now`."""
    start_s = T0 - T0 % HOUR_S
    hours = int((now - start_s) // HOUR_S) + 3

    def zone(name: str, carbon_g_per_kwh: float) -> ZoneSeries:
        return ZoneSeries(
            zone=name, start_s=start_s, carbon_g_per_kwh=np.full(hours, carbon_g_per_kwh),
            price_per_mwh=np.full(hours, 100.0), currency="EUR",
        )  # fmt: skip

    return GridSignals(now_s=now, zones={"DE": zone("DE", 420.0), "FR": zone("FR", 50.0)})


def decided(at: float, zone_factors: dict[str, float] | None) -> CounterfactualRecord:
    return CounterfactualRecord("job-1", "t1", at, "fifo-binpack", zone_factors)


async def test_work_placed_again_after_a_restart_keeps_its_first_counterfactual(
    database: DatabaseUnderTest,
) -> None:
    clock = Clock()
    accountant, store, lease = await start(database, clock)
    # First placed where the baseline would have put it: nothing avoided.
    accountant.note_pass(RUNNING, two_zones(clock.now), [decided(T0, {"DE": 1.0})])
    feed(accountant, [T0 + 10 * i for i in range(11)], clock)  # 0..100 s
    await accountant.flush(lease)  # type: ignore[arg-type]
    await lease.release()  # type: ignore[attr-defined]
    await store.close()  # type: ignore[attr-defined]

    accountant, store, lease = await lead(database, clock)
    try:
        accountant.note_pass(RUNNING, two_zones(clock.now))
        # Preempted and placed again: the loop asks first, and is told it is known.
        assert not accountant.needs_counterfactual("job-1")
        # Had it decided again (the baseline now in FR), the first decision still stands.
        accountant.note_pass(RUNNING, two_zones(clock.now), [decided(clock.now, {"FR": 1.0})])
        feed(accountant, [T0 + 110 + 10 * i for i in range(10)], clock)  # to 200 s
        await accountant.flush(lease)  # type: ignore[arg-type]

        summary = usage_summary(await store.usage(UsageQuery(work_ids=["job-1"])))
        assert summary.energy_kwh > 0
        assert summary.avoided_gco2eq_g == pytest.approx(0.0, abs=1e-9)  # the first decision
        assert (await store.counterfactuals(["job-1"]))["job-1"].zone_factors == {"DE": 1.0}
    finally:
        await store.close()


async def test_work_placed_again_long_after_it_last_ran_keeps_its_first_counterfactual(
    database: DatabaseUnderTest,
) -> None:
    clock = Clock()
    accountant, store, lease = await start(database, clock)
    accountant.note_pass(RUNNING, two_zones(clock.now), [decided(T0, {"DE": 1.0})])
    feed(accountant, [T0 + 10 * i for i in range(11)], clock)  # 0..100 s
    await accountant.flush(lease)  # type: ignore[arg-type]
    await lease.release()  # type: ignore[attr-defined]
    await store.close()  # type: ignore[attr-defined]

    # Preempted, it waited two days; the control plane restarted meanwhile.
    later_s = T0 + 2 * 86_400.0
    clock.now = later_s
    accountant, store, lease = await lead(database, clock)
    try:
        waiting = StoreSnapshot(tenants=(), work=(WORK,), allocations=(), node_generations={})
        accountant.note_pass(waiting, two_zones(clock.now))
        placed = StoreSnapshot(
            tenants=(), work=(WORK,), allocations=snapshot(started_at=later_s).allocations,
            node_generations={},
        )  # fmt: skip
        if accountant.needs_counterfactual("job-1"):
            accountant.note_pass(placed, two_zones(clock.now), [decided(later_s, {"FR": 1.0})])
        accountant.note_pass(placed, two_zones(clock.now))
        feed(accountant, [later_s + 10 * i for i in range(11)], clock)
        await accountant.flush(lease)  # type: ignore[arg-type]

        rows = await store.usage(UsageQuery(work_ids=["job-1"], from_s=later_s - HOUR_S))
        summary = usage_summary(rows)
        assert summary.energy_kwh > 0
        assert summary.avoided_gco2eq_g == pytest.approx(0.0, abs=1e-9)  # the first decision
        assert (await store.counterfactuals(["job-1"]))["job-1"].zone_factors == {"DE": 1.0}
        assert not accountant.needs_counterfactual("job-1")
    finally:
        await store.close()


async def test_the_avoided_counter_counts_what_the_store_keeps(
    database: DatabaseUnderTest,
) -> None:
    clock = Clock()
    accountant, store, lease = await start(database, clock)
    try:
        # Placed before metering began: its usage is priced without a counterfactual.
        accountant.note_pass(RUNNING, two_zones(clock.now))
        feed(accountant, [T0 + 10 * i for i in range(7)], clock)  # 0..60 s
        await accountant.flush(lease)  # type: ignore[arg-type]
        # Placed again: this time the baseline's choice is known (FR, cleaner).
        assert accountant.needs_counterfactual("job-1")
        accountant.note_pass(RUNNING, two_zones(clock.now), [decided(clock.now, {"FR": 1.0})])
        feed(accountant, [T0 + 10 * i for i in range(7, 13)], clock)  # same hour, to 120 s
        await accountant.flush(lease)  # type: ignore[arg-type]

        # The hour's row has no counterfactual (NULL + x stays NULL): nothing avoided.
        (row,) = await store.usage(UsageQuery(work_ids=["job-1"]))  # type: ignore[attr-defined]
        assert row.counterfactual_gco2_g is None
        (counted,) = accountant.totals.values()
        (stored,) = await store.usage_totals()  # type: ignore[attr-defined]
        assert counted.avoided_gco2_g == pytest.approx(stored.avoided_gco2_g, abs=1e-9)

        # A leader starting again counts from the store: the counter stays where it was.
        await accountant.begin(lease)  # type: ignore[arg-type]
        (again,) = accountant.totals.values()
        assert again.avoided_gco2_g == pytest.approx(counted.avoided_gco2_g, abs=1e-9)
    finally:
        await store.close()  # type: ignore[attr-defined]
