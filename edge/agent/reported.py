"""Where the reported state is published: the generation of `desired` this node has
observed (and the cluster id it counts in) and the actual state of every training
worker and inference replica. Sent on every connection and again whenever a worker or
replica changes state."""

from __future__ import annotations

import asyncio

import aiomqtt

from edge.agent.context import AgentContext
from edge.agent.inference_server import InferenceServer
from edge.agent.module import AgentModule
from edge.agent.state_files import AgentStateFiles
from edge.training.reconcile import TrainingReconciler
from shared.messages import ReportedState, encode
from shared.topics import Channel


class ReportedStatePublisher(AgentModule):
    name = "reported"

    def __init__(
        self,
        context: AgentContext,
        training: TrainingReconciler,
        inference: InferenceServer,
        changed: asyncio.Event,
        state: AgentStateFiles | None = None,
    ) -> None:
        """`changed` is set by whatever changed state (workers, replicas); `state`: where
        the last published state is kept on disk (None: nowhere)."""
        self._context = context
        self._state = state
        self._training = training
        self._inference = inference
        self._changed = changed
        # The newest desired generation applied and the cluster it counts in (None:
        # nothing applied yet); desired.py advances them.
        self.observed_generation = 0
        self.observed_cluster_id: str | None = None

    async def on_connect(self, client: aiomqtt.Client) -> None:
        await self.publish(client)

    async def run(self, client: aiomqtt.Client) -> None:
        while True:
            await self._changed.wait()
            await self.publish(client)

    async def publish(self, client: aiomqtt.Client) -> None:
        self._changed.clear()
        context = self._context
        payload = encode(
            ReportedState(
                node_id=context.identity.node_id,
                instance_id=context.instance_id,
                observed_generation=self.observed_generation,
                reported_at=context.wall_clock(),
                training=self._training.reported(),
                deployments=self._inference.reported(),
                cluster_id=self.observed_cluster_id,
            )
        )
        await context.publish(client, Channel.REPORTED, payload)
        if self._state is not None:
            await self._state.save_reported(payload)
