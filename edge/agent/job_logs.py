"""Where training workers' output is handed to the outbox as `logs` chunks: one chunk
per worker at most once a second (a chunk is bounded by the output buffer). This runs
for the agent's lifetime, connected or not: the outbox spools the chunks until the
broker has them."""

from __future__ import annotations

import asyncio

from edge.agent.context import AgentContext
from edge.agent.module import AgentModule
from edge.agent.outbox import Outbox
from edge.training.reconcile import TrainingReconciler
from shared.messages import JobLogChunk

LOG_SHIP_INTERVAL_S = 1.0


class JobLogShipper(AgentModule):
    name = "job-logs"

    def __init__(
        self,
        context: AgentContext,
        reconciler: TrainingReconciler,
        output_waiting: asyncio.Event,
        outbox: Outbox,
    ) -> None:
        """`output_waiting` is set by the reconciler when a worker wrote something."""
        self._context = context
        self._reconciler = reconciler
        self._output_waiting = output_waiting
        self._outbox = outbox

    async def start(self, work: asyncio.TaskGroup) -> None:
        work.create_task(self._ship_forever(), name="job-logs")

    async def _ship_forever(self) -> None:
        context = self._context
        while True:
            await self._output_waiting.wait()
            self._output_waiting.clear()
            for run in self._reconciler.runs_with_output():
                chunk = run.output.take()
                if chunk is None:
                    continue
                offset, data, dropped = chunk
                self._outbox.ship_log(
                    JobLogChunk(
                        node_id=context.identity.node_id,
                        job_id=run.status.job_id,
                        attempt=run.status.attempt,
                        offset=offset,
                        text=data.decode("utf-8", errors="replace"),
                        dropped_bytes=dropped,
                        sent_at=context.wall_clock(),
                    )
                )
                if run.output.pending_bytes:
                    self._output_waiting.set()
            await asyncio.sleep(LOG_SHIP_INTERVAL_S)
