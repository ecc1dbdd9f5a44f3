"""Where training workers' output is handed to the outbox as `logs` chunks: one chunk
per worker at most once a second (a chunk is bounded by the output buffer, and smaller
when it must be to fit in one MQTT payload). This runs for the agent's lifetime,
connected or not: the outbox spools the chunks until the broker has them."""

from __future__ import annotations

import asyncio

from edge.agent.context import AgentContext
from edge.agent.module import AgentModule
from edge.agent.outbox import Outbox
from edge.training.output import SHIP_MAX_BYTES
from edge.training.reconcile import TrainingReconciler
from edge.training.runs import TrainingRun
from shared.messages import JobLogChunk, encode

LOG_SHIP_INTERVAL_S = 1.0


class JobLogShipper(AgentModule):
    name = "job-logs"

    def __init__(
        self,
        context: AgentContext,
        reconciler: TrainingReconciler,
        output_waiting: asyncio.Event,
        outbox: Outbox,
        *,
        max_payload_bytes: int,
    ) -> None:
        """`output_waiting` is set by the reconciler when a worker wrote something;
        no chunk's payload is larger than `max_payload_bytes` (`mqtt.max_payload_bytes`:
        the cloud drops a larger one whole)."""
        self._context = context
        self._reconciler = reconciler
        self._output_waiting = output_waiting
        self._outbox = outbox
        self._max_payload_bytes = max_payload_bytes

    async def start(self, work: asyncio.TaskGroup) -> None:
        work.create_task(self._ship_forever(), name="job-logs")

    async def _ship_forever(self) -> None:
        while True:
            await self._output_waiting.wait()
            self._output_waiting.clear()
            for run in self._reconciler.runs_with_output():
                chunk = self._next_chunk(run)
                if chunk is not None:
                    self._outbox.ship_log(chunk)
                if run.output.pending_bytes:
                    self._output_waiting.set()
            await asyncio.sleep(LOG_SHIP_INTERVAL_S)

    def _next_chunk(self, run: TrainingRun) -> JobLogChunk | None:
        """The next chunk of `run`'s output, as large as fits in one payload once
        encoded, taken from its buffer; None if nothing waits.

        JSON makes text up to 6 times larger (a control byte is `\\u0000`), so a chunk
        that does not fit is cut shorter, in proportion, until it does."""
        max_bytes = SHIP_MAX_BYTES
        while True:
            chunk = run.output.peek(max_bytes)
            if chunk is None:
                return None
            offset, data, dropped = chunk
            log_chunk = self._log_chunk(run, offset, data, dropped)
            payload_bytes = len(encode(log_chunk))
            if payload_bytes <= self._max_payload_bytes:
                run.output.consume(len(data))  # the very chunk peeked
                return log_chunk
            max_bytes = len(data) * self._max_payload_bytes // payload_bytes
            if max_bytes == 0:
                # Not one byte fits beside the chunk's other fields (a job id nearly as
                # long as the limit): the cloud could take none of this output.
                run.output.take()
                self._context.log.warning(
                    "job output not shipped: no chunk of it fits in mqtt.max_payload_bytes",
                    job_id=run.status.job_id,
                    max_payload_bytes=self._max_payload_bytes,
                )
                return None

    def _log_chunk(self, run: TrainingRun, offset: int, data: bytes, dropped: int) -> JobLogChunk:
        return JobLogChunk(
            node_id=self._context.identity.node_id,
            job_id=run.status.job_id,
            attempt=run.status.attempt,
            offset=offset,
            text=data.decode("utf-8", errors="replace"),
            dropped_bytes=dropped,
            sent_at=self._context.wall_clock(),
        )
