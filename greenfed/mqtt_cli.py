"""`greenfed mqtt accounts create|revoke`: third parties' read-only accounts on the MQTT
broker, through a running control plane's REST API (admin); each prints as `-o` asks
(`greenfed.output`)."""

from __future__ import annotations

import msgspec

from cloud.broker_accounts.views import MqttAccountCreated, MqttAccountRevoked
from greenfed.api_client import ApiClient, path_segment
from greenfed.arguments import EXIT_OK
from greenfed.output import Output, emit
from greenfed.work_commands import act_and_say


def _created_lines(created: MqttAccountCreated) -> str:
    scheme, _, address = created.broker.partition("://")
    host, _, port = address.rpartition(":")
    tls = " --capath /etc/ssl/certs" if scheme == "mqtts" else ""
    return (
        f"MQTT account {created.username} ({created.role}); its password, shown this once:\n"
        f"  {created.password}\n"
        f"it may read {', '.join(created.topics)} and nothing else, connecting with the "
        f"client id {created.client_id} (the broker refuses any other); for example:\n"
        f"  mosquitto_sub -h {host} -p {port}{tls} -u {created.username} -P '<password>' "
        f"-i '{created.client_id}' -t '{created.topics[0]}' -v\n"
    )


async def create_account(client: ApiClient, name: str, role: str, *, output: Output) -> int:
    body = msgspec.json.encode({"name": name, "role": role})
    created = (await client.ask("POST", "/v1/mqtt/accounts", MqttAccountCreated, body=body)).value
    emit(output, created, lambda: output.out.write(_created_lines(created)))
    return EXIT_OK


async def revoke_account(client: ApiClient, name: str, *, output: Output) -> int:
    return await act_and_say(
        client,
        "DELETE",
        f"/v1/mqtt/accounts/{path_segment(name)}",
        MqttAccountRevoked,
        lambda revoked: f"MQTT account {revoked.username} disabled; its connections were dropped",
        output=output,
    )
