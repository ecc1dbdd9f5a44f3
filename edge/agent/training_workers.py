"""Training workers on this node: supervised in the agent's task group (they keep
running while the broker is unreachable). When the agent stops, real worker processes
go on and the next agent takes them back (edge/training/process.py); workers that live
in the agent's own process (simulated ones) are stopped with a grace period. What runs
is decided by edge/training/reconcile.py."""

from __future__ import annotations

import asyncio

from edge.agent.module import AgentModule
from edge.training.reconcile import TrainingReconciler


class TrainingWorkers(AgentModule):
    name = "training"

    def __init__(self, reconciler: TrainingReconciler) -> None:
        self.reconciler = reconciler

    async def start(self, work: asyncio.TaskGroup) -> None:
        self.reconciler.bind(work)

    async def stop(self) -> None:
        await self.reconciler.stop_all("the agent is stopping")
