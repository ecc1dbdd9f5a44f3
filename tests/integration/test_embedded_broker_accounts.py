"""The embedded broker with accounts (what `greenfed up` runs): logins required,
per-node ACLs, Mosquitto's dynamic-security commands, accounts kept across restarts."""

from __future__ import annotations

import asyncio
import stat
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cloud.broker_accounts.dynamic_security import DynamicSecurityAccounts
from greenfed.broker import EmbeddedBroker
from greenfed.up import UpOptions, run_up
from shared.settings import AgentSettings, CloudSettings, MqttSettings, Settings, StoreSettings
from tests.support.broker_accounts import (
    AccountsBroker,
    assert_refused_login,
    check_a_node_cannot_send_account_commands,
    check_a_reader_cannot_take_an_agents_client_id,
    check_a_telemetry_reader_reads_telemetry_and_births_only,
    check_nodes_are_confined_to_their_own_topics,
    check_revoke_drops_the_node_and_reprovision_restores_it,
)
from tests.support.brokers import free_port
from tests.support.processes import get_json, greenfed_env, run_greenfed
from tests.support.waiting import eventually_async

pytestmark = pytest.mark.timeout(60)

ADMIN_PASSWORD = "admin-password"


def _broker(accounts_file: Path, port: int) -> EmbeddedBroker:
    return EmbeddedBroker(port=port, accounts_file=accounts_file, admin_password=ADMIN_PASSWORD)


@pytest.fixture
async def embedded(tmp_path: Path) -> AsyncIterator[tuple[EmbeddedBroker, AccountsBroker]]:
    # Port 0: the kernel's choice at the bind, so no other test's server can take it
    # between a probe and the bind (CI failed once on "address already in use").
    async with _broker(tmp_path / "broker-accounts.json", 0) as broker:
        admin = MqttSettings(
            url=broker.url,
            username="greenfed-cloud",
            password=ADMIN_PASSWORD,
            topic_root=f"gftest-{uuid.uuid4().hex[:12]}",
        )
        yield broker, AccountsBroker(admin)


@pytest.fixture
async def accounts(
    embedded: tuple[EmbeddedBroker, AccountsBroker],
) -> AsyncIterator[DynamicSecurityAccounts]:
    accounts = DynamicSecurityAccounts(embedded[1].admin, timeout_s=10)
    yield accounts
    await accounts.close()


async def test_anonymous_and_wrong_passwords_are_refused(
    embedded: tuple[EmbeddedBroker, AccountsBroker], accounts: DynamicSecurityAccounts
) -> None:
    broker = embedded[1]
    credentials = await accounts.provision("node-p")
    await assert_refused_login(broker, None, None)
    await assert_refused_login(broker, credentials.username, "wrong")
    await assert_refused_login(broker, "greenfed-cloud", "wrong")
    await assert_refused_login(broker, "node-unknown", "whatever")
    async with broker.node_client(credentials):
        pass


async def test_a_provisioned_node_uses_only_its_own_topics(
    embedded: tuple[EmbeddedBroker, AccountsBroker], accounts: DynamicSecurityAccounts
) -> None:
    await check_nodes_are_confined_to_their_own_topics(embedded[1], accounts)


async def test_a_telemetry_reader_reads_telemetry_and_births_only(
    embedded: tuple[EmbeddedBroker, AccountsBroker], accounts: DynamicSecurityAccounts
) -> None:
    await check_a_telemetry_reader_reads_telemetry_and_births_only(embedded[1], accounts)


async def test_a_reader_cannot_take_an_agents_client_id(
    embedded: tuple[EmbeddedBroker, AccountsBroker], accounts: DynamicSecurityAccounts
) -> None:
    await check_a_reader_cannot_take_an_agents_client_id(embedded[1], accounts)


async def test_revoke_drops_the_node_and_reprovisioning_gives_it_a_new_password(
    embedded: tuple[EmbeddedBroker, AccountsBroker], accounts: DynamicSecurityAccounts
) -> None:
    await check_revoke_drops_the_node_and_reprovision_restores_it(embedded[1], accounts)


async def test_only_the_admin_may_send_account_commands(
    embedded: tuple[EmbeddedBroker, AccountsBroker], accounts: DynamicSecurityAccounts
) -> None:
    await check_a_node_cannot_send_account_commands(embedded[1], accounts)


