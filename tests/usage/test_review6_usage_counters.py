"""The usage counters on /metrics across control-plane replicas: only the scheduling
leader exports them, and summed across replicas as the dashboards do
(`sum(increase(greenfed_usage_*_total))`) every kWh counts once, through a failover, a
fail-back, a restart and a flush whose answer was lost (docs/monitoring.md, "Several
replicas")."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry

from cloud.fleet.registry import NodeRegistry
from cloud.store import (
    LeadershipLease,
    Store,
    StoreUnavailableError,
    UsageHour,
    UsageWrite,
    open_store,
)
from cloud.usage.accountant import Accountant
from cloud.usage.metrics import UsageCollector
from shared.settings import UsageSettings
from shared.tasks import stop_task
from tests.store.databases import DatabaseUnderTest
from tests.usage.test_accountant import INTERVAL_S, T0, Clock, birth, feed, grid, snapshot
from tests.usage.test_metrics import samples

pytestmark = pytest.mark.timeout(60)

ENERGY = "greenfed_usage_energy_kwh_total"
TENANT_ZONE = {"tenant": "t1", "zone": "DE"}
# Flushed by the test, and by metering's own stop: never by its timer meanwhile.
SETTINGS = UsageSettings(flush_interval_s=3600.0)


@dataclass
class Replica:
    """One control-plane process: its own store connection, registry and accountant."""

    store: Store
    accountant: Accountant
    lease: LeadershipLease | None = None
    metering: asyncio.Task[None] | None = None


async def replica(database: DatabaseUnderTest, clock: Clock) -> Replica:
    store = await open_store(database.settings, clock=clock)
    registry = NodeRegistry(wall_clock=clock)
    registry.apply_status(birth(clock.now))  # every replica ingests every node
    return Replica(store, Accountant(store, registry, SETTINGS, clock=clock))


async def lead(one: Replica, clock: Clock) -> None:
    """Take the leadership and meter as the scheduling loop does (`Loop._lead`)."""
    async with asyncio.timeout(10):
        while one.lease is None:
            one.lease = await one.store.try_acquire_leadership()
        one.accountant.note_pass(snapshot(), grid(clock.now))
        one.metering = asyncio.create_task(one.accountant.run(one.lease))
        await one.accountant.started.wait()


async def step_down(one: Replica) -> None:
    """Leadership lost: the loop stops metering; the lease goes to another replica."""
    assert one.metering is not None
    assert one.lease is not None
    await stop_task(one.metering)
    await one.lease.release()
    one.metering, one.lease = None, None


async def meter(one: Replica, clock: Clock, first_s: float, last_s: float) -> None:
    """The node's samples from `first_s` to `last_s` after T0, then a flush."""
    assert one.lease is not None
    times = [T0 + offset_s for offset_s in range(int(first_s), int(last_s) + 1, int(INTERVAL_S))]
    feed(one.accountant, times, clock)
    await one.accountant.flush(one.lease)


def usage_samples(accountant: Accountant) -> dict[str, list[tuple[dict[str, str], float]]]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(UsageCollector(accountant))
    return {name: found for name, found in samples(registry).items() if found}


def energy_kwh(accountant: Accountant) -> float | None:
    """The tenant's energy counter as a scrape of this replica reads it; None: no sample."""
    found = [
        value
        for labels, value in usage_samples(accountant).get(ENERGY, [])
        if labels == TENANT_ZONE
    ]
    assert len(found) <= 1
    return found[0] if found else None


def increase(scrapes: Sequence[float | None]) -> float:
    """What Prometheus' `increase()` over every scrape of one series reads (without its
    extrapolation at the ends): every rise, and after a drop (a counter reset: a
    restart) the value from zero. A scrape without the series adds no sample."""
    present = [value for value in scrapes if value is not None]
    return sum(
        after - before if after >= before else after
        for before, after in itertools.pairwise(present)
    )


async def stored_kwh(store: Store) -> float:
    return sum(total.energy_j for total in await store.usage_totals()) / 3.6e6


