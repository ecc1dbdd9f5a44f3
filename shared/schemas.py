"""JSON Schemas of the v1 payloads, generated from the Structs (never hand-written)."""

from __future__ import annotations

from typing import Any

import msgspec

from shared.messages import (
    SCHEMA_VERSION,
    DesiredState,
    NodeEvent,
    NodeStatus,
    ReportedState,
    Telemetry,
    WireStruct,
)
from shared.topics import Channel

PAYLOAD_TYPES: dict[Channel, type[WireStruct]] = {
    Channel.STATUS: NodeStatus,
    Channel.TELEMETRY: Telemetry,
    Channel.DESIRED: DesiredState,
    Channel.REPORTED: ReportedState,
    Channel.EVENTS: NodeEvent,
}


def payload_schema(channel: Channel) -> dict[str, Any]:
    """A self-contained JSON Schema (2020-12) for one channel's payload."""
    schema = msgspec.json.schema(PAYLOAD_TYPES[channel])
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://greenfed.dev/schemas/v1/{channel.value}.json",
        "title": f"greenfed v1 {channel.value} payload (schema {SCHEMA_VERSION})",
        **schema,
    }


def all_payload_schemas() -> dict[str, dict[str, Any]]:
    return {channel.value: payload_schema(channel) for channel in PAYLOAD_TYPES}