async def test_accounts_survive_a_restart_in_a_private_file(tmp_path: Path) -> None:
    accounts_file, port = tmp_path / "broker-accounts.json", free_port()
    admin = MqttSettings(
        url=f"mqtt://127.0.0.1:{port}", username="greenfed-cloud", password=ADMIN_PASSWORD
    )
    broker = AccountsBroker(admin)
    async with _broker(accounts_file, port):
        accounts = DynamicSecurityAccounts(admin, timeout_s=10)
        kept = await accounts.provision("node-kept")
        revoked = await accounts.provision("node-revoked")
        await accounts.revoke("node-revoked")
        await accounts.close()
    assert stat.S_IMODE(accounts_file.stat().st_mode) == 0o600
    assert kept.password is not None
    assert kept.password.encode() not in accounts_file.read_bytes()
    async with _broker(accounts_file, port):
        async with broker.node_client(kept):
            pass
        await assert_refused_login(broker, revoked.username, revoked.password)


def test_an_accounts_broker_needs_an_admin_password(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="admin_password"):
        EmbeddedBroker(port=0, accounts_file=tmp_path / "accounts.json")


async def test_up_enrols_its_simulated_fleet_on_the_embedded_broker(tmp_path: Path) -> None:
    """`greenfed up`'s wiring in one process: the broker requires logins, every simulated
    node enrols over REST with the control plane's join token, and comes online."""
    data_dir = tmp_path / "data"
    api_port = free_port()
    settings = Settings(
        store=StoreSettings(data_dir=str(data_dir)),
        cloud=CloudSettings(api_port=api_port),
        agent=AgentSettings(telemetry_interval_s=0.5),
    )
    options = UpOptions(
        sim_nodes=3, fleet_file=None, external_mqtt_url=None, broker_port=free_port()
    )
    stop = asyncio.Event()
    up = asyncio.create_task(run_up(settings, options, stop))

    async def online() -> bool:
        token_file = data_dir / "admin-token"
        if up.done() or not token_file.exists():
            return up.done()
        try:
            body = await get_json(
                f"http://127.0.0.1:{api_port}/v1/nodes?state=online", token_file.read_text().strip()
            )
        except OSError:
            return False
        return isinstance(body, dict) and body["count"] == 3

    try:
        await eventually_async(online, timeout_s=30)
        assert not up.done()
        assert stat.S_IMODE((data_dir / "broker-accounts.json").stat().st_mode) == 0o600
        broker = AccountsBroker(MqttSettings(url=f"mqtt://127.0.0.1:{options.broker_port}"))
        await assert_refused_login(broker, None, None)
        await check_the_mqtt_quick_start(broker, f"http://127.0.0.1:{api_port}", data_dir)
    finally:
        stop.set()
        assert await asyncio.wait_for(up, 15) == 0


async def check_the_mqtt_quick_start(broker: AccountsBroker, api: str, data_dir: Path) -> None:
    """docs/mqtt.md's quick start, as written: an admin makes a subscriber account with
    the CLI, and the subscriber reads live telemetry with it, and nothing else."""
    env = {**greenfed_env(), "GREENFED_API": api}
    token_file = str(data_dir / "admin-token")
    code, out, err = await run_greenfed(
        ["mqtt", "accounts", "create", "dashboard", "--token-file", token_file], env=env
    )
    assert code == 0, err
    password = out.splitlines()[1].strip()
    client_id = "greenfed-reader-dashboard@greenfed"
    telemetry = "greenfed/v1/nodes/+/telemetry"
    assert f"-u dashboard -P '<password>' -i '{client_id}' -t '{telemetry}'" in out
    async with broker.client("dashboard", password, client_id=client_id) as subscriber:
        granted = await subscriber.subscribe(
            [("greenfed/v1/nodes/+/telemetry", 0), ("greenfed/v1/nodes/+/desired", 1)]
        )
        assert [getattr(c, "value", c) for c in granted] == [0, 0x80]
        async with asyncio.timeout(20):
            async for message in subscriber.messages:
                assert message.topic.matches("greenfed/v1/nodes/+/telemetry")
                assert message.qos == 0
                break
    code, out, err = await run_greenfed(
        ["mqtt", "accounts", "revoke", "dashboard", "--token-file", token_file], env=env
    )
    assert code == 0, err
    await assert_refused_login(broker, "dashboard", password)
