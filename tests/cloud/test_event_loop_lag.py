"""The event loop's lag as /metrics shows it: a synchronous step that holds the loop is
seen as at least that long a wait."""

from __future__ import annotations

import asyncio
import time

from cloud.event_loop_lag import EventLoopLag, EventLoopLagCollector
from shared.tasks import stop_task
from tests.support.waiting import eventually


async def test_a_loop_held_by_a_synchronous_step_is_seen_as_lag() -> None:
    lag = EventLoopLag(interval_s=0.01)
    watch = asyncio.create_task(lag.run())
    try:
        await eventually(lambda: sum(lag.histogram.counts) > 0)  # sleeping on its timer
        # What a long synchronous step does to everything else: the point of the test.
        time.sleep(0.3)  # noqa: ASYNC251
        seen = sum(lag.histogram.counts)
        await eventually(lambda: sum(lag.histogram.counts) > seen)
    finally:
        await stop_task(watch)
    metrics = {metric.name: metric for metric in EventLoopLagCollector(lag).collect()}
    buckets = {
        sample.labels["le"]: sample.value
        for sample in metrics["greenfed_event_loop_lag_seconds"].samples
        if sample.name.endswith("_bucket")
    }
    # At least one wake-up came 0.3 s late, later than the 0.25 s bucket.
    assert buckets["+Inf"] - buckets["0.25"] >= 1
    assert metrics["greenfed_event_loop_lag_max_seconds"].samples[0].value >= 0.29
    # The worst is per scrape: the next one starts afresh.
    again = {metric.name: metric for metric in EventLoopLagCollector(lag).collect()}
    assert again["greenfed_event_loop_lag_max_seconds"].samples[0].value < 0.29
