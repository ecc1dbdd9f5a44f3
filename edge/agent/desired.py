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
3. the instance it was issued for (`for_instance`, 1.9). Until it has applied a
   document from the broker, an agent applies only a document issued for its own
   instance, which the control plane sends when it takes this instance's birth. An
   agent that has applied nothing (it started without a state directory, or lost it:
   reimaged) has no generation to hold a replay to; one that restored its document
   from disk has one, but the control plane may have issued and superseded documents
   for the earlier instance meanwhile: one of those re-published by anyone with broker
   access is newer than the disk's and would run work cancelled since. So a document
   issued for another instance (the retained one from before our birth, or an old one
   re-published) is ignored, and counted (`desired_not_for_this_instance`) unless it is
   the document already applied or older; an agent running its document from disk
   goes on with it until the answer comes, seconds later. A document without
   `for_instance` comes from a control plane older than 1.9 and is applied as before
   (by generations, 4.), unless this agent has applied nothing and has already seen
   that its control plane binds documents. An agent that has applied a document from
   the broker goes by generations (4.) and applies a newer one whoever it was issued
   for: it is the control plane's newest word for the node. Either way, a document
   issued for another instance that is not older than what was applied tells the birth
   module (edge/agent/birth.py) that the control plane has not taken this instance's
   birth yet; one issued for this instance, that it has;
4. (cluster id, generation): within one cluster an older generation is ignored (it
   arrived late); a document of another cluster that was issued later than the one
   applied is adopted with its generation sequence, however low, so a control plane
   whose store was reset is not locked out. An older cluster's document (a stale
   retained one, a replay) is ignored.

