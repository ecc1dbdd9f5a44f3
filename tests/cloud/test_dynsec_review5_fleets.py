"""Several fleets (topic roots) on one broker, as `mqtt.topic_root` offers
(docs/mqtt.md): each is bootstrapped with deploy/mosquitto/dynsec-bootstrap.sh, a node
id both fleets use stays the first fleet's account, and each fleet's telemetry readers
read their own fleet only, whichever fleet made a reader last. On Mosquitto with its
dynamic security plugin and on the embedded broker of `greenfed up`."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from paho.mqtt.reasoncodes import ReasonCode

from cloud.broker_accounts import ForeignAccountError, NodeCredentials
from cloud.broker_accounts.dynamic_security import DynamicSecurityAccounts
from greenfed.broker import EmbeddedBroker
from shared.settings import MqttSettings
from shared.topics import DEFAULT_TOPIC_ROOT, Channel, Topics
from tests.support.broker_accounts import (
    REFUSED_SUBSCRIPTION,
    AccountsBroker,
    assert_refused_login,
    collect_until,
)
from tests.support.brokers import DynamicSecurity, MosquittoProcess
from tests.support.dynsec_operator import client_info, operator_commands

pytestmark = pytest.mark.timeout(60)

OPERATOR = DynamicSecurity()


@dataclass(frozen=True)
class TwoFleets:
    """Fleet a and fleet b, each with its control plane's account, on one broker; the
    operator's login (`dynsec init`'s admin, or the embedded broker's only admin)."""

    a: AccountsBroker
    b: AccountsBroker
    operator: tuple[str, str]


def fleet(url: str, username: str, password: str, root: str) -> AccountsBroker:
    return AccountsBroker(
        MqttSettings(url=url, username=username, password=password, topic_root=root)
    )


@pytest.fixture
async def mosquitto(tmp_path: Path) -> AsyncIterator[TwoFleets]:
    process = MosquittoProcess(tmp_path, dynamic_security=OPERATOR)
    await process.start()
    try:
        suffix = uuid.uuid4().hex[:8]
        # The documented bootstrap, once per root, each fleet's control plane its own
        # account (the script's run for the second root must not fail).
        await process.bootstrap_control_plane("cloud-a", "password-a", f"fleet-a-{suffix}")
        await process.bootstrap_control_plane("cloud-b", "password-b", f"fleet-b-{suffix}")
        yield TwoFleets(
            fleet(process.url, "cloud-a", "password-a", f"fleet-a-{suffix}"),
            fleet(process.url, "cloud-b", "password-b", f"fleet-b-{suffix}"),
            (OPERATOR.admin_username, OPERATOR.admin_password),
        )
    finally:
        await process.stop()


@pytest.fixture
async def embedded(tmp_path: Path) -> AsyncIterator[TwoFleets]:
    async with EmbeddedBroker(
        port=0, accounts_file=tmp_path / "broker-accounts.json", admin_password="admin-pw"
    ) as broker:
        suffix = uuid.uuid4().hex[:8]
        yield TwoFleets(
            fleet(broker.url, "greenfed-cloud", "admin-pw", f"fleet-a-{suffix}"),
            fleet(broker.url, "greenfed-cloud", "admin-pw", f"fleet-b-{suffix}"),
            ("greenfed-cloud", "admin-pw"),
        )


@pytest.fixture(params=["mosquitto", "embedded"])
def fleets(request: pytest.FixtureRequest) -> TwoFleets:
    found: TwoFleets = request.getfixturevalue(request.param)
    return found


@pytest.fixture
async def accounts(fleets: TwoFleets) -> AsyncIterator[tuple[DynamicSecurityAccounts, ...]]:
    both = tuple(DynamicSecurityAccounts(f.admin, timeout_s=10) for f in (fleets.a, fleets.b))
    yield both
    for accounts in both:
        await accounts.close()


async def test_a_node_id_both_fleets_use_stays_the_first_fleets_account(
    fleets: TwoFleets, accounts: tuple[DynamicSecurityAccounts, ...]
) -> None:
    """Fleet b enrolling its own `edge-1` is refused (the API's 409 node-id-taken),
    never a password reset of fleet a's `edge-1`, nor its client id or role rebound."""
    accounts_a, accounts_b = accounts
    node_a = await accounts_a.provision("edge-1")
    for change in (accounts_b.provision, accounts_b.revoke):
        with pytest.raises(ForeignAccountError, match=r"'edge-1' is not a greenfed node's"):
            await change("edge-1")
    # Fleet a's node still logs in as its agent and publishes under fleet a's root.
    status = fleets.a.topics.node("edge-1", Channel.STATUS)
    async with fleets.a.admin_client() as cloud_a, fleets.a.node_client(node_a) as agent:
        await cloud_a.subscribe(status, qos=1)
        await agent.publish(status, b"still fleet a's", qos=1)
        assert await collect_until(cloud_a, status) == [status]
    # Fleet a itself renews it as before.
    renewed = await accounts_a.provision("edge-1")
    await assert_refused_login(fleets.a, node_a.username, node_a.password)
    async with fleets.a.node_client(renewed):
        pass


