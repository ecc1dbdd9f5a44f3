"""MQTT ingestion: node messages in, registry updates out.

Every message is checked in order: topic shape, size, JSON/schema, that the
node id in the payload is the one in the topic, then registry rules (known node,
same agent instance, increasing sequence). Each failure is counted under its
reason, logged at most once per interval per reason, and dropped; nothing one
node sends can disturb another node's ingestion.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from enum import StrEnum

import aiomqtt
import msgspec
import structlog

from cloud.fleet.registry import NodeRegistry, NodeStateChange, Rejection
from shared.logs import RateLimitedLog
from shared.messages import (
    EVENT_DECODER,
    LOG_DECODER,
    REPORTED_DECODER,
    STATUS_DECODER,
    TELEMETRY_DECODER,
    JobLogChunk,
    NodeEvent,
    NodeStatus,
    ReportedState,
    Telemetry,
)
from shared.mqtt import MqttSession
from shared.settings import MqttSettings
from shared.topics import CHANNEL_SPECS, Channel, TopicError, Topics

IngestedMessage = NodeStatus | Telemetry | ReportedState | NodeEvent | JobLogChunk

# Status first, so that retained births are known before the first telemetry.
DECODERS: dict[Channel, msgspec.json.Decoder[IngestedMessage]] = {
    Channel.STATUS: STATUS_DECODER,  # type: ignore[dict-item]
    Channel.TELEMETRY: TELEMETRY_DECODER,  # type: ignore[dict-item]
    Channel.REPORTED: REPORTED_DECODER,  # type: ignore[dict-item]
    Channel.EVENTS: EVENT_DECODER,  # type: ignore[dict-item]
    Channel.LOGS: LOG_DECODER,  # type: ignore[dict-item]
}


class InvalidReason(StrEnum):
    BAD_TOPIC = "bad_topic"
    OVERSIZED = "oversized"
    MALFORMED_JSON = "malformed_json"
    SCHEMA_VIOLATION = "schema_violation"
    NODE_ID_MISMATCH = "node_id_mismatch"
    UNKNOWN_NODE = Rejection.UNKNOWN_NODE.value
    INSTANCE_MISMATCH = Rejection.INSTANCE_MISMATCH.value
    OUT_OF_ORDER = Rejection.OUT_OF_ORDER.value


class IngestStats:
    """Plain counters on the hot path; exported to Prometheus by a collector."""

    def __init__(self) -> None:
        self.ingested: Counter[str] = Counter()
        self.invalid: Counter[tuple[str, str]] = Counter()

    @property
    def invalid_total(self) -> int:
        return sum(self.invalid.values())


class Ingestor:
    def __init__(
        self,
        registry: NodeRegistry,
        topics: Topics,
        *,
        max_payload_bytes: int,
        invalid_log_interval_s: float = 10.0,
        on_state_change: Callable[[NodeStateChange], None] | None = None,
        on_event: Callable[[NodeEvent], None] | None = None,
        on_log: Callable[[JobLogChunk], None] | None = None,
    ) -> None:
        self.registry = registry
        self.topics = topics
        self.stats = IngestStats()
        self._max_payload_bytes = max_payload_bytes
        self._log = structlog.get_logger("greenfed.ingest")
        self._invalid_log = RateLimitedLog(self._log, invalid_log_interval_s)
        self._on_state_change = on_state_change
        self._on_event = on_event
        self._on_log = on_log
        # Called (with nothing) whenever a node's state changed or it reported: the
        # scheduling loop's trigger. Must be quick and must not raise.
        self.change_listeners: list[Callable[[], None]] = []
        # Set while subscribed to every channel: the cloud's readiness.
        self.subscribed = asyncio.Event()

    def _reject(self, channel: str, reason: InvalidReason, topic: str, error: str = "") -> None:
        self.stats.invalid[(channel, reason.value)] += 1
        self._invalid_log.warning(
            f"{channel}/{reason.value}",
            "mqtt payload dropped",
            reason=reason.value,
            topic=topic,
            error=error[:300],
        )

    def _changed(self, change: NodeStateChange | None) -> None:
        if change is None:
            return
        self._log.info(
            "node state", node_id=change.node_id, state=change.state, reason=change.reason
        )
        if self._on_state_change is not None:
            self._on_state_change(change)
        self.notify_change()

    def notify_change(self) -> None:
        for listener in self.change_listeners:
            listener()

    def handle(self, topic: str, payload: bytes | bytearray) -> None:
        """Decode and apply one message. Never raises for anything a client can send."""
        try:
            parsed = self.topics.parse(topic)
        except TopicError as error:
            self._reject("unknown", InvalidReason.BAD_TOPIC, topic, str(error))
            return
        channel = parsed.channel
        if len(payload) > self._max_payload_bytes:
            self._reject(
                channel,
                InvalidReason.OVERSIZED,
                topic,
                f"{len(payload)} bytes > {self._max_payload_bytes}",
            )
            return
        if not payload:
            # An empty retained message clears the topic; for status, the node is gone.
            if channel is Channel.STATUS and self.registry.forget(parsed.node_id):
                self._log.info("node forgotten", node_id=parsed.node_id)
            return
        decoder = DECODERS.get(channel)
        if decoder is None:
            return  # desired is the cloud's own output, not ingested
        try:
            message = decoder.decode(payload)
        except msgspec.ValidationError as error:
            self._reject(channel, InvalidReason.SCHEMA_VIOLATION, topic, str(error))
            return
        except msgspec.DecodeError as error:
            self._reject(channel, InvalidReason.MALFORMED_JSON, topic, str(error))
            return
        if message.node_id != parsed.node_id:
            self._reject(
                channel,
                InvalidReason.NODE_ID_MISMATCH,
                topic,
                f"payload node_id {message.node_id!r}",
            )
            return
        self._apply(channel, message, topic)

    def _apply(self, channel: Channel, message: IngestedMessage, topic: str) -> None:
        outcome: Rejection | NodeStateChange | None = None
        if isinstance(message, Telemetry):
            outcome = self.registry.apply_telemetry(message)
        elif isinstance(message, NodeStatus):
            outcome = self.registry.apply_status(message)
        elif isinstance(message, ReportedState):
            outcome = self.registry.apply_reported(message)
            if outcome is None:
                self.notify_change()
        elif isinstance(message, JobLogChunk):
            if self._on_log is not None:
                self._on_log(message)
        elif self._on_event is not None:
            self._on_event(message)
        if isinstance(outcome, Rejection):
            self._reject(channel, InvalidReason(outcome.value), topic)
            return
        self.stats.ingested[channel] += 1
        self._changed(outcome)

    def session(self, settings: MqttSettings, client_id: str) -> MqttSession:
        """An MQTT session that delivers every message straight to `handle_message`."""
        return MqttSession(
            settings,
            client_id=client_id,
            message_sink=self.handle_message,
            logger=structlog.get_logger("greenfed.cloud.mqtt"),
        )

    def handle_message(self, message: aiomqtt.Message) -> None:
        try:
            self.handle(message.topic.value, message.payload)
        except Exception:  # a bug here must not tear down the connection for everyone
            self._log.exception("ingestion failed", topic=message.topic.value)

    async def run(self, session: MqttSession) -> None:
        """Subscribe on every (re)connect and ingest until cancelled."""
        await session.run(self._consume)

    async def _consume(self, client: aiomqtt.Client) -> None:
        for channel in DECODERS:
            await client.subscribe(self.topics.all_nodes(channel), qos=CHANNEL_SPECS[channel].qos)
        self._log.info("ingestion subscribed", root=self.topics.root)
        self.subscribed.set()
        try:
            # Messages arrive through handle_message (the session's sink); iterating
            # only waits here and raises when the connection drops.
            async for message in client.messages:
                self.handle_message(message)
        finally:
            self.subscribed.clear()