@pytest.fixture
async def replicas(
    database: DatabaseUnderTest,
) -> AsyncIterator[tuple[DatabaseUnderTest, Clock, list[Replica]]]:
    """Two replicas of one store; any added by the test are closed with them."""
    clock = Clock()
    started = [await replica(database, clock), await replica(database, clock)]
    try:
        yield database, clock, started
    finally:
        for one in started:
            if one.metering is not None:
                await stop_task(one.metering)
            await one.store.close()


async def test_a_replica_that_loses_leadership_exports_no_usage_counters(
    replicas: tuple[DatabaseUnderTest, Clock, list[Replica]],
) -> None:
    _, clock, (first, second) = replicas
    await lead(first, clock)
    await meter(first, clock, 0, 100)
    leading = usage_samples(first.accountant)
    assert energy_kwh(first.accountant) == pytest.approx(await stored_kwh(first.store))
    assert set(leading) == {
        ENERGY,
        "greenfed_usage_emissions_grams_total",
        "greenfed_usage_counterfactual_emissions_grams_total",
        "greenfed_usage_emissions_with_counterfactual_grams_total",
        "greenfed_usage_cost_total",
    }

    await step_down(first)
    await lead(second, clock)
    await meter(second, clock, 110, 200)
    # The new leader's series are the only ones: the old leader's would be stale.
    assert usage_samples(first.accountant) == {}
    assert energy_kwh(second.accountant) is not None


async def test_summed_across_replicas_every_kwh_counts_once_through_failovers_and_a_restart(
    replicas: tuple[DatabaseUnderTest, Clock, list[Replica]],
) -> None:
    database, clock, (a, b) = replicas
    # Per scrape target: its scrapes of the tenant's energy counter (None: no sample).
    scrapes: dict[str, list[float | None]] = {"a": [], "b": []}
    by_target = {"a": a, "b": b}

    def scrape() -> None:
        for target, one in by_target.items():
            scrapes[target].append(energy_kwh(one.accountant))

    async def term(one: Replica, first_s: float, last_s: float) -> None:
        await lead(one, clock)
        scrape()
        await meter(one, clock, first_s, last_s)
        scrape()
        await step_down(one)
        scrape()

    # Usage from before the first scrape: `increase()` counts from a series' first sample.
    await lead(a, clock)
    await meter(a, clock, 0, 100)
    before_kwh = await stored_kwh(a.store)
    scrape()
    await step_down(a)
    scrape()
    await term(b, 110, 200)  # a failover
    await term(a, 210, 300)  # and back to the first replica
    await term(b, 310, 400)
    # The first replica restarts (an upgrade) while the second leads, then leads again:
    # the same scrape target, a new process.
    await a.store.close()
    replicas[2].remove(a)
    restarted = await replica(database, clock)
    replicas[2].append(restarted)
    by_target["a"] = restarted
    await term(restarted, 410, 500)

    summed = increase(scrapes["a"]) + increase(scrapes["b"])
    assert summed == pytest.approx(await stored_kwh(b.store) - before_kwh, rel=1e-9), scrapes


async def test_a_lost_answer_after_another_leaders_usage_counts_only_that_flush(
    replicas: tuple[DatabaseUnderTest, Clock, list[Replica]], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, clock, (first, second) = replicas
    await lead(first, clock)
    await meter(first, clock, 0, 100)
    await step_down(first)
    before_kwh = await stored_kwh(second.store)

    await lead(second, clock)
    assert energy_kwh(second.accountant) == 0.0  # none of it counted here yet
    write = second.store.write_usage

    async def committed_then_connection_lost(
        usage: UsageWrite, *, lease: LeadershipLease
    ) -> list[UsageHour]:
        monkeypatch.undo()  # the next flush reaches the store
        await write(usage, lease=lease)
        raise StoreUnavailableError("connection lost during the commit")

    monkeypatch.setattr(second.store, "write_usage", committed_then_connection_lost)
    await meter(second, clock, 110, 200)
    assert second.accountant.stats.failed_flushes == 1
    await meter(second, clock, 210, 300)  # settles the lost answer first

    own_kwh = await stored_kwh(second.store) - before_kwh
    assert own_kwh > 0
    assert energy_kwh(second.accountant) == pytest.approx(own_kwh, rel=1e-9)
