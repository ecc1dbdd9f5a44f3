"""Third parties' accounts on the MQTT broker (admin): a read-only `telemetry-reader`
that sees every node's telemetry and births and nothing else
(docs/mqtt.md#example-a-third-party-subscriber), made and revoked here, audited
`mqtt_account.create` and `mqtt_account.revoke`. The broker is told through the control
plane's account seam (cloud/broker_accounts/): Mosquitto's dynamic security plugin, or
the embedded broker's accounts."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Final

import msgspec
from aiohttp import web

from cloud.api.audit import audit_entry
from cloud.api.bodies import json_response, read_json
from cloud.api.credential_minting import ADMIN_MINTING_REFUSAL, refuse_unless_caller_active
from cloud.api.problems import Problem, problem_reply
from cloud.api.routes import Reply, Route
from cloud.app_keys import BROKER_ACCOUNTS, SETTINGS, STORE
from cloud.broker_accounts import (
    AccountsNotManagedError,
    BrokerAccountError,
    ForeignAccountError,
    InvalidAccountNameError,
)
from cloud.broker_accounts.dynsec_protocol import READER_CHANNELS
from cloud.broker_accounts.views import MqttAccountCreated, MqttAccountRevoked, MqttAccountSpec
from shared.problems import InvalidParam
from shared.settings import parse_mqtt_url
from shared.topics import Topics, is_valid_node_id

_DECODER: Final = msgspec.json.Decoder(MqttAccountSpec)
# What only an active token may do here (cloud/api/credential_minting.py), as refused.
_CREATING_ACCOUNTS: Final = "create MQTT accounts"


# What a route answers beyond its success: the same for making and revoking, but for
# a name no account can have (a 422 on the body's field, a 404 for the path's).
_NAME_REFUSAL: Final = problem_reply(
    422, "The name can be no account's: one topic level, as a node id"
)
_REFUSALS: Final = (
    problem_reply(
        409,
        "The name is a node's, the control plane's or an operator's; or the broker's "
        "accounts are made by hand",
    ),
    problem_reply(503, "The broker did not answer"),
)


def _invalid_name(name: str, reason: str) -> Problem:
    """A name no account can have: the caller's mistake, so never the 503 a client
    retries (whatever the broker, or none, would have said)."""
    return Problem(
        422,
        "invalid-mqtt-account-name",
        "Invalid MQTT account name",
        f"name: {reason}",
        (InvalidParam("name", reason),),
    )


@contextlib.contextmanager
def _broker_refusals(name: str, *, revoking: bool = False) -> Iterator[None]:
    """The account seam's errors as problems: a name no account can have (422), a name
    some other account holds, accounts made by hand (409), a broker that did not answer
    (503)."""
    try:
        yield
    except InvalidAccountNameError as error:
        raise _invalid_name(name, str(error)) from None
    except ForeignAccountError:
        # Never the 503 a client retries: the account stays another's whatever it asks.
        advice = "it was left untouched" if revoking else "choose another name"
        raise Problem(
            409,
            "mqtt-account-taken",
            "MQTT account name taken",
            f"the MQTT broker's account {name!r} is a node's, the control plane's or an "
            f"operator's, not a greenfed reader's: {advice}",
        ) from None
    except AccountsNotManagedError as error:
        raise Problem(
            409, "mqtt-accounts-not-managed", "MQTT accounts made by hand", str(error)
        ) from None
    except BrokerAccountError as error:
        raise Problem(
            503,
            "broker-accounts-unavailable",
            "Broker accounts unavailable",
            str(error),
            headers={"Retry-After": "5"},
        ) from None


async def create_account(request: web.Request) -> web.Response:
    await refuse_unless_caller_active(request, _CREATING_ACCOUNTS)
    spec = await read_json(request, _DECODER)
    with _broker_refusals(spec.name):
        credentials = await request.app[BROKER_ACCOUNTS].provision_reader(spec.name)
    await request.app[STORE].record_audit(
        audit_entry(request, "mqtt_account.create", spec.name, role=spec.role)
    )
    settings = request.app[SETTINGS].mqtt
    topics = Topics(settings.topic_root)
    endpoint = parse_mqtt_url(settings.url)
    # The seam makes both, or refuses.
    assert credentials.password is not None
    assert credentials.client_id is not None
    created = MqttAccountCreated(
        username=credentials.username,
        password=credentials.password,
        client_id=credentials.client_id,
        role=spec.role,
        topics=tuple(f"{topics.nodes_prefix}+/{channel.value}" for channel in READER_CHANNELS),
        broker=f"{'mqtts' if endpoint.tls else 'mqtt'}://{endpoint.host}:{endpoint.port}",
    )
    return json_response(created, status=201)


async def revoke_account(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    # Checked here: the path is the boundary. A name no account can have names no
    # account: a 404, as for a node id that cannot be one (never the 503 a client
    # retries, whatever the broker, or none, would have said).
    if not is_valid_node_id(name):
        raise Problem(
            404,
            "mqtt-account-not-found",
            "No such MQTT account",
            f"no account can be named {name[:200]!r}: {InvalidAccountNameError(name)}",
        )
    with _broker_refusals(name, revoking=True):
        await request.app[BROKER_ACCOUNTS].revoke_reader(name)
    await request.app[STORE].record_audit(audit_entry(request, "mqtt_account.revoke", name))
    return json_response(MqttAccountRevoked(username=name, revoked=True))


ROUTES: Final = (
    Route(
        "POST",
        "/v1/mqtt/accounts",
        create_account,
        "Make (or give a new password to) a third party's read-only MQTT account (admin)",
        "admin",
        "mqtt",
        body=MqttAccountSpec,
        replies=(
            Reply(201, "The account and its password, shown once", MqttAccountCreated),
            ADMIN_MINTING_REFUSAL,
            _NAME_REFUSAL,
            *_REFUSALS,
        ),
    ),
    Route(
        "DELETE",
        "/v1/mqtt/accounts/{name}",
        revoke_account,
        "Disable a third party's MQTT account (admin): its connection is dropped",
        "admin",
        "mqtt",
        replies=(
            Reply(200, "Disabled (also when there was none)", MqttAccountRevoked),
            problem_reply(404, "A name no account can have: not one topic level"),
            *_REFUSALS,
        ),
    ),
)
