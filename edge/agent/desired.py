"""Where desired state is applied: the node's retained `desired` document, replayed by
the broker on every subscription, is checked and handed to the training workers and
the inference server; the reported state follows at once.

This is the agent's boundary with whoever can publish on the broker. In order:

1. the signature, on the raw payload, with the control plane's public key
   (shared/desired_signature.py) before anything is decoded: unsigned, forged or
   malformed documents are rejected (counted, logged at most once per reason every
   `REJECTION_LOG_INTERVAL_S`, raised as a `desired-rejected` event with the reason)
   and nothing in them is applied. Without a key (a node not enrolled) nothing is
   applied at all;
2. the addressee: a document for another node is rejected;
3. (cluster id, generation): within one cluster an older generation is ignored (it
   arrived late); a document of another cluster that was issued later than the one
   applied is adopted with its generation sequence, however low, so a control plane
   whose store was reset is not locked out. An older cluster's document (a stale
   retained one, a replay) is ignored.

An applied document is kept, as it arrived, in the agent's state directory
(edge/agent/state_files.py). An agent that starts applies it from there (`restore`,
through the same checks: signature with today's key, addressee) before it connects,
so its deployments serve again without the broker; the retained document the broker
sends on connecting then reconciles by generation: the same generation changes
nothing, a newer one applies the changes only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import aiomqtt

from edge.agent.context import AgentContext
from edge.agent.inference_server import InferenceServer
from edge.agent.module import AgentModule
from edge.agent.outbox import Outbox
from edge.agent.reported import ReportedStatePublisher
from edge.agent.state_files import AgentStateFiles
from edge.training.reconcile import TrainingReconciler
from shared.desired_signature import DesiredSignatureError, verify_desired
from shared.logs import RateLimitedLog
from shared.messages import DesiredState
from shared.topics import Channel

if TYPE_CHECKING:  # cryptography is loaded with the key (shared/desired_signature.py)
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

# Whoever floods the topic with forgeries must not flood the log and the events too.
REJECTION_LOG_INTERVAL_S = 10.0

NOT_ENROLLED = (
    "no control-plane public key (agent.control_plane_public_key): desired state is "
    "not applied until this node is enrolled (greenfed edge enrol)"
)


class DesiredStateApplier(AgentModule):
    name = "desired"

    def __init__(
        self,
        context: AgentContext,
        training: TrainingReconciler,
        inference: InferenceServer,
        reported: ReportedStatePublisher,
        outbox: Outbox,
        *,
        public_key: Ed25519PublicKey | None,
        state: AgentStateFiles | None = None,
    ) -> None:
        """`public_key` None: the node is not enrolled and applies nothing; `state`: where
        the applied document is kept (None: nowhere, nothing is restored)."""
        self._context = context
        self._training = training
        self._inference = inference
        self._reported = reported
        self._outbox = outbox
        self._public_key = public_key
        self._rejections = RateLimitedLog(context.log, REJECTION_LOG_INTERVAL_S)
        self._said_not_enrolled = False
        # When the applied document was issued: a document of another cluster is adopted
        # only if it is newer.
        self._applied_issued_at: float | None = None
        self._state = state
        self._saved: bytes | None = None  # the document on disk, as written

    async def on_connect(self, client: aiomqtt.Client) -> None:
        if self._public_key is None and not self._said_not_enrolled:
            self._said_not_enrolled = True
            self._context.log.error("node not enrolled", detail=NOT_ENROLLED)
            self._outbox.raise_event("desired-rejected", detail=NOT_ENROLLED)
        await client.subscribe(self._context.topic(Channel.DESIRED), qos=1)

    async def run(self, client: aiomqtt.Client) -> None:
        desired_topic = self._context.topic(Channel.DESIRED)
        async for message in client.messages:
            if message.topic.value != desired_topic:
                continue
            payload = message.payload
            if not isinstance(payload, bytes) or not payload:
                continue  # a cleared retained desired state: nothing to apply
            if self._public_key is None:
                self._context.counters.desired_rejected += 1
                continue  # said once, on connecting
            try:
                desired = verify_desired(payload, self._public_key)
            except DesiredSignatureError as error:
                self._reject(error.reason, str(error))
                continue
            await self._apply(client, desired, payload)

    def _reject(self, reason: str, detail: str) -> None:
        self._context.counters.desired_rejected += 1
        if self._rejections.warning(reason, "desired state rejected", reason=detail):
            self._outbox.raise_event("desired-rejected", detail=detail)

    async def restore(self) -> bool:
        """Apply the document kept on disk, if any and still valid; before connecting."""
        if self._state is None or self._public_key is None:
            return False
        payload = self._state.load_desired()
        if not payload:
            return False
        try:
            desired = verify_desired(payload, self._public_key)
        except DesiredSignatureError as error:
            # Say, the node was enrolled again with another key: wait for the broker's.
            self._reject(error.reason, f"the desired state kept on disk: {error}")
            return False
        self._saved = payload
        if not await self._adopt(desired, payload):
            return False
        self._context.counters.desired_restored += 1
        self._context.log.info(
            "desired state restored from disk",
            cluster_id=desired.cluster_id,
            generation=desired.generation,
            deployments=len(desired.deployments),
            training=len(desired.training),
        )
        return True

    async def _apply(self, client: aiomqtt.Client, desired: DesiredState, payload: bytes) -> None:
        self._context.counters.desired_received += 1
        if await self._adopt(desired, payload):
            await self._reported.publish(client)

    async def _adopt(self, desired: DesiredState, payload: bytes) -> bool:
        """Apply `desired` unless it is misaddressed or older than what was applied."""
        if desired.node_id != self._context.identity.node_id:
            self._reject("addressee", f"addressed to {desired.node_id}")
            return False
        reported = self._reported
        if desired.cluster_id == reported.observed_cluster_id:
            if desired.generation < reported.observed_generation:
                return False  # an older document arriving late; the newer one already applied
        elif self._applied_issued_at is not None and desired.issued_at <= self._applied_issued_at:
            return False  # an older cluster's document: retained from before a store reset
        else:
            if reported.observed_cluster_id is not None:
                self._context.log.info(
                    "desired state of a new cluster adopted",
                    cluster_id=desired.cluster_id,
                    previous_cluster_id=reported.observed_cluster_id,
                    generation=desired.generation,
                )
            reported.observed_cluster_id = desired.cluster_id
        reported.observed_generation = desired.generation
        self._applied_issued_at = desired.issued_at
        self._training.apply(desired.training)
        await self._inference.apply(desired.deployments)
        if self._state is not None and payload != self._saved:
            await self._state.save_desired(payload)
            self._saved = payload
        return True
