"""An operator at a broker with dynamic security, as `mosquitto_ctrl dynsec` would be:
any command of the plugin's (groups included, which greenfed never sends), as JSON on
`$CONTROL/dynamic-security/v1`, with the reply awaited by its correlation data."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final

from cloud.broker_accounts.dynsec_protocol import CONTROL_TOPIC, RESPONSE_TOPIC
from shared.settings import MqttSettings
from tests.support.broker_accounts import AccountsBroker
from tests.support.brokers import DynamicSecurity, MosquittoProcess

CLOUD_USER: Final = "greenfed-cloud"
CLOUD_PASSWORD: Final = "cloud-password"
# The broker's own admin (not greenfed's), as an operator who set it up holds it.
OPERATOR: Final = DynamicSecurity()


@contextlib.asynccontextmanager
async def operated_mosquitto(tmp_path: Path) -> AsyncIterator[AccountsBroker]:
    """A Mosquitto with dynamic security whose operator (`OPERATOR`) let the control
    plane (`CLOUD_USER`) manage its accounts under a topic root of its own."""
    process = MosquittoProcess(tmp_path, dynamic_security=OPERATOR)
    await process.start()
    try:
        root = f"gftest-{uuid.uuid4().hex[:12]}"
        await process.bootstrap_control_plane(CLOUD_USER, CLOUD_PASSWORD, root)
        yield AccountsBroker(
            MqttSettings(
                url=process.url, username=CLOUD_USER, password=CLOUD_PASSWORD, topic_root=root
            )
        )
    finally:
        await process.stop()


async def operator_commands(
    broker: AccountsBroker, username: str, password: str, *commands: dict[str, Any]
) -> list[dict[str, Any]]:
    """Send `commands` as one batch with `username`'s login; return the responses, each
    checked to carry no error."""
    correlation = uuid.uuid4().hex
    batch = {
        "commands": [
            {**command, "correlationData": f"{correlation}:{index}"}
            for index, command in enumerate(commands)
        ]
    }
    async with broker.client(username, password) as admin:
        await admin.subscribe(RESPONSE_TOPIC, qos=1)
        await admin.publish(CONTROL_TOPIC, json.dumps(batch), qos=1)
        async with asyncio.timeout(10):
            async for message in admin.messages:
                assert isinstance(message.payload, bytes)
                responses: list[dict[str, Any]] = json.loads(message.payload)["responses"]
                if responses and str(responses[0].get("correlationData", "")).startswith(
                    correlation
                ):
                    break
    failed = [response for response in responses if "error" in response]
    assert not failed, failed
    return responses


async def client_info(
    broker: AccountsBroker, username: str, password: str, account: str
) -> dict[str, Any]:
    """`getClient`'s view of `account`: its clientid, roles and groups."""
    (response,) = await operator_commands(
        broker, username, password, {"command": "getClient", "username": account}
    )
    info: dict[str, Any] = response["data"]["client"]
    return info
