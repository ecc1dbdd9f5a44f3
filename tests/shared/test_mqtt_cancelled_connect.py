"""A session stopped while it connects leaves no traceback behind (shared/mqtt.py).

aiomqtt 2.x's disconnect callback asks its connect future for its exception without
asking first whether it was cancelled; a refused login stops every MQTT session of
`greenfed cloud` at once, and the socket's last read then raised `CancelledError` in an
event-loop callback: asyncio logged "Exception in callback" with a traceback after the
command's one line (seen in 1 run of 6 and 1 of 8)."""

from __future__ import annotations

import asyncio

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.reasoncodes import ReasonCode

from shared.mqtt import MqttSession
from shared.settings import MqttSettings


def _disconnect(client: object, code: int) -> None:
    paho = client._client  # type: ignore[attr-defined]
    reason = ReasonCode(PacketTypes.DISCONNECT, identifier=code)
    paho.on_disconnect(
        paho, None, mqtt.DisconnectFlags(is_disconnect_packet_from_server=False), reason
    )


async def test_a_disconnect_after_a_cancelled_connect_raises_nothing() -> None:
    client = MqttSession(MqttSettings(), client_id="cancelled-connect").new_client()
    client._connected.cancel()
    _disconnect(client, 0)  # raised CancelledError before
    assert not client._disconnected.done()


async def test_a_disconnect_after_a_connect_is_still_seen() -> None:
    client = MqttSession(MqttSettings(), client_id="connected").new_client()
    client._connected.set_result(None)
    _disconnect(client, 0)
    assert client._disconnected.done()
    assert client._disconnected.exception() is None
    fresh = MqttSession(MqttSettings(), client_id="connected-2").new_client()
    fresh._connected = asyncio.get_running_loop().create_future()  # aiomqtt's next try
    fresh._connected.set_result(None)
    _disconnect(fresh, 0x80)  # an unexpected disconnection is an error for its waiter
    assert fresh._disconnected.done()
    assert fresh._disconnected.exception() is not None
