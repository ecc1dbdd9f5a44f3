"""Dynamic batching, the way Triton does it: requests wait at most `max_queue_delay_s` for
others to join them, up to `max_batch_size` requests (counted in rows) per model run.

One run is in flight at a time per deployment; while it runs the next batch fills.
The queue is bounded: past `max_queue` waiting requests a new one is refused at once
(`QueueFull`, the endpoint's 429) instead of waiting without bound. `swap` changes
the model between two runs, so an update never fails a request; `drain` stops
accepting and waits for what was accepted.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from edge.inference.session import LoadedModel, split
from edge.inference.stats import ServingStats


class QueueFull(RuntimeError):
    pass


class Unavailable(RuntimeError):
    """The deployment is being removed: no new requests."""


@dataclass(slots=True)
class _Request:
    feeds: Mapping[str, np.ndarray]
    rows: int
    enqueued_at: float
    done: asyncio.Future[tuple[LoadedModel, list[np.ndarray]]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


# A model run expected to take less than this runs on the event loop itself: handing
# it to a thread would cost more than the run (tens of microseconds for small models).
INLINE_RUN_S = 0.0005


class Batcher:
    def __init__(
        self,
        model: LoadedModel,
        stats: ServingStats,
        *,
        max_batch_size: int = 1,
        max_queue_delay_s: float = 0.0,
        max_queue: int = 256,
    ) -> None:
        self.model = model
        self.stats = stats
        self.max_batch_size = max_batch_size
        self.max_queue_delay_s = max_queue_delay_s
        self.max_queue = max_queue
        self._queue: deque[_Request] = deque()
        self._queued_rows = 0
        self._arrived = asyncio.Event()
        self._accepting = True
        self._idle = asyncio.Event()
        self._idle.set()
        self._run_s = 1.0  # running estimate of one run's duration (starts pessimistic)

    @property
    def queued(self) -> int:
        return len(self._queue)

    def swap(self, model: LoadedModel) -> LoadedModel:
        """Use `model` from the next run on; returns the one it replaces."""
        previous, self.model = self.model, model
        self._run_s = 1.0  # measure the new model afresh
        return previous

    def configure(self, *, max_batch_size: int, max_queue_delay_s: float) -> None:
        self.max_batch_size, self.max_queue_delay_s = max_batch_size, max_queue_delay_s

    async def infer(
        self, feeds: Mapping[str, np.ndarray], rows: int
    ) -> tuple[LoadedModel, list[np.ndarray]]:
        """The model that ran the request, and the request's rows of every output."""
        if not self._accepting:
            raise Unavailable("the deployment is being removed from this node")
        if len(self._queue) >= self.max_queue:
            self.stats.rejected()
            raise QueueFull(f"{len(self._queue)} requests queued (at most {self.max_queue})")
        request = _Request(feeds, rows, time.perf_counter())
        self._queue.append(request)
        self._queued_rows += rows
        self._idle.clear()
        self._arrived.set()
        return await request.done

    async def drain(self) -> None:
        """Refuse new requests; return once every accepted one is answered."""
        self._accepting = False
        await self._idle.wait()

    async def run(self) -> None:
        """Form batches and run them until cancelled."""
        while True:
            if not self._queue:
                self._idle.set()
                self._arrived.clear()
                await self._arrived.wait()
            batch = await self._collect()
            await self._run(batch)

    async def _collect(self) -> list[_Request]:
        first = self._queue[0]
        model = self.model
        limit = self.max_batch_size if model.batchable else 1
        deadline = first.enqueued_at + self.max_queue_delay_s
        while self._rows_ready(limit) < limit and limit > 1:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                break
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except TimeoutError:
                break
        batch: list[_Request] = []
        rows = 0
        while self._queue and (not batch or rows + self._queue[0].rows <= limit):
            request = self._queue.popleft()
            self._queued_rows -= request.rows
            batch.append(request)
            rows += request.rows
        return batch

    def _rows_ready(self, limit: int) -> int:
        rows = 0
        for request in self._queue:
            rows += request.rows
            if rows >= limit:
                break
        return rows

    async def _run(self, batch: list[_Request]) -> None:
        model = self.model
        live = [request for request in batch if not request.done.cancelled()]
        if not live:
            return
        try:
            if len(live) == 1:
                feeds = live[0].feeds
            else:
                feeds = {
                    name: np.concatenate([request.feeds[name] for request in live])
                    for name in live[0].feeds
                }
            started = time.perf_counter()
            if self._run_s < INLINE_RUN_S:
                outputs = model.run(feeds)
            else:
                outputs = await asyncio.to_thread(model.run, feeds)
            elapsed = time.perf_counter() - started
            self._run_s = elapsed if self._run_s == 1.0 else 0.8 * self._run_s + 0.2 * elapsed
        except Exception as error:
            for request in live:
                self.stats.error()
                if not request.done.done():
                    request.done.set_exception(error)
            return
        self.stats.batch(len(live))
        parts = split(outputs, [request.rows for request in live]) if len(live) > 1 else [outputs]
        finished = time.perf_counter()
        for request, part in zip(live, parts, strict=True):
            self.stats.observe(finished - request.enqueued_at)
            if not request.done.done():
                request.done.set_result((model, part))
