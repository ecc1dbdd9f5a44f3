"""An operator at a broker with dynamic security, as `mosquitto_ctrl dynsec` would be:
any command of the plugin's (groups included, which greenfed never sends), as JSON on
`$CONTROL/dynamic-security/v1`, with the reply awaited by its correlation data."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from cloud.broker_accounts.dynsec_protocol import CONTROL_TOPIC, RESPONSE_TOPIC
from tests.support.broker_accounts import AccountsBroker


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
