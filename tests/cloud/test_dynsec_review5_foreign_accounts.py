"""A node id (or a reader's name) is a broker username: provisioning resets the
account's password and hands it out, so it must never reach an account greenfed cannot
prove it made for that name under its topic root. On a real Mosquitto with its dynamic
security plugin, whose groups give their clients roles (`admin` among them) that the
clients' own role lists do not show."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from cloud.broker_accounts import ForeignAccountError
from cloud.broker_accounts.dynamic_security import DynamicSecurityAccounts
from cloud.broker_accounts.dynsec_protocol import node_client_id
from shared.settings import CloudSettings, MqttSettings
from shared.topics import DEFAULT_TOPIC_ROOT, Topics
from tests.api.support import Api, running_api
from tests.store.databases import DatabaseUnderTest
from tests.support.broker_accounts import AccountsBroker
from tests.support.dynsec_operator import (
    CLOUD_PASSWORD,
    CLOUD_USER,
    OPERATOR,
    client_info,
    operated_mosquitto,
    operator_commands,
)
from tests.support.enrolled_fleet import join_token

pytestmark = pytest.mark.timeout(60)

OPS_PASSWORD = "ops-secret"


@pytest.fixture
async def mosquitto(tmp_path: Path) -> AsyncIterator[AccountsBroker]:
    async with operated_mosquitto(tmp_path) as broker:
        yield broker


@pytest.fixture
async def accounts(mosquitto: AccountsBroker) -> AsyncIterator[DynamicSecurityAccounts]:
    accounts = DynamicSecurityAccounts(mosquitto.admin, timeout_s=10)
    yield accounts
    await accounts.close()


async def as_operator(broker: AccountsBroker, *commands: dict[str, Any]) -> list[dict[str, Any]]:
    return await operator_commands(
        broker, OPERATOR.admin_username, OPERATOR.admin_password, *commands
    )


async def make_group_admin(broker: AccountsBroker, username: str) -> None:
    """A common dynamic-security layout: operators are admins through a group, with no
    role of their own."""
    await as_operator(
        broker,
        {"command": "createGroup", "groupname": "operators"},
        {"command": "addGroupRole", "groupname": "operators", "rolename": "admin"},
        {"command": "createClient", "username": username, "password": OPS_PASSWORD},
        {"command": "addGroupClient", "groupname": "operators", "username": username},
    )


async def assert_untouched(broker: AccountsBroker, username: str, before: dict[str, Any]) -> None:
    """Its password still logs in, and its client id, roles and groups are as they were."""
    async with broker.client(username, OPS_PASSWORD, client_id=before.get("clientid") or ""):
        pass
    info = await client_info(broker, OPERATOR.admin_username, OPERATOR.admin_password, username)
    assert info == before


async def test_an_operator_who_is_admin_through_a_group_is_never_a_nodes_or_readers_account(
    mosquitto: AccountsBroker, accounts: DynamicSecurityAccounts
) -> None:
    await make_group_admin(mosquitto, "ops")
    before = await client_info(mosquitto, OPERATOR.admin_username, OPERATOR.admin_password, "ops")
    changes: tuple[Callable[[str], Awaitable[object]], ...] = (
        accounts.provision,
        accounts.revoke,
        accounts.provision_reader,
        accounts.revoke_reader,
    )
    for change in changes:
        with pytest.raises(ForeignAccountError, match=r"'ops' is not a greenfed .*group"):
            await change("ops")
    await assert_untouched(mosquitto, "ops", before)
    # The operator still administers the broker, and greenfed still provisions others.
    await operator_commands(mosquitto, "ops", OPS_PASSWORD, {"command": "listClients"})
    node = await accounts.provision("edge-1")
    async with mosquitto.node_client(node):
        pass


@pytest.mark.parametrize(
    ("with_role", "bound_to"),
    [
        pytest.param(False, None, id="no-role-unbound"),
        pytest.param(False, "the-agent", id="no-role-bound-to-the-agents-client-id"),
        pytest.param(True, "a-tool", id="the-nodes-role-bound-to-another-client-id"),
        pytest.param(True, None, id="the-nodes-role-unbound-outside-the-default-root"),
    ],
)
async def test_an_account_greenfed_cannot_prove_its_own_is_never_provisioned(
    mosquitto: AccountsBroker,
    accounts: DynamicSecurityAccounts,
    with_role: bool,
    bound_to: str | None,
) -> None:
    """Made by hand with the node's name: with no role at all, or with the node role of
    releases before role names carried the root but not bound to this fleet's agent
    client id (as greenfed binds every node's)."""
    role = "greenfed-node-edge-1"
    client_id = {
        None: None,
        "the-agent": node_client_id(mosquitto.topics, "edge-1"),
        "a-tool": "an-operators-tool",
    }[bound_to]
    await as_operator(
        mosquitto,
        {"command": "createRole", "rolename": role},
        {
            "command": "createClient",
            "username": "edge-1",
            "password": OPS_PASSWORD,
            **({"clientid": client_id} if client_id else {}),
            **({"roles": [{"rolename": role}]} if with_role else {}),
        },
    )
    before = await client_info(
        mosquitto, OPERATOR.admin_username, OPERATOR.admin_password, "edge-1"
    )
    with pytest.raises(ForeignAccountError, match=r"'edge-1' is not a greenfed node's"):
        await accounts.provision("edge-1")
    await assert_untouched(mosquitto, "edge-1", before)


async def test_a_default_root_node_account_made_before_client_ids_were_bound_is_renewed(
    mosquitto: AccountsBroker,
) -> None:
    """Releases before client-id binding left a node's account unbound, with its role
    only: on the default root, enrolling the node again still renews it (docs/mqtt.md)."""
    await as_operator(
        mosquitto,
        {"command": "createRole", "rolename": "greenfed-node-old-node"},
        {
            "command": "createClient",
            "username": "old-node",
            "password": "old-password",
            "roles": [{"rolename": "greenfed-node-old-node"}],
        },
    )
    default_root = MqttSettings(
        url=mosquitto.admin.url,
        username=CLOUD_USER,
        password=CLOUD_PASSWORD,
        topic_root=DEFAULT_TOPIC_ROOT,
    )
    accounts = DynamicSecurityAccounts(default_root, timeout_s=10)
    try:
        renewed = await accounts.provision("old-node")
    finally:
        await accounts.close()
    topics = Topics(DEFAULT_TOPIC_ROOT)
    assert renewed.client_id == node_client_id(topics, "old-node")
    info = await client_info(
        mosquitto, OPERATOR.admin_username, OPERATOR.admin_password, "old-node"
    )
    assert info["clientid"] == renewed.client_id
    assert [role["rolename"] for role in info["roles"]] == ["greenfed-node-old-node"]


async def test_enrolling_the_node_id_of_a_group_admin_is_409_node_id_taken(
    mosquitto: AccountsBroker, database: DatabaseUnderTest
) -> None:
    """Over REST, as a join token's holder would: refused as docs/rest.md says, and the
    operator's account keeps its password and its group."""
    await make_group_admin(mosquitto, "ops")
    before = await client_info(mosquitto, OPERATOR.admin_username, OPERATOR.admin_password, "ops")
    cloud = CloudSettings(
        invalid_log_interval_s=0, broker_accounts="dynamic-security", require_enrolment=True
    )
    api: Api
    async with running_api(database, mqtt=mosquitto.admin, cloud=cloud) as api:
        token = await join_token(api, uses=1)
        response = await api.client.post(
            "/v1/nodes/enrol", json={"token": token, "node_id": "ops", "site": "cloud"}
        )
        assert response.status == 409, await response.text()
        body = await response.json()
        assert body["type"].endswith("/node-id-taken")
        assert "password" not in await response.text()
    await assert_untouched(mosquitto, "ops", before)
