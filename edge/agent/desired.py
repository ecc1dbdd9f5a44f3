"""Where desired state is applied: the node's retained `desired` document, replayed by
the broker on every subscription, is checked (decodes, addressed to this node, not
older than what was applied) and handed to the training workers and the inference
server; the reported state follows at once."""

from __future__ import annotations

import aiomqtt
import msgspec

from edge.agent.context import AgentContext
from edge.agent.inference_server import InferenceServer
from edge.agent.module import AgentModule
from edge.agent.outbox import Outbox
from edge.agent.reported import ReportedStatePublisher
from edge.training.reconcile import TrainingReconciler
from shared.messages import DESIRED_DECODER, DesiredState
from shared.topics import Channel


class DesiredStateApplier(AgentModule):
    name = "desired"

    def __init__(
        self,
        context: AgentContext,
        training: TrainingReconciler,
        inference: InferenceServer,
        reported: ReportedStatePublisher,
        outbox: Outbox,
    ) -> None:
        self._context = context
        self._training = training
        self._inference = inference
        self._reported = reported
        self._outbox = outbox

    async def on_connect(self, client: aiomqtt.Client) -> None:
        await client.subscribe(self._context.topic(Channel.DESIRED), qos=1)

    async def run(self, client: aiomqtt.Client) -> None:
        desired_topic = self._context.topic(Channel.DESIRED)
        async for message in client.messages:
            if message.topic.value != desired_topic:
                continue
            payload = message.payload
            if not isinstance(payload, bytes) or not payload:
                continue  # a cleared retained desired state: nothing to apply
            try:
                desired = DESIRED_DECODER.decode(payload)
            except msgspec.DecodeError as error:
                self._context.counters.desired_rejected += 1
                self._context.log.warning("desired state rejected", error=str(error))
                self._outbox.raise_event("desired-rejected", detail=str(error))
                continue
            await self._apply(client, desired)

    async def _apply(self, client: aiomqtt.Client, desired: DesiredState) -> None:
        counters = self._context.counters
        counters.desired_received += 1
        if desired.node_id != self._context.identity.node_id:
            counters.desired_rejected += 1
            self._outbox.raise_event("desired-rejected", detail=f"addressed to {desired.node_id}")
            return
        if desired.generation < self._reported.observed_generation:
            return  # an older document arriving late; the newer one already applied
        self._reported.observed_generation = desired.generation
        self._training.apply(desired.training)
        await self._inference.apply(desired.deployments)
        await self._reported.publish(client)
