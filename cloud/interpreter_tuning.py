"""The interpreter's settings while this process schedules: what keeps the event loop
(the API, ingestion) responsive beside a scheduling pass.

- The GIL switch interval, 0.5 ms (Python's default is 5 ms). A pass computes in a
  worker thread for up to seconds. Every socket call of the event loop gives the GIL
  up, and taking it back from a busy thread waits out the switch interval: at 5 ms a
  request with a few database round trips waits tens of ms behind a pass. At 0.5 ms the
  loop does 4.5x the round trips beside a busy thread (benchmarks/gil_convoy.py).
- The cyclic garbage collector's oldest generation collected 100 times less often.
  Each pass holds a snapshot of every queued item (tens of thousands of records), so
  the oldest generation is large and keeps growing; a full collection stops the
  process for 0.1-0.3 s, and under a submission load the default thresholds ran one
  every few seconds (the p99 of submissions was such a pause). Cycles are rare in what
  the control plane allocates (a full collection finds a few hundred objects), and
  reference counting frees everything else at once, so memory does not grow between
  the rarer collections. The young generations keep their defaults: collecting them
  costs microseconds.

Both are process-wide: `tuned_for_scheduling` sets them while the scheduling loop runs
(or, on an API-only replica, while the app serves: it holds the whole fleet's registry
as well) and puts back what it found.
"""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Iterator
from typing import Final

SWITCH_INTERVAL_S: Final = 0.0005
OLDEST_GENERATION_FACTOR: Final = 100


@contextlib.contextmanager
def tuned_for_scheduling() -> Iterator[None]:
    switch_interval_s = sys.getswitchinterval()
    thresholds = gc.get_threshold()
    sys.setswitchinterval(min(switch_interval_s, SWITCH_INTERVAL_S))
    young, middle, oldest = thresholds
    gc.set_threshold(young, middle, oldest * OLDEST_GENERATION_FACTOR)
    try:
        yield
    finally:
        sys.setswitchinterval(switch_interval_s)
        gc.set_threshold(*thresholds)