async def reads(
    fleets: TwoFleets, reader_fleet: AccountsBroker, reader: NodeCredentials
) -> list[str]:
    """What `reader` receives of both fleets' telemetry, each fleet's control plane
    publishing one sample (the other fleet's first, then reader_fleet's own, last)."""
    own = reader_fleet.topics.node("x", Channel.TELEMETRY)
    other_fleet = fleets.b if reader_fleet is fleets.a else fleets.a
    other = other_fleet.topics.node("y", Channel.TELEMETRY)
    async with reader_fleet.node_client(reader) as subscriber:
        granted = await subscriber.subscribe(
            [
                (reader_fleet.topics.all_nodes(Channel.TELEMETRY), 0),
                (other_fleet.topics.all_nodes(Channel.TELEMETRY), 0),
            ]
        )
        codes = [code.value if isinstance(code, ReasonCode) else code for code in granted]
        assert codes == [0, REFUSED_SUBSCRIPTION]
        async with other_fleet.admin_client() as other_cloud:
            await other_cloud.publish(other, b"other fleet's sample", qos=0)
        async with reader_fleet.admin_client() as own_cloud:
            await own_cloud.publish(own, b"own fleet's sample", qos=0)
        return await collect_until(subscriber, own)


async def test_each_fleets_telemetry_readers_read_their_own_fleet_only(
    fleets: TwoFleets, accounts: tuple[DynamicSecurityAccounts, ...]
) -> None:
    accounts_a, accounts_b = accounts
    own_sample_a = fleets.a.topics.node("x", Channel.TELEMETRY)
    reader_a = await accounts_a.provision_reader("dash-a")
    assert await reads(fleets, fleets.a, reader_a) == [own_sample_a]
    # Fleet b making a reader leaves fleet a's readers reading fleet a.
    reader_b = await accounts_b.provision_reader("dash-b")
    assert await reads(fleets, fleets.a, reader_a) == [own_sample_a]
    assert await reads(fleets, fleets.b, reader_b) == [fleets.b.topics.node("x", Channel.TELEMETRY)]
    # Nor may fleet b renew fleet a's reader.
    with pytest.raises(ForeignAccountError, match="telemetry reader's"):
        await accounts_b.provision_reader("dash-a")


async def test_the_default_root_keeps_its_role_names_and_others_move_to_their_own(
    fleets: TwoFleets,
) -> None:
    """A single-fleet broker on the default root sees the role names it always had; a
    node or reader of another root made before role names carried the root (bound to
    that root's client id, holding the shared role) moves to its root's own role."""
    operator_username, operator_password = fleets.operator
    a = fleets.a
    default = DynamicSecurityAccounts(
        MqttSettings(
            url=a.admin.url,
            username=a.admin.username,
            password=a.admin.password,
            topic_root=DEFAULT_TOPIC_ROOT,
        ),
        timeout_s=10,
    )
    try:
        await default.provision("edge-d")
        await default.provision_reader("dash-d")
    finally:
        await default.close()

    async def roles(account: str) -> list[str]:
        info = await client_info(fleets.a, operator_username, operator_password, account)
        return [role["rolename"] for role in info["roles"]]

    assert await roles("edge-d") == ["greenfed-node-edge-d"]
    assert await roles("dash-d") == ["greenfed-telemetry-reader"]

    root = a.topics.root
    await operator_commands(
        a,
        operator_username,
        operator_password,
        {"command": "createRole", "rolename": "greenfed-node-edge-old"},
        {
            "command": "createClient",
            "username": "edge-old",
            "password": "old-password",
            "clientid": Topics(root).agent_client_id("edge-old"),
            "roles": [{"rolename": "greenfed-node-edge-old"}],
        },
        {
            "command": "createClient",
            "username": "dash-old",
            "password": "old-password",
            "clientid": Topics(root).reader_client_id("dash-old"),
            "roles": [{"rolename": "greenfed-telemetry-reader"}],
        },
    )
    accounts_a = DynamicSecurityAccounts(a.admin, timeout_s=10)
    try:
        await accounts_a.provision("edge-old")
        reader = await accounts_a.provision_reader("dash-old")
    finally:
        await accounts_a.close()
    assert await roles("edge-old") == [f"greenfed-node-edge-old@{root}"]
    assert await roles("dash-old") == [f"greenfed-telemetry-reader@{root}"]
    assert await reads(fleets, a, reader) == [a.topics.node("x", Channel.TELEMETRY)]
