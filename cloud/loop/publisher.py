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
"""

from __future__ import annotations

import asyncio

import aiomqtt
import structlog

from shared.messages import DesiredState, encode
from shared.mqtt import MqttSession, instance_client_id
from shared.settings import MqttSettings
from shared.topics import CHANNEL_SPECS, Channel, Topics


class DesiredPublisher:
    def __init__(self, settings: MqttSettings, *, client_id: str | None = None) -> None:
        self._topics = Topics(settings.topic_root)
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
        self.connected = self._session.connected

    def is_current(self, node_id: str, generation: int) -> bool:
        return self._generations.get(node_id, -1) >= generation

    def forget(self) -> None:
        """Leadership changed hands: the next leader republishes everything it has."""
        self._generations.clear()
        self._latest.clear()

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
        except* aiomqtt.MqttError as group:
            raise group.exceptions[0] from None

    @staticmethod
    async def _watch(client: aiomqtt.Client) -> None:
        # Nothing is subscribed: the iteration only ends, raising, when the link drops.
        async for _ in client.messages:
            pass
        raise aiomqtt.MqttError("the connection to the broker ended")

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
                            encode(document),
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
