"""JSON Schemas of the v1 payloads, generated from the Structs (never hand-written)."""

from __future__ import annotations

from typing import Any

import msgspec

from shared.messages import (
    SCHEMA_VERSION,
    DesiredState,
    JobLogChunk,
    NodeEvent,
    NodeStatus,
    ReportedState,
    Telemetry,
    WireStruct,
)
from shared.portable_patterns import portable
from shared.topics import CHANNEL_SPECS, Channel, Topics

PAYLOAD_TYPES: dict[Channel, type[WireStruct]] = {
    Channel.STATUS: NodeStatus,
    Channel.TELEMETRY: Telemetry,
    Channel.DESIRED: DesiredState,
    Channel.REPORTED: ReportedState,
    Channel.EVENTS: NodeEvent,
    Channel.LOGS: JobLogChunk,
}


def payload_schema(channel: Channel) -> dict[str, Any]:
    """A self-contained JSON Schema (2020-12) for one channel's payload."""
    schema = portable(msgspec.json.schema(PAYLOAD_TYPES[channel]))
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://greenfed.dev/schemas/v1/{channel.value}.json",
        "title": f"greenfed v1 {channel.value} payload (schema {SCHEMA_VERSION})",
        **schema,
    }


def all_payload_schemas() -> dict[str, dict[str, Any]]:
    return {channel.value: payload_schema(channel) for channel in PAYLOAD_TYPES}


def schema_catalog(topics: Topics) -> dict[str, dict[str, Any]]:
    """Every v1 payload schema with the topic, QoS and retain flag it travels with.

    The same document is served at `GET /v1/schemas` and printed by `greenfed schema`.
    """
    return {
        channel.value: {
            "topic": f"{topics.nodes_prefix}{{node_id}}/{channel.value}",
            "qos": CHANNEL_SPECS[channel].qos,
            "retained": CHANNEL_SPECS[channel].retained,
            "direction": CHANNEL_SPECS[channel].direction,
            "schema": payload_schema(channel),
        }
        for channel in PAYLOAD_TYPES
    }
