"""The REST shapes of `/v1/mqtt/accounts` (docs/rest.md#mqtt-accounts), shared by the
API and the CLI."""

from __future__ import annotations

from typing import Literal

import msgspec

from shared.messages import NodeId


class MqttAccountSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/mqtt/accounts`."""

    name: NodeId  # a broker username: one topic level, as a node id
    role: Literal["telemetry-reader"] = "telemetry-reader"


class MqttAccountCreated(msgspec.Struct, frozen=True, kw_only=True):
    """The account, its password shown this once (the broker keeps only its hash)."""

    username: str
    password: str
    # The one client id the account may connect with (the broker refuses any other).
    client_id: str
    role: str
    # What it may subscribe to, and where the broker is as the control plane reaches it.
    topics: tuple[str, ...]
    broker: str


class MqttAccountRevoked(msgspec.Struct, frozen=True, kw_only=True):
    username: str
    revoked: bool
