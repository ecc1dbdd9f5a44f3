"""Publishing `desired` documents: retained, QoS 1, the newest per node wins, and kept so.

The loop hands documents over and never waits for the broker: a scheduling pass must
not stall while MQTT reconnects. Documents that could not be published stay queued
(a newer one for the same node replaces them) and go out on the next connection;
retained delivery means an agent that was offline gets its latest document when it
subscribes. No more publishes are outstanding than paho keeps unacknowledged (`IN_FLIGHT`),
so that each one's timeout covers a round trip, not the backlog queued ahead of it (a
fleet's documents over a WAN link); only what was not acknowledged is queued again.

On every (re)connection the newest document of every node goes out again: a broker
that restarted without persistence (or lost its retained messages any other way)
would otherwise hold no `desired` at all, and an agent restarting then would get
nothing. Republishing a document the broker still holds is harmless: agents apply
a generation once.

Every document is signed (shared/desired_signature.py) with the control plane's key
(cloud/loop/signing.py) as it goes out: agents apply nothing else.

**Issued for an instance (1.9).** Once `follow_instances` ties the publisher to the
node registry, each document is signed for the node's current agent instance as the
registry holds it at that moment (`for_instance`; empty when it knows none), and the
node's newest document goes out again, issued for the new instance, whenever the
registry's current instance changes: that is the answer to a new agent's birth. An
agent that lost its state applies no document until that answer comes, so an old
signed document that anyone re-publishes on the broker runs nothing there
(edge/agent/desired.py).

**Retained documents are watched.** The publisher stays subscribed to every node's
`desired` (the broker sends the retained documents at once, and every later message),
and subscribes again every `sweep_interval_s`, which makes the broker send every
retained document again. Each message is checked:

- on a node whose document this publisher holds (the scheduling leader holds every
  node's that ever had a generation: with or without work), anything other than what
  it last published there (a replay of an older document, a forged one, a cleared
  topic) is replaced with the newest document at once, except a valid document of this
  cluster with a newer generation: only a leader publishes that, so this process may no
  longer lead (its lock taken over while it was paused). That one is left, and the
  leadership is checked at once (`confirm_leading`, below);
- on any other node, a document that is not this cluster's (another cluster id after a
  store reset, unsigned, or not verifiable with our key) is cleared with an empty
  retained payload. A valid document of this cluster there is the leader's business:
  replicas that do not lead leave it alone, and the leader, watching too, restores
  its own should another replica's clear cross it.

Repairs go through the same queue as documents (one pending message per node), so a
flood of forgeries makes at most one publication per node per round. The first sweep
ends (`swept`) when no retained document has come for `sweep_quiet_s`.

**Only a leader's documents go out.** While the scheduling loop leads it gives the
publisher `confirm_leading`, which asks its lease. The publisher asks before documents
(its own or repairs) go out, at most once per `leadership_check_interval_s`, and at once
when a newer document of ours appears on a node it holds. Answered no, it forgets every
document (`forget`) and sends only clears: a leader that was paused (SIGSTOP, a frozen
VM) while its lock went to another replica would otherwise have replaced the new
leader's documents with its own older ones, again and again, until its next pass.

**A node the registry forgets leaves** (`drop`: revoked, or no longer admitted): the
publisher keeps nothing of it, clears its retained document once (an empty payload,
which agents take as nothing to apply) and hands it nothing more, whatever generation
the store gives it, until the node is born again (enrolled anew). Otherwise every
revoked node's last document would stay on the broker, and go out again on every
connection, for the life of the process.

**Oversized documents are not sent.** A signed payload over `max_payload_bytes`
(`DESIRED_MAX_BYTES`: greenfed's brokers take packets of at most 1 MiB and drop a client
that sends a bigger one, with every other node's documents in flight) is logged, counted
(`oversized_total`) and dropped: the node keeps the document it has, and is sent the
next one that fits. The loop builds documents within the limit (cloud/loop/desired.py),
so this is the last guard, not the way work gives way.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final

import aiomqtt
import msgspec
import structlog
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from cloud.loop.desired import DESIRED_MAX_BYTES
from cloud.store.schema import CLUSTER_ID_SECRET
from shared.desired_signature import DesiredSignatureError, sign_desired, verify_desired
from shared.logs import RateLimitedLog
from shared.messages import DesiredState
from shared.mqtt import MqttSession, instance_client_id
from shared.settings import MqttSettings
from shared.topics import CHANNEL_SPECS, Channel, TopicError, Topics

if TYPE_CHECKING:
    from cloud.fleet.registry import NodeRegistry

# CLUSTER_ID_SECRET (defined with the store's tables) is imported from here too.
__all__ = ["CLUSTER_ID_SECRET", "DesiredPublisher"]


# The sweep of retained documents gives up waiting for them after this long in all.
_SWEEP_MAX_S: Final = 60.0
# How often every retained document is read back and checked again.
SWEEP_INTERVAL_S: Final = 300.0
# Documents published to one node whose copy has not come back yet, at most.
_ECHOES_KEPT: Final = 8
_REPAIR_LOG_INTERVAL_S: Final = 10.0
# Documents go out at most this long after the lease was last found held.
LEADERSHIP_CHECK_INTERVAL_S: Final = 1.0
# QoS 1 messages paho keeps unacknowledged (its `max_inflight_messages`, 20 by default):
# no more publishes than that are outstanding at once (`DesiredPublisher._send`).
IN_FLIGHT: Final = 20


class DesiredPublisher:
    def __init__(
        self,
        settings: MqttSettings,
        *,
        signing_key: Ed25519PrivateKey,
        cluster_id: str,
        client_id: str | None = None,
        sweep_quiet_s: float = 1.0,
        sweep_interval_s: float = SWEEP_INTERVAL_S,
        max_payload_bytes: int = DESIRED_MAX_BYTES,
        leadership_check_interval_s: float = LEADERSHIP_CHECK_INTERVAL_S,
    ) -> None:
        """`cluster_id`: the store's (documents of any other are stale); `sweep_quiet_s`:
        how long without a retained document ends a sweep; `sweep_interval_s`: how often
        every retained document is read back and checked; `max_payload_bytes`: the
        largest signed document that is sent; `leadership_check_interval_s`: how long a
        `confirm_leading` answer serves documents that go out."""
        self._topics = Topics(settings.topic_root)
        self._signing_key = signing_key
        self._public_key = signing_key.public_key()
        self.cluster_id = cluster_id
        self._sweep_quiet_s = sweep_quiet_s
        self._sweep_interval_s = sweep_interval_s
        self._max_payload_bytes = max_payload_bytes
        self._leadership_check_interval_s = leadership_check_interval_s
        self._sweep_activity = asyncio.Event()
        self._log = structlog.get_logger("greenfed.loop.publisher")
        self._repair_log = RateLimitedLog(self._log, _REPAIR_LOG_INTERVAL_S)
        self._session = MqttSession(
            settings,
            client_id=client_id or instance_client_id("greenfed-scheduler"),
            logger=structlog.get_logger("greenfed.loop.mqtt"),
        )
        # What goes out next, per node: a document, or None to clear the retained one.
        self._queue: dict[str, DesiredState | None] = {}
        # The newest document handed over per node: republished on every connection.
        self._latest: dict[str, DesiredState] = {}
        self._queued = asyncio.Event()
        # The generation last handed over per node: what the loop need not send again.
        self._generations: dict[str, int] = {}
        # The exact payload last published per node (b"": cleared), and those published
        # on this connection whose copy has not come back yet, oldest first.
        self._published: dict[str, bytes] = {}
        self._echoes: dict[str, deque[bytes]] = {}
        # Nodes the registry forgot: nothing goes out to them until they are born again.
        self._dropped: set[str] = set()
        # The agent instance a node's document is issued for (`follow_instances`).
        self._instance_of: Callable[[str], str | None] = lambda node_id: None
        self._binds = False
        # The leader's lease, asked before documents go out (`confirm_leading`); when it
        # last answered yes (monotonic), and whether a newer document of ours was seen.
        self._confirm_leading: Callable[[], Awaitable[bool]] | None = None
        self._confirmed_at: float | None = None
        self._superseded = False
        self.published_total = 0
        # Retained documents of another cluster (or unsigned, or forged) cleared.
        self.stale_cleared_total = 0
        # Anything else on a node whose document we hold, replaced with ours.
        self.repaired_total = 0
        # Documents sent again because the node's current agent instance changed.
        self.rebound_total = 0
        # Documents not sent: their payload was over `max_payload_bytes`.
        self.oversized_total = 0
        self.sweeps_total = 0
        # Takes documents that go elsewhere than the broker (a cluster's nodes: cloud/
        # clusters/runtime.py); True: taken. None: every document goes to the broker.
        self.diverted: Callable[[DesiredState], bool] | None = None
        # Set once the first connection's sweep of retained documents has finished.
        self.swept = asyncio.Event()
        self.connected = self._session.connected

    @property
    def confirm_leading(self) -> Callable[[], Awaitable[bool]] | None:
        """Whether this process still leads: set by the scheduling loop while it leads
        (cloud/loop/loop.py `LeaseConfirmation`), None otherwise (a replica that does not
        lead sends clears only, which need no lease)."""
        return self._confirm_leading

    @confirm_leading.setter
    def confirm_leading(self, confirm: Callable[[], Awaitable[bool]] | None) -> None:
        # Another lease: what the last one answered says nothing of it.
        self._confirm_leading = confirm
        self._confirmed_at = None
        self._superseded = False

    def follow_instances(self, registry: NodeRegistry) -> None:
        """Issue every document for the node's current agent instance in `registry`, and
        send it again when that instance changes; `drop` the nodes it forgets."""
        self._instance_of = registry.current_instance
        self._binds = True
        registry.instance_listeners.append(self._instance_changed)
        registry.forget_listeners.append(self.drop)

    def is_current(self, node_id: str, generation: int) -> bool:
        """Whether the loop need not hand over the node's document of `generation`."""
        return node_id in self._dropped or self._generations.get(node_id, -1) >= generation

    def drop(self, node_id: str) -> None:
        """The node left the fleet (the registry forgot it): keep nothing of it, clear its
        retained document once, and send it nothing more until it is born again."""
        self._dropped.add(node_id)
        for table in (self._latest, self._generations, self._published, self._echoes):
            table.pop(node_id, None)
        self._queue[node_id] = None  # replaces a document of its still waiting to go out
        self._queued.set()

    def forget(self) -> None:
        """Leadership changed hands: the next leader republishes everything it has, and
        none of this one's documents still queued goes out (clears do: any replica's)."""
        self._generations.clear()
        self._latest.clear()
        self._queue = {node_id: None for node_id, doc in self._queue.items() if doc is None}

    def resend(self, matching: Callable[[str], bool]) -> None:
        """Forget what was handed over for the nodes `matching` names: the loop's next
        pass hands their documents over again (a cluster's bridge that started after
        they went out, cloud/clusters/runtime.py)."""
        for node_id in [node_id for node_id in self._generations if matching(node_id)]:
            del self._generations[node_id]
            self._latest.pop(node_id, None)
            self._queue.pop(node_id, None)

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
        if document.node_id in self._dropped:
            return  # it left the fleet
        if self.diverted is not None and self.diverted(document):
            self._generations[document.node_id] = document.generation
            return
        self._queue[document.node_id] = document
        self._latest[document.node_id] = document
        self._generations[document.node_id] = document.generation
        self._queued.set()

    def _instance_changed(self, node_id: str, instance_id: str) -> None:
        """The registry took a new agent instance for the node: answer its birth."""
        # A node it forgot is born again (enrolled anew): the loop hands it its documents.
        self._dropped.discard(node_id)
        document = self._latest.get(node_id)
        if document is None:
            return
        self._queue[node_id] = document
        self._queued.set()
        self.rebound_total += 1

    async def run(self) -> None:
        await self._session.run(self._drain)

    async def _drain(self, client: aiomqtt.Client) -> None:
        """Publish until the connection drops; noticing the drop at once (not at the next
        publish) lets the session reconnect while nothing is waiting to go out."""
        self._echoes.clear()  # copies of the last connection's messages never come now
        self._queue.update(self._latest)  # retained state may be gone: all of it again
        if self._queue:
            self._queued.set()
        try:
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(self._watch(client))
                tasks.create_task(self._publish(client))
                tasks.create_task(self._sweep(client))
        except* aiomqtt.MqttError as group:
            raise group.exceptions[0] from None

    # ---- watching the retained documents ---------------------------------------------

    async def _watch(self, client: aiomqtt.Client) -> None:
        # The iteration only ends, raising, when the link drops.
        async for message in client.messages:
            self._check(message)
        raise aiomqtt.MqttError("the connection to the broker ended")

    async def _sweep(self, client: aiomqtt.Client) -> None:
        """Subscribe (the broker sends every retained document), wait until they have come,
        and again every `sweep_interval_s`: subscribing again makes the broker send them
        all again, with no moment unwatched."""
        everything = self._topics.all_nodes(Channel.DESIRED)
        while True:
            await client.subscribe(everything, qos=1)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_SWEEP_MAX_S):
                    while True:
                        self._sweep_activity.clear()
                        try:
                            await asyncio.wait_for(self._sweep_activity.wait(), self._sweep_quiet_s)
                        except TimeoutError:
                            break  # quiet: every retained document has arrived
            self.sweeps_total += 1
            if not self.swept.is_set():
                self.swept.set()
                self._log.info(
                    "retained desired documents swept",
                    cleared=self.stale_cleared_total,
                    repaired=self.repaired_total,
                )
            await asyncio.sleep(self._sweep_interval_s)

    def _check(self, message: aiomqtt.Message) -> None:
        """One message on a node's `desired`: ours, or something to replace or clear."""
        if message.retain:
            self._sweep_activity.set()
        try:
            parsed = self._topics.parse(message.topic.value)
        except TopicError:
            return
        if parsed.channel is not Channel.DESIRED:
            return
        node_id = parsed.node_id
        payload = message.payload
        received = bytes(payload) if isinstance(payload, bytes | bytearray) else b""
        if self._is_ours(node_id, received):
            return
        # No await between this check and the queueing: a document of ours submitted after
        # it replaces the repair in the queue.
        latest = self._latest.get(node_id)
        if latest is not None:
            if received and self._supersedes(received, latest):
                # Another leader's: ask the lease (`_publish`) instead of overwriting it.
                self._superseded = True
                self._queued.set()
                self._repair_log.warning(
                    "superseded",
                    "newer desired of this cluster seen: does this replica still lead?",
                    node_id=node_id,
                    last_published_generation=latest.generation,
                )
                return
            self._repair(node_id, latest, "not the newest document" if received else "cleared")
            return
        if not received:
            return  # already cleared
        try:
            document = verify_desired(received, self._public_key)
            stale_because = None if document.cluster_id == self.cluster_id else "another cluster"
        except DesiredSignatureError as error:
            stale_because = error.reason
        if stale_because is not None:
            self._repair(node_id, None, stale_because)

    def _supersedes(self, payload: bytes, latest: DesiredState) -> bool:
        """Whether `payload` is a document of this cluster, signed with our key, newer
        than `latest` for its node: one that only a leader publishes."""
        try:
            document = verify_desired(payload, self._public_key)
        except DesiredSignatureError:
            return False
        return (
            document.cluster_id == self.cluster_id
            and document.node_id == latest.node_id
            and document.generation > latest.generation
        )

    def _is_ours(self, node_id: str, payload: bytes) -> bool:
        """What we published coming back (a copy, or the retained one sent again)."""
        echoes = self._echoes.get(node_id)
        if echoes and payload in echoes:
            while echoes.popleft() != payload:
                pass  # earlier copies were overtaken: they will not come now
            return True
        return payload == self._published.get(node_id, b"")

    def _repair(self, node_id: str, document: DesiredState | None, reason: str) -> None:
        if node_id in self._queue:
            return  # something of ours goes out there anyway
        self._queue[node_id] = document
        self._queued.set()
        if document is None:
            self.stale_cleared_total += 1
            what = "stale retained desired cleared"
        else:
            self.repaired_total += 1
            what = "retained desired replaced with the newest"
        self._repair_log.warning(what, what, node_id=node_id, reason=reason)

    # ---- publishing --------------------------------------------------------------------

    def _payload(self, node_id: str, document: DesiredState | None) -> bytes:
        if document is None:
            return b""
        if self._binds:
            # Signed for the agent instance the registry holds now: the binding is part of
            # the signed bytes, like every other field.
            document = msgspec.structs.replace(
                document, for_instance=self._instance_of(node_id) or ""
            )
        return sign_desired(document, self._signing_key)

    async def _publish(self, client: aiomqtt.Client) -> None:
        while True:
            await self._queued.wait()
            self._queued.clear()
            if not await self._still_leading():
                self._log.warning("desired documents not sent: this replica no longer leads")
                self.forget()  # clears still go out
            batch, self._queue = self._queue, {}
            await self._publish_batch(client, batch)

    async def _still_leading(self) -> bool:
        """Ask `confirm_leading` when a newer document of ours was seen, or before
        documents go out unless it said yes within `leadership_check_interval_s`."""
        while True:
            confirm = self._confirm_leading
            if confirm is None or not (self._superseded or self._documents_unconfirmed()):
                return True
            self._superseded = False
            asked_at = time.monotonic()
            leading = await confirm()
            if confirm is self._confirm_leading:
                if leading:
                    self._confirmed_at = asked_at
                return leading
            # The loop stopped leading under that lease meanwhile (and forgot its
            # documents), and may lead under another already: that one is asked.

    def _documents_unconfirmed(self) -> bool:
        """Documents wait to go out, and the lease was not found held lately."""
        confirmed_at = self._confirmed_at
        if confirmed_at is not None and (
            time.monotonic() - confirmed_at < self._leadership_check_interval_s
        ):
            return False
        return any(document is not None for document in self._queue.values())

    async def _publish_batch(
        self, client: aiomqtt.Client, batch: dict[str, DesiredState | None]
    ) -> None:
        payloads: dict[str, bytes] = {}
        for node_id, document in batch.items():
            payload = self._payload(node_id, document)
            if document is not None and len(payload) > self._max_payload_bytes:
                self._drop_oversized(node_id, document, len(payload))
            else:
                payloads[node_id] = payload
        for node_id, payload in payloads.items():
            # Noted before publishing: the copy may come back before the publish returns.
            self._published[node_id] = payload
            self._echoes.setdefault(node_id, deque(maxlen=_ECHOES_KEPT)).append(payload)
        sent: set[str] = set()

        def acknowledged(node_id: str) -> None:
            sent.add(node_id)
            if batch[node_id] is not None:
                self.published_total += 1
            elif node_id not in self._latest:
                # Cleared: nothing to remember (`_is_ours` reads b"" for a node it does not
                # hold), or every node ever cleared would stay here.
                self._published.pop(node_id, None)
                self._echoes.pop(node_id, None)

        try:
            await self._send(client, payloads, acknowledged)
        except BaseException:
            # What did not go out goes on the next connection, unless newer was queued, or
            # leadership was lost meanwhile (`forget`: a document no longer ours to send).
            for node_id in payloads.keys() - sent:
                document = batch[node_id]
                if document is None or node_id in self._latest:
                    self._queue.setdefault(node_id, document)
            self._queued.set()
            raise

    async def _send(
        self,
        client: aiomqtt.Client,
        payloads: dict[str, bytes],
        acknowledged: Callable[[str], None],
    ) -> None:
        """Publish every node's payload, telling `acknowledged` of each node whose payload
        the broker took; raise the first failure.

        No more are handed to paho than its window of unacknowledged messages
        (`IN_FLIGHT`): each publish times out `connect_timeout_s` after it is called, and
        one queued behind thousands (a fleet's documents on a new connection, over a WAN)
        would time out waiting for its turn, drop the connection and have everything sent
        again, for ever. In the window, a timeout covers about one round trip."""
        qos = CHANNEL_SPECS[Channel.DESIRED].qos
        retain = CHANNEL_SPECS[Channel.DESIRED].retained
        waiting = iter(payloads.items())

        async def send_in_turn() -> None:
            for node_id, payload in waiting:  # shared: each payload is taken once
                topic = self._topics.node(node_id, Channel.DESIRED)
                await client.publish(topic, payload, qos=qos, retain=retain)
                acknowledged(node_id)

        try:
            async with asyncio.TaskGroup() as senders:
                for _ in range(min(IN_FLIGHT, len(payloads))):
                    senders.create_task(send_in_turn())
        except* aiomqtt.MqttError as failed:
            raise failed.exceptions[0] from None

    def _drop_oversized(self, node_id: str, document: DesiredState, payload_bytes: int) -> None:
        """Not sent: the broker would drop the connection, and every other node's
        documents with it. Nor sent again (a new connection, a new agent instance, a
        repair): the node keeps what it has until a document that fits comes."""
        if self._latest.get(node_id) is document:
            del self._latest[node_id]
        self.oversized_total += 1
        self._log.error(
            "desired document not sent: larger than the broker takes",
            node_id=node_id,
            generation=document.generation,
            payload_bytes=payload_bytes,
            limit_bytes=self._max_payload_bytes,
        )
