"""A reply on the broker's dynamic-security response topic nested too deeply to decode
(msgspec raises RecursionError there, not DecodeError) is an undecodable reply like any
other: logged and ignored, while the connection that carries every other reply goes on
(cloud/broker_accounts/dynamic_security.py). It used to end that connection, failing
the changes in flight and reconnecting."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from cloud.broker_accounts.dynamic_security import DynamicSecurityAccounts
from cloud.broker_accounts.dynsec_protocol import RESPONSE_TOPIC
from greenfed.broker import EmbeddedBroker
from shared.settings import MqttSettings

pytestmark = pytest.mark.timeout(60)

ADMIN_PASSWORD = "admin-password"
# Far deeper than msgspec's recursion guard (Python's default limit is 1,000 frames).
NESTING = 10_000
NESTED_REPLY = b'{"responses":[],"x":' + b"[" * NESTING + b"]" * NESTING + b"}"


async def test_a_reply_nested_too_deeply_is_ignored_and_the_connection_kept(
    tmp_path: Path,
) -> None:
    async with EmbeddedBroker(
        port=0, accounts_file=tmp_path / "broker-accounts.json", admin_password=ADMIN_PASSWORD
    ) as broker:
        admin = MqttSettings(
            url=broker.url,
            username="greenfed-cloud",
            password=ADMIN_PASSWORD,
            topic_root=f"gftest-{uuid.uuid4().hex[:12]}",
        )
        accounts = DynamicSecurityAccounts(admin, timeout_s=10)
        try:
            with capture_logs() as logs:
                await accounts.provision("node-a")  # connected and subscribed to replies
                # Sent on the response topic as the broker sends its replies (amqtt
                # takes no client's publish to a `$` topic): read before the reply to
                # the next change, which comes after it on the same subscription.
                amqtt = broker._broker
                assert amqtt is not None
                await amqtt._broadcast_message(None, RESPONSE_TOPIC, NESTED_REPLY)
                credentials = await accounts.provision("node-b")
        finally:
            await accounts.close()
    assert credentials.username == "node-b"
    events = [entry["event"] for entry in logs]
    assert "undecodable dynamic-security reply" in events
    assert events.count("mqtt connected") == 1, events
