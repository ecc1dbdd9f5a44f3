"""Revoking where the broker's account of that name is not greenfed's (an operator made
it by hand): the revocation holds in the control plane, the account is left untouched,
and the answer is a 409 that says both, never a 503 a client would retry forever. On a
real Mosquitto with its dynamic security plugin, both store backends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientResponse

from shared.settings import CloudSettings
from tests.api.support import Api, bearer, problem, running_api
from tests.store.databases import DatabaseUnderTest
from tests.support.broker_accounts import AccountsBroker
from tests.support.dynsec_operator import (
    OPERATOR,
    client_info,
    operated_mosquitto,
    operator_commands,
)
from tests.support.enrolled_fleet import enrol, join_token

pytestmark = pytest.mark.timeout(60)

OPS_PASSWORD = "ops-secret"


@pytest.fixture
async def mosquitto(tmp_path: Path) -> AsyncIterator[AccountsBroker]:
    async with operated_mosquitto(tmp_path) as broker:
        yield broker


@pytest.fixture
async def api(mosquitto: AccountsBroker, database: DatabaseUnderTest) -> AsyncIterator[Api]:
    cloud = CloudSettings(
        invalid_log_interval_s=0, broker_accounts="dynamic-security", require_enrolment=True
    )
    async with running_api(database, mqtt=mosquitto.admin, cloud=cloud) as running:
        yield running


async def as_operator(broker: AccountsBroker, *commands: dict[str, Any]) -> None:
    await operator_commands(broker, OPERATOR.admin_username, OPERATOR.admin_password, *commands)


async def account_of(broker: AccountsBroker, username: str) -> dict[str, Any]:
    return await client_info(broker, OPERATOR.admin_username, OPERATOR.admin_password, username)


async def logs_in(broker: AccountsBroker, username: str) -> None:
    async with broker.client(username, OPS_PASSWORD):
        pass


async def refused_as_foreign(response: ClientResponse, status: int, kind: str) -> str:
    body = await problem(response, status)
    assert body["type"].endswith(f"/{kind}"), body
    assert "Retry-After" not in response.headers
    assert "left untouched" in body["detail"]
    detail: str = body["detail"]
    return detail


async def test_revoking_a_node_whose_account_an_operator_remade_is_a_409_not_a_retry(
    api: Api, mosquitto: AccountsBroker
) -> None:
    await enrol(api, await join_token(api, uses=1), "edge-1")
    # An operator replaced the node's account with one of their own (no greenfed role).
    await as_operator(
        mosquitto,
        {"command": "deleteClient", "username": "edge-1"},
        {"command": "createClient", "username": "edge-1", "password": OPS_PASSWORD},
    )
    before = await account_of(mosquitto, "edge-1")

    for _ in range(2):  # asking again changes nothing: the same answer, never a 5xx
        response = await api.client.post("/v1/nodes/edge-1/revoke", headers=bearer(api.admin_token))
        detail = await refused_as_foreign(response, 409, "foreign-broker-account")
        assert "revoked in the control plane" in detail

    # Revoked here all the same; the operator's account as it was, and still usable.
    enrolled = await api.get(api.admin_token, "/v1/nodes/enrolled")
    states = {n["node_id"]: n["state"] for n in (await enrolled.json())["items"]}
    assert states == {"edge-1": "revoked"}
    assert not await api.store.is_enrolled("edge-1")
    assert await account_of(mosquitto, "edge-1") == before
    await logs_in(mosquitto, "edge-1")


async def test_revoking_a_reader_name_that_is_an_operators_account_leaves_it_alone(
    api: Api, mosquitto: AccountsBroker
) -> None:
    await as_operator(
        mosquitto, {"command": "createClient", "username": "ops", "password": OPS_PASSWORD}
    )
    before = await account_of(mosquitto, "ops")
    response = await api.client.delete("/v1/mqtt/accounts/ops", headers=bearer(api.admin_token))
    detail = await refused_as_foreign(response, 409, "mqtt-account-taken")
    assert "choose another name" not in detail  # a revocation names nothing new
    assert await account_of(mosquitto, "ops") == before
    await logs_in(mosquitto, "ops")