An applied document is kept, as it arrived, in the agent's state directory
(edge/agent/state_files.py), written before it is applied, so that what is on disk is
never older than what runs (unless the disk refuses the write: the document is then
written when it comes again). An agent that starts applies it from there (`restore`,
through the same checks: signature with today's key, addressee) before it connects,
so its deployments serve again without the broker. The retained document the broker
sends on connecting was issued for the instance before: it changes nothing (3.), and
the control plane's answer to this instance's birth reconciles by generation: the same
generation changes nothing, a newer one applies the changes only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

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

if TYPE_CHECKING:
    from edge.agent.upgrades import AgentUpgrades
    from shared.ed25519 import VerifyKey

# Whoever floods the topic with forgeries must not flood the log and the events too.
REJECTION_LOG_INTERVAL_S = 10.0

NOT_ENROLLED = (
    "no control-plane public key (agent.control_plane_public_key): desired state is "
    "not applied until this node is enrolled (greenfed edge enrol)"
)


class BirthAnswers(Protocol):
    """What the birth module (edge/agent/birth.py) learns from the documents' binding."""

    def answered(self) -> None: ...

    def unanswered(self) -> None: ...


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
        public_key: VerifyKey | None,
        birth: BirthAnswers,
        state: AgentStateFiles | None = None,
        upgrades: AgentUpgrades | None = None,
    ) -> None:
        """`public_key` None: the node is not enrolled and applies nothing; `birth`: told
        whether the documents arriving were issued for this instance; `state`: where the
        applied document is kept (None: nowhere, nothing is restored); `upgrades`: given
        each applied document's agent version (edge/agent/upgrades.py)."""
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
        self._birth = birth
        self._upgrades = upgrades
        # Whether a document was applied (from disk or the broker): until one is, a
        # document issued for no instance is ignored once bound ones were seen (3.).
        self._applied_any = False
        # Whether a document from the broker was applied: until one is, only a document
        # issued for this instance is (3.); the one restored from disk does not count.
        self._applied_from_broker = False
        # Whether a document bound to an instance has arrived: the control plane binds.
        self._seen_bound = False
        self._binding_log = RateLimitedLog(context.log, REJECTION_LOG_INTERVAL_S)

    async def on_connect(self, client: aiomqtt.Client) -> None:
        if self._public_key is None and not self._said_not_enrolled:
            self._said_not_enrolled = True
            self._context.log.error("node not enrolled", detail=NOT_ENROLLED)
            self._outbox.raise_event("desired-rejected", detail=NOT_ENROLLED)
        await client.subscribe(self._context.topic(Channel.DESIRED), qos=1)

    @property
    def topic(self) -> str:
        return self._context.topic(Channel.DESIRED)

    async def on_message(self, client: aiomqtt.Client, message: aiomqtt.Message) -> None:
        """A message on the node's `desired` (edge/agent/inbox.py)."""
        payload = message.payload
        if not isinstance(payload, bytes) or not payload:
            return  # a cleared retained desired state: nothing to apply
        if self._public_key is None:
            self._context.counters.desired_rejected += 1
            return  # said once, on connecting
        try:
            desired = verify_desired(payload, self._public_key)
        except DesiredSignatureError as error:
            self._reject(error.reason, str(error))
            return
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
        if not await self._adopt(desired, payload, from_disk=True):
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

    def _older_than_applied(self, desired: DesiredState) -> bool:
        """An older generation of the applied document's cluster (arriving late, or
        replayed), or an older cluster's document (retained from before a store reset)."""
        reported = self._reported
        if desired.cluster_id == reported.observed_cluster_id:
            return desired.generation < reported.observed_generation
        return self._applied_issued_at is not None and desired.issued_at <= self._applied_issued_at

    def _issued_for_us(self, desired: DesiredState) -> bool:
        """Whether a document that came over the broker may be applied, as far as the
        instance it was issued for goes (3. above)."""
        bound = desired.for_instance
        if bound is None:  # a control plane older than 1.9 binds nothing
            if self._applied_any or not self._seen_bound:
                return True
            self._not_for_us(desired, "issued for no instance, by a control plane that binds")
            return False
        self._seen_bound = True
        if bound == self._context.instance_id:
            self._birth.answered()
            return True
        older = self._older_than_applied(desired)
        if not older:
            self._birth.unanswered()
        if self._applied_from_broker:
            return True
        # To an agent running from disk, the document it runs come again (the retained
        # one after a restart), or an older one, would change nothing: not worth a word.
        if not older and not self._runs_already(desired):
            self._not_for_us(desired, f"issued for agent instance {bound[:64]!r}")
        return False

    def _runs_already(self, desired: DesiredState) -> bool:
        """Whether `desired` is the generation applied (of the same cluster)."""
        reported = self._reported
        return (
            self._applied_any
            and desired.cluster_id == reported.observed_cluster_id
            and desired.generation == reported.observed_generation
        )

    def _not_for_us(self, desired: DesiredState, why: str) -> None:
        self._context.counters.desired_not_for_this_instance += 1
        self._binding_log.warning(
            "not-for-this-instance",
            "desired state ignored until the control plane answers this instance's birth",
            why=why,
            meanwhile=(
                "the document kept on disk runs"
                if self._applied_any
                else "this agent has applied nothing yet"
            ),
            generation=desired.generation,
        )

    async def _adopt(
        self, desired: DesiredState, payload: bytes, *, from_disk: bool = False
    ) -> bool:
        """Apply `desired` unless it is misaddressed, not issued for this instance while
        nothing came from the broker yet (3.), or older than what was applied.
        `from_disk`: the document this node applied before it stopped (issued for an
        earlier instance)."""
        if desired.node_id != self._context.identity.node_id:
            self._reject("addressee", f"addressed to {desired.node_id}")
            return False
        if not from_disk and not self._issued_for_us(desired):
            return False
        reported = self._reported
        if self._older_than_applied(desired):
            return False
        await self._save(payload)
        if desired.cluster_id != reported.observed_cluster_id:
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
        self._applied_any = True
        if not from_disk:
            self._applied_from_broker = True
        self._training.apply(desired.training)
        await self._inference.apply(desired.deployments)
        if self._upgrades is not None:
            self._upgrades.offer(desired.agent_upgrade)
        return True

    async def _save(self, payload: bytes) -> None:
        """Keep the document about to be applied, before it is: an agent restarted at any
        point restores what runs, never an older document that would stop, as not wanted,
        the workers this one starts. A failed save (a full disk) is tried again when the
        document comes again; meanwhile the node goes on from memory."""
        if self._state is None or payload == self._saved:
            return
        if await self._state.save_desired(payload):
            self._saved = payload
