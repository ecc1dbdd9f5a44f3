"""How late the control plane's event loop runs what is ready: the latency every REST
request, MQTT message and timer waits for before its turn.

One task asks to wake every `interval_s` and records how much later than asked it
woke: the time something else held the loop (a long synchronous step, the GIL held by
a worker thread). Exported as `greenfed_event_loop_lag_seconds` (a histogram) and
`greenfed_event_loop_lag_max_seconds` (the worst since the previous scrape), the figure
an operator checks when the API's latency grows with the fleet or the queue.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from cloud.loop.queue_metrics import WaitHistogram

# From what a person never notices to what a client's timeout notices.
LAG_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
DEFAULT_INTERVAL_S = 0.05


class EventLoopLag:
    def __init__(
        self,
        interval_s: float = DEFAULT_INTERVAL_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._interval_s = interval_s
        self._monotonic = monotonic
        self.histogram = WaitHistogram(bounds=LAG_BUCKETS_S)
        self.max_s = 0.0  # the worst since `take_max`

    def observe(self, lag_s: float) -> None:
        self.histogram.observe(lag_s)
        self.max_s = max(self.max_s, lag_s)

    def take_max(self) -> float:
        worst, self.max_s = self.max_s, 0.0
        return worst

    async def run(self) -> None:
        while True:
            asked = self._monotonic()
            await asyncio.sleep(self._interval_s)
            self.observe(self._monotonic() - asked - self._interval_s)


class EventLoopLagCollector(Collector):
    def __init__(self, lag: EventLoopLag) -> None:
        self._lag = lag

    def collect(self) -> Iterator[Metric]:
        histogram = HistogramMetricFamily(
            "greenfed_event_loop_lag_seconds",
            "How much later than due the control plane's event loop ran a timer",
        )
        histogram.add_metric([], self._lag.histogram.cumulative(), self._lag.histogram.sum_s)
        yield histogram
        yield GaugeMetricFamily(
            "greenfed_event_loop_lag_max_seconds",
            "The event loop's worst lag since the previous scrape",
            value=self._lag.take_max(),
        )
