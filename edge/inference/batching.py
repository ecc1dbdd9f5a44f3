"""Dynamic batching, the way Triton does it: requests wait at most `max_queue_delay_s` for
others to join them, up to `max_batch_size` requests (counted in rows) per model run.

Only requests whose inputs agree on every dimension but the first are stacked into one
run; each gets its own rows of every output back, and a run whose outputs cannot be
split that way fails its own requests, never the batcher. A stacked run that fails
(one client's token id beyond an embedding table fails the whole run) runs each of its
requests on its own, so that only the one at fault fails; values a working model refuses
(ONNX Runtime's INVALID_ARGUMENT for a request run alone, on a model that has run before:
`LoadedModel.has_run`) are the client's error (`InvalidInput`, the endpoint's 400), not
counted as the model's. A model that has never run is failing itself (a Gather of a
column its input does not have refuses every input): its failures count, and a canary of
it is rolled back. One run is in flight
at a time per deployment; while it runs the next batch fills.
The queue is bounded: past `max_queue` waiting requests a new one is refused at once
(`QueueFull`, the endpoint's 429) instead of waiting without bound. `swap` changes
the model for the requests that come after it; each one already queued runs on the
model it was checked against (and only with requests checked against the same one), so
an update never fails a request, even when the new model takes other shapes or cannot
be batched. `drain` stops accepting and waits for what was accepted.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edge.inference.session import LoadedModel, split
from edge.inference.stats import ServingStats
from shared.lean_logs import get_logger


class QueueFull(RuntimeError):
    pass


class Unavailable(RuntimeError):
    """The deployment is being removed: no new requests."""


class InvalidInput(ValueError):
    """The model refused a request's values, run on their own (ONNX Runtime's
    INVALID_ARGUMENT: an index beyond a table, a size a reshape cannot take): the
    client's error, not the model's, so not counted as one."""


class OutputsNotBatched(RuntimeError):
    """The model's outputs do not follow the batch axis of its inputs (a scalar, a sum
    over the batch), so a stacked run cannot be split back into each request's rows."""


# What requests must share to be stacked into one run: per input, its dtype and every
# dimension but the first (the batch axis).
_Stackable = tuple[tuple[str, np.dtype[Any], tuple[int, ...]], ...]


def _stackable(feeds: Mapping[str, np.ndarray]) -> _Stackable:
    return tuple(
        (name, value.dtype, tuple(value.shape[1:])) for name, value in sorted(feeds.items())
    )


