"""The usage counters on /metrics only ever go up, also where work emits more than the
carbon-agnostic baseline would have (emissions avoided below zero), and the emissions
avoided read from them are the store's."""

from __future__ import annotations

import itertools

import pytest
from prometheus_client import CollectorRegistry

from cloud.store import CounterfactualRecord, UsageQuery
from cloud.usage.metrics import UsageCollector
from cloud.usage.views import usage_summary
from tests.store.databases import DatabaseUnderTest
from tests.usage.test_accountant import T0, Clock, feed, start
from tests.usage.test_metrics import samples
from tests.usage.test_usage_review5_counterfactuals import RUNNING, two_zones

pytestmark = pytest.mark.timeout(60)

COUNTERFACTUAL = "greenfed_usage_counterfactual_emissions_grams_total"
COMPARED = "greenfed_usage_emissions_with_counterfactual_grams_total"


def counters(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a counter family, by name and labels."""
    return {
        (name, tuple(sorted(labels.items()))): value
        for name, found in samples(registry).items()
        if name.endswith("_total")
        for labels, value in found
    }


async def test_usage_counters_never_go_down_when_the_baseline_emits_less(
    database: DatabaseUnderTest,
) -> None:
    clock = Clock()
    accountant, store, lease = await start(database, clock)
    try:
        # The baseline would have run it in FR (50 g/kWh); it runs in DE (420 g/kWh).
        cleaner = CounterfactualRecord("job-1", "t1", T0, "fifo-binpack", {"FR": 1.0})
        accountant.note_pass(RUNNING, two_zones(clock.now), [cleaner])
        registry = CollectorRegistry(auto_describe=False)
        registry.register(UsageCollector(accountant))
        scrapes = []
        for flush in range(4):
            feed(accountant, [T0 + 50 * flush + 10 * i for i in range(1, 6)], clock)
            await accountant.flush(lease)  # type: ignore[arg-type]
            scrapes.append(counters(registry))
        for before, after in itertools.pairwise(scrapes):
            went_down = {
                key: (before[key], value)
                for key, value in after.items()
                if value < before.get(key, 0.0)
            }
            assert not went_down, went_down

        stored = usage_summary(await store.usage(UsageQuery(work_ids=["job-1"])))  # type: ignore[attr-defined]
        assert stored.avoided_gco2eq_g is not None
        assert stored.avoided_gco2eq_g < 0
        tenant_zone = (("tenant", "t1"), ("zone", "DE"))
        last = scrapes[-1]
        avoided = last[(COUNTERFACTUAL, tenant_zone)] - last[(COMPARED, tenant_zone)]
        assert avoided == pytest.approx(stored.avoided_gco2eq_g, rel=1e-9)
    finally:
        await store.close()  # type: ignore[attr-defined]
