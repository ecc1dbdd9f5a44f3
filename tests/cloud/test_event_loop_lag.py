"""The event loop's lag as /metrics shows it: a synchronous step that holds the loop is
seen as at least that long a wait."""

from __future__ import annotations

import asyncio
import time

from cloud.event_loop_lag import EventLoopLag, EventLoopLagCollector
from shared.tasks import stop_task


async def test_a_loop_held_by_a_synchronous_step_is_seen_as_lag() -> None:
    lag = EventLoopLag(interval_s=0.01)
    watch = asyncio.create_task(lag.run())
    try:
        while sum(lag.histogram.counts) == 0:  # the watch is sleeping on its timer
            await asyncio.sleep(0.01)
        time.sleep(0.3)  # what a long synchronous step does to everything else
        seen = sum(lag.histogram.counts)
        while sum(lag.histogram.counts) == seen:
            await asyncio.sleep(0.01)
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
