"""Where training workers' output is shipped on the `logs` channel: one chunk per
worker at most once a second (a chunk is bounded by the output buffer)."""

from __future__ import annotations

import asyncio

import aiomqtt

from edge.agent.context import AgentContext
from edge.agent.module import AgentModule
from edge.training.reconcile import TrainingReconciler
from shared.messages import JobLogChunk, encode
from shared.topics import Channel

LOG_SHIP_INTERVAL_S = 1.0


class JobLogShipper(AgentModule):
    name = "job-logs"

    def __init__(
        self,
        context: AgentContext,
        reconciler: TrainingReconciler,
        output_waiting: asyncio.Event,
    ) -> None:
        """`output_waiting` is set by the reconciler when a worker wrote something."""
        self._context = context
        self._reconciler = reconciler
        self._output_waiting = output_waiting

    async def run(self, client: aiomqtt.Client) -> None:
        context = self._context
        while True:
            await self._output_waiting.wait()
            self._output_waiting.clear()
            for run in self._reconciler.runs_with_output():
                chunk = run.output.take()
                if chunk is None:
                    continue
                offset, data, dropped = chunk
                message = JobLogChunk(
                    node_id=context.identity.node_id,
                    job_id=run.status.job_id,
                    attempt=run.status.attempt,
                    offset=offset,
                    text=data.decode("utf-8", errors="replace"),
                    dropped_bytes=dropped,
                    sent_at=context.wall_clock(),
                )
                await context.publish(client, Channel.LOGS, encode(message))
                if run.output.pending_bytes:
                    self._output_waiting.set()
            await asyncio.sleep(LOG_SHIP_INTERVAL_S)