@dataclass(slots=True)
class _Request:
    feeds: Mapping[str, np.ndarray]
    rows: int
    enqueued_at: float
    model: LoadedModel  # the one its feeds were checked against: the one it runs on
    stackable: _Stackable = ()
    input_bytes: int = 0
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
        # The largest batch (rows, input bytes) measured to run in under INLINE_RUN_S: the
        # estimate above says nothing of a larger one, which may take far longer.
        self._inline_rows = 0
        self._inline_bytes = 0
        self._log = get_logger("greenfed.inference").bind(deployment_id=stats.deployment_id)

    @property
    def queued(self) -> int:
        return len(self._queue)

    def swap(self, model: LoadedModel) -> LoadedModel:
        """Use `model` for the requests from now on (those queued keep theirs); returns
        the one it replaces."""
        previous, self.model = self.model, model
        self._run_s = 1.0  # measure the new model afresh
        self._inline_rows = self._inline_bytes = 0
        return previous

    def configure(self, *, max_batch_size: int, max_queue_delay_s: float) -> None:
        self.max_batch_size, self.max_queue_delay_s = max_batch_size, max_queue_delay_s

    async def infer(
        self, feeds: Mapping[str, np.ndarray], rows: int, *, model: LoadedModel | None = None
    ) -> tuple[LoadedModel, list[np.ndarray]]:
        """The model that ran the request, and the request's rows of every output.
        `model`: the one `feeds` were checked against (by default the current one), which
        runs the request even if another is swapped in while it waits."""
        if rows < 1:
            # Splitting a stacked run gives every request at least one row: one counted
            # as having none would take another request's (check_feeds refuses them).
            raise ValueError(f"a request carries at least one row, not {rows}")
        if not self._accepting:
            raise Unavailable("the deployment is being removed from this node")
        if len(self._queue) >= self.max_queue:
            self.stats.rejected()
            raise QueueFull(f"{len(self._queue)} requests queued (at most {self.max_queue})")
        request = _Request(
            feeds,
            rows,
            time.perf_counter(),
            model or self.model,
            stackable=_stackable(feeds),
            input_bytes=sum(value.nbytes for value in feeds.values()),
        )
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
            try:
                await self._run(batch)
            except Exception as error:
                # This task runs in the agent's task group: leaving it would stop the
                # whole agent. Whatever went wrong concerns this batch's requests only.
                self._log.exception("inference batch failed", requests=len(batch))
                self._fail(batch, error)

    async def _collect(self) -> list[_Request]:
        first = self._queue[0]
        # Sized for the model the batch runs on, the first request's: one swapped in
        # while the batch fills runs only the requests checked against it.
        limit = self.max_batch_size if first.model.batchable else 1
        deadline = first.enqueued_at + self.max_queue_delay_s
        while self._rows_ready(limit, first) < limit and limit > 1:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                break
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except TimeoutError:
                break
        # Only requests shaped like the first, for the same model, can be stacked with
        # it; the others keep their place in the queue, and the next batch starts with
        # the first of them.
        batch = [self._queue.popleft()]
        rows = first.rows
        left: deque[_Request] = deque()
        while self._queue and rows < limit:
            request = self._queue.popleft()
            if _stacks_with(first, request) and rows + request.rows <= limit:
                batch.append(request)
                rows += request.rows
            else:
                left.append(request)
        left.extend(self._queue)
        self._queue = left
        self._queued_rows -= rows
        return batch

    def _rows_ready(self, limit: int, first: _Request) -> int:
        rows = 0
        for request in self._queue:
            if not _stacks_with(first, request):
                continue
            rows += request.rows
            if rows >= limit:
                break
        return rows

    def _fail(self, batch: list[_Request], error: Exception) -> None:
        for request in batch:
            if not request.done.done():
                self.stats.error()
                request.done.set_exception(error)

    def _runs_inline(self, rows: int, input_bytes: int) -> bool:
        """Whether a batch is expected to run faster than a hand-over to a thread: only
        when runs are that fast and this batch is no larger than those measured so."""
        return (
            self._run_s < INLINE_RUN_S
            and rows <= self._inline_rows
            and input_bytes <= self._inline_bytes
        )

    def _measured(self, elapsed_s: float, rows: int, input_bytes: int) -> None:
        """Counts a run of the current model in the estimates `_runs_inline` uses."""
        self._run_s = elapsed_s if self._run_s == 1.0 else 0.8 * self._run_s + 0.2 * elapsed_s
        if elapsed_s < INLINE_RUN_S and input_bytes >= self._inline_bytes:
            self._inline_rows, self._inline_bytes = rows, input_bytes

    async def _run(self, batch: list[_Request]) -> None:
        model = batch[0].model  # every request of the batch was checked against it
        live = [request for request in batch if not request.done.cancelled()]
        if not live:
            return
        if len(live) == 1:
            await self._run_alone(model, live[0])
            return
        rows = sum(request.rows for request in live)
        try:
            feeds = {
                name: np.concatenate([request.feeds[name] for request in live])
                for name in live[0].feeds
            }
            input_bytes = sum(request.input_bytes for request in live)
            outputs = await self._run_model(model, feeds, rows, input_bytes)
        except Exception:
            # One request's values can fail the whole run (ONNX Runtime refuses the run,
            # not a row): failing every request stacked with it would let one client
            # fail the others' requests, and count as the model's errors (a canary's
            # error rate aborts its rollout). Each runs on its own instead.
            for request in live:
                if not request.done.done():
                    await self._run_alone(model, request)
            return
        try:
            _check_stacked(model, outputs, rows)
            parts = split(outputs, [request.rows for request in live])
        except Exception as error:
            # The model's outputs do not follow the batch axis: every stacked run of it
            # fails so, whoever sends what; the reason says how to deploy it instead.
            self._fail(live, error)
            return
        self._answer(model, live, parts)

    async def _run_alone(self, model: LoadedModel, request: _Request) -> None:
        """Runs one request on its own and answers it, or fails it: with InvalidInput
        where a model that has run before refuses its values (not counted as the
        model's error)."""
        try:
            outputs = await self._run_model(model, request.feeds, request.rows, request.input_bytes)
        except Exception as error:
            if _refuses_input(error) and model.has_run:
                if not request.done.done():
                    request.done.set_exception(
                        InvalidInput(f"the model refuses this request's values: {error}")
                    )
            else:
                self._fail([request], error)
            return
        self._answer(model, [request], [outputs])

    async def _run_model(
        self, model: LoadedModel, feeds: Mapping[str, np.ndarray], rows: int, input_bytes: int
    ) -> list[np.ndarray]:
        """One model run, on the event loop where it is measured to be that fast, in a
        thread otherwise; a run of the current model counts in the estimates."""
        started = time.perf_counter()
        if self._runs_inline(rows, input_bytes):
            outputs = model.run(feeds)
        else:
            outputs = await asyncio.to_thread(model.run, feeds)
        elapsed = time.perf_counter() - started
        if model is self.model:  # a model swapped out says nothing of the new one
            self._measured(elapsed, rows, input_bytes)
        return outputs

    def _answer(
        self, model: LoadedModel, requests: list[_Request], parts: list[list[np.ndarray]]
    ) -> None:
        """Hands each request of one run its rows of every output."""
        self.stats.batch(len(requests))
        finished = time.perf_counter()
        for request, part in zip(requests, parts, strict=True):
            self.stats.observe(finished - request.enqueued_at)
            if not request.done.done():
                request.done.set_result((model, part))


def _refuses_input(error: Exception) -> bool:
    """Whether a run failed on the values it was given: ONNX Runtime's InvalidArgument
    (told by name: ONNX Runtime is imported only where a model is served)."""
    kind = type(error)
    return kind.__name__ == "InvalidArgument" and kind.__module__.startswith("onnxruntime")


def _stacks_with(first: _Request, request: _Request) -> bool:
    """Whether `request` can run in one stacked run with `first`: the same model, and
    inputs that agree on everything but the batch axis."""
    return request.model is first.model and request.stackable == first.stackable


def _check_stacked(model: LoadedModel, outputs: list[np.ndarray], rows: int) -> None:
    """OutputsNotBatched unless every output has the stacked batch's rows on its first
    axis, which is what splitting it back into the requests' rows relies on."""
    for name, output in zip(model.output_names, outputs, strict=True):
        if output.ndim == 0 or output.shape[0] != rows:
            raise OutputsNotBatched(
                f"output {name!r} has shape {list(output.shape)}, not {rows} rows along its "
                f"first axis for the {rows} rows of the requests run together: this model's "
                "outputs do not follow the batch axis; deploy it with "
                '"batching": {"max_batch_size": 1}'
            )
