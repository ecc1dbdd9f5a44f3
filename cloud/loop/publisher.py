"""Publishing `desired` documents: retained, QoS 1, the newest per node wins.

The loop hands documents over and never waits for the broker: a scheduling pass must
not stall while MQTT reconnects. Documents that could not be published stay queued
(a newer one for the same node replaces them) and go out on the next connection;
retained delivery means an agent that was offline gets its latest document when it
subscribes.

On every (re)connection the newest document of every node goes out again: a broker
that restarted without persistence (or lost its retained messages any other way)
would otherwise hold no `desired` at all, and an agent restarting then would get
nothing. Republishing a document the broker still holds is harmless: agents apply
a generation once.

Every document is signed (shared/desired_signature.py) with the control plane's key
(cloud/loop/signing.py) as it goes out: agents apply nothing else.

On the first connection the publisher also sweeps the broker's retained `desired`
documents: one that is not this cluster's (another cluster id after a store reset,
unsigned, or not verifiable with our key) is cleared, unless we hold a newer document
for that node, which replaces it anyway. Otherwise an agent that (re)subscribes would
be handed the old cluster's work. The broker sends a subscription's retained messages
at once, so the sweep ends when none has come for `sweep_quiet_s`.
"""

from __future__ import annotations

import asyncio
import contextlib

import aiomqtt
import structlog
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from cloud.store.schema import CLUSTER_ID_SECRET
from shared.desired_signature import DesiredSignatureError, sign_desired, verify_desired
from shared.messages import DesiredState
from shared.mqtt import MqttSession, instance_client_id
from shared.settings import MqttSettings
from shared.topics import CHANNEL_SPECS, Channel, TopicError, Topics

# CLUSTER_ID_SECRET (defined with the store's tables) is imported from here too.
__all__ = ["CLUSTER_ID_SECRET", "DesiredPublisher"]


# The sweep of stale retained documents gives up waiting after this long in all.
_SWEEP_MAX_S = 60.0


class DesiredPublisher:
    def __init__(
        self,
        settings: MqttSettings,
        *,
        signing_key: Ed25519PrivateKey,
        cluster_id: str,
        client_id: str | None = None,
        sweep_quiet_s: float = 1.0,
    ) -> None:
        """`cluster_id`: the store's (documents of any other are stale); `sweep_quiet_s`:
        how long without a retained document ends the first connection's sweep."""
        self._topics = Topics(settings.topic_root)
        self._signing_key = signing_key
        self._public_key = signing_key.public_key()
        self.cluster_id = cluster_id
        self._sweep_quiet_s = sweep_quiet_s
        self._sweep_activity = asyncio.Event()
        self._log = structlog.get_logger("greenfed.loop.publisher")
        self._session = MqttSession(
            settings,
            client_id=client_id or instance_client_id("greenfed-scheduler"),
            logger=structlog.get_logger("greenfed.loop.mqtt"),
        )
        self._queue: dict[str, DesiredState] = {}
        # The newest document handed over per node: republished on every connection.
        self._latest: dict[str, DesiredState] = {}
        self._queued = asyncio.Event()
        # The generation last handed over per node: what the loop need not send again.
        self._generations: dict[str, int] = {}
        self.published_total = 0
        # Retained documents of another cluster (or unsigned, or forged) cleared.
        self.stale_cleared_total = 0
        # Set once the first connection's sweep of retained documents has finished.
        self.swept = asyncio.Event()
        self.connected = self._session.connected

    def is_current(self, node_id: str, generation: int) -> bool:
        return self._generations.get(node_id, -1) >= generation

    def forget(self) -> None:
        """Leadership changed hands: the next leader republishes everything it has."""
        self._generations.clear()
        self._latest.clear()

    def republish(self, node_id: str) -> bool:
        """Send the node's newest document again (a node that never acknowledged its
        assignment may never have received it); False when there is none."""
        document = self._latest.get(node_id)
        if document is None:
            return False
        self._queue.setdefault(node_id, document)
        self._queued.set()
        return True

    def submit(self, document: DesiredState) -> None:
        self._queue[document.node_id] = document
        self._latest[document.node_id] = document
        self._generations[document.node_id] = document.generation
        self._queued.set()

    async def run(self) -> None:
        await self._session.run(self._drain)

    async def _drain(self, client: aiomqtt.Client) -> None:
        """Publish until the connection drops; noticing the drop at once (not at the next
        publish) lets the session reconnect while nothing is waiting to go out."""
        self._queue.update(self._latest)  # retained state may be gone: all of it again
        if self._queue:
            self._queued.set()
        try:
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(self._watch(client))
                tasks.create_task(self._publish(client))
                if not self.swept.is_set():
                    tasks.create_task(self._sweep(client))
        except* aiomqtt.MqttError as group:
            raise group.exceptions[0] from None

    async def _watch(self, client: aiomqtt.Client) -> None:
        # Only the sweep subscribes; otherwise the iteration only ends, raising, when the
        # link drops.
        async for message in client.messages:
            if message.retain and not self.swept.is_set():
                await self._check_retained(client, message)
        raise aiomqtt.MqttError("the connection to the broker ended")

    async def _sweep(self, client: aiomqtt.Client) -> None:
        everything = self._topics.all_nodes(Channel.DESIRED)
        await client.subscribe(everything, qos=1)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_SWEEP_MAX_S):
                while True:
                    self._sweep_activity.clear()
                    try:
                        await asyncio.wait_for(self._sweep_activity.wait(), self._sweep_quiet_s)
                    except TimeoutError:
                        break  # quiet: every retained document has arrived
        self.swept.set()
        self._log.info("retained desired documents swept", cleared=self.stale_cleared_total)
        await client.unsubscribe(everything)

    async def _check_retained(self, client: aiomqtt.Client, message: aiomqtt.Message) -> None:
        self._sweep_activity.set()
        payload = message.payload
        if not isinstance(payload, bytes) or not payload:
            return  # already cleared
        try:
            node_id = self._topics.parse(message.topic.value).node_id
        except TopicError:
            return
        try:
            document = verify_desired(payload, self._public_key)
            stale_because = None if document.cluster_id == self.cluster_id else "another cluster"
        except DesiredSignatureError as error:
            stale_because = error.reason
        # No await between the check and the publish call, which queues the packet at once:
        # a document of ours submitted after the check goes out after the clear.
        if stale_because is None or node_id in self._latest:
            return
        self._log.info("stale retained desired cleared", node_id=node_id, reason=stale_because)
        self.stale_cleared_total += 1
        await client.publish(
            self._topics.node(node_id, Channel.DESIRED),
            b"",
            qos=CHANNEL_SPECS[Channel.DESIRED].qos,
            retain=True,
        )

    async def _publish(self, client: aiomqtt.Client) -> None:
        qos = CHANNEL_SPECS[Channel.DESIRED].qos
        retain = CHANNEL_SPECS[Channel.DESIRED].retained
        while True:
            await self._queued.wait()
            self._queued.clear()
            batch, self._queue = self._queue, {}
            try:
                await asyncio.gather(
                    *(
                        client.publish(
                            self._topics.node(node_id, Channel.DESIRED),
                            sign_desired(document, self._signing_key),
                            qos=qos,
                            retain=retain,
                        )
                        for node_id, document in batch.items()
                    )
                )
            except BaseException:
                for node_id, document in batch.items():
                    self._queue.setdefault(node_id, document)
                self._queued.set()
                raise
            self.published_total += len(batch)
