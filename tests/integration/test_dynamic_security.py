"""Node accounts on a real Mosquitto with its dynamic security plugin, bootstrapped as
deploy/mosquitto/dynsec-bootstrap.sh documents: the control plane provisions, revokes
and re-provisions nodes itself, and each node is confined to its own topics."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cloud.broker_accounts import (
    BrokerAccountError,
    InvalidAccountNameError,
    broker_accounts_from,
)
from cloud.broker_accounts.dynamic_security import DynamicSecurityAccounts
from shared.settings import CloudSettings, MqttSettings, Settings
from tests.support.broker_accounts import (
    AccountsBroker,
    assert_refused_login,
    check_a_node_cannot_send_account_commands,
    check_a_reader_cannot_take_an_agents_client_id,
    check_a_telemetry_reader_reads_telemetry_and_births_only,
    check_nodes_are_confined_to_their_own_topics,
    check_revoke_drops_the_node_and_reprovision_restores_it,
)
from tests.support.brokers import DynamicSecurity, MosquittoProcess

pytestmark = pytest.mark.timeout(60)

CLOUD_USER, CLOUD_PASSWORD = "greenfed-cloud", "cloud-password"


@pytest.fixture
async def mosquitto(tmp_path: Path) -> AsyncIterator[tuple[MosquittoProcess, AccountsBroker]]:
    process = MosquittoProcess(tmp_path, dynamic_security=DynamicSecurity())
    await process.start()
    root = f"gftest-{uuid.uuid4().hex[:12]}"
    await process.bootstrap_control_plane(CLOUD_USER, CLOUD_PASSWORD, root)
    admin = MqttSettings(
        url=process.url, username=CLOUD_USER, password=CLOUD_PASSWORD, topic_root=root
    )
    yield process, AccountsBroker(admin)
    await process.stop()


@pytest.fixture
async def accounts(
    mosquitto: tuple[MosquittoProcess, AccountsBroker],
) -> AsyncIterator[DynamicSecurityAccounts]:
    accounts = DynamicSecurityAccounts(mosquitto[1].admin, timeout_s=10)
    yield accounts
    await accounts.close()


async def test_a_provisioned_node_uses_only_its_own_topics(
    mosquitto: tuple[MosquittoProcess, AccountsBroker], accounts: DynamicSecurityAccounts
) -> None:
    await check_nodes_are_confined_to_their_own_topics(mosquitto[1], accounts)


async def test_a_telemetry_reader_reads_telemetry_and_births_only(
    mosquitto: tuple[MosquittoProcess, AccountsBroker], accounts: DynamicSecurityAccounts
) -> None:
    await check_a_telemetry_reader_reads_telemetry_and_births_only(mosquitto[1], accounts)


async def test_a_reader_cannot_take_an_agents_client_id(
    mosquitto: tuple[MosquittoProcess, AccountsBroker], accounts: DynamicSecurityAccounts
) -> None:
    await check_a_reader_cannot_take_an_agents_client_id(mosquitto[1], accounts)


async def test_revoke_drops_the_node_and_reprovisioning_gives_it_a_new_password(
    mosquitto: tuple[MosquittoProcess, AccountsBroker], accounts: DynamicSecurityAccounts
) -> None:
    await check_revoke_drops_the_node_and_reprovision_restores_it(mosquitto[1], accounts)


async def test_nodes_and_the_anonymous_are_refused_without_their_passwords(
    mosquitto: tuple[MosquittoProcess, AccountsBroker], accounts: DynamicSecurityAccounts
) -> None:
    broker = mosquitto[1]
    credentials = await accounts.provision("node-p")
    await assert_refused_login(broker, None, None)
    await assert_refused_login(broker, credentials.username, "wrong")
    await assert_refused_login(broker, "node-unknown", "whatever")


async def test_accounts_survive_a_broker_restart(
    mosquitto: tuple[MosquittoProcess, AccountsBroker], accounts: DynamicSecurityAccounts
) -> None:
    process, broker = mosquitto
    credentials = await accounts.provision("node-s")
    await process.stop()
    await process.start()
    async with broker.node_client(credentials):
        pass
    # The control plane reconnects by itself for its next change.
    await accounts.revoke("node-s")
    await assert_refused_login(broker, credentials.username, credentials.password)


async def test_a_wrong_admin_password_is_a_clear_error(
    mosquitto: tuple[MosquittoProcess, AccountsBroker],
) -> None:
    admin = mosquitto[1].admin
    wrong = DynamicSecurityAccounts(
        MqttSettings(
            url=admin.url, username=CLOUD_USER, password="wrong", topic_root=admin.topic_root
        ),
        timeout_s=10,
    )
    try:
        with pytest.raises(
            BrokerAccountError, match=r"provisioning node 'node-x'.*refused the credentials"
        ):
            await wrong.provision("node-x")
    finally:
        await wrong.close()


async def test_an_account_without_the_admin_role_gets_a_timeout_that_says_why(
    mosquitto: tuple[MosquittoProcess, AccountsBroker], accounts: DynamicSecurityAccounts
) -> None:
    await check_a_node_cannot_send_account_commands(mosquitto[1], accounts)


async def test_invalid_names_never_reach_the_broker(accounts: DynamicSecurityAccounts) -> None:
    """Refused with their own error type: the caller's mistake, which the API answers
    with a 4xx, not the broker being away (503, retried)."""
    for name in ("a/b", "+", "#", "", "a+b", "éx", "a" * 200):
        for change in (
            accounts.provision,
            accounts.revoke,
            accounts.provision_reader,
            accounts.revoke_reader,
        ):
            with pytest.raises(InvalidAccountNameError, match="not a valid topic level"):
                await change(name)


def test_the_setting_chooses_the_implementation() -> None:
    settings = Settings(cloud=CloudSettings(broker_accounts="dynamic-security"))
    assert isinstance(broker_accounts_from(settings), DynamicSecurityAccounts)
    assert not isinstance(broker_accounts_from(Settings()), DynamicSecurityAccounts)


async def test_a_node_id_naming_an_account_greenfed_did_not_make_is_refused(
    mosquitto: tuple[MosquittoProcess, AccountsBroker], accounts: DynamicSecurityAccounts
) -> None:
    """A join token must not buy the operator's `admin` or the control plane's own
    account: their passwords and roles stay as they were."""
    broker = mosquitto[1]
    admin = DynamicSecurity()
    for username in ("admin", CLOUD_USER):
        with pytest.raises(BrokerAccountError, match=r"not a greenfed node's|control plane's"):
            await accounts.provision(username)
        with pytest.raises(BrokerAccountError, match=r"not a greenfed node's|control plane's"):
            await accounts.revoke(username)
    async with broker.client(admin.admin_username, admin.admin_password):
        pass
    async with broker.admin_client():
        pass
    # The control plane still administers accounts.
    credentials = await accounts.provision("node-after")
    async with broker.node_client(credentials):
        pass
