"""Node enrolment over real HTTP, on SQLite and PostgreSQL: join tokens (admin only),
redemption for credentials, cluster id and public key; expiry, reuse, revocation,
concurrency, rate limiting; revoked nodes refused by ingestion."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from cloud.app import create_app
from cloud.app_keys import BROKER_ACCOUNTS, ENROLLED_NODES, INGESTOR, REGISTRY, SETTINGS, STORE
from cloud.broker_accounts import (
    BrokerAccountError,
    BrokerAccounts,
    ForeignAccountError,
    NodeCredentials,
)
from cloud.fleet.enrolment_views import sealing_key_fingerprint
from cloud.fleet.ingest import InvalidReason
from cloud.loop.publisher import CLUSTER_ID_SECRET
from cloud.loop.signing import load_or_create_signing_key, public_key_base64
from shared.enrolment_certificate import enrolment_proof
from shared.messages import Accelerator, HostInfo, NodeStatus, encode
from shared.sealing import load_public_key, public_key_text
from shared.settings import CloudSettings, SchedulingSettings, Settings
from shared.token_files import admin_token_path, read_token_file
from shared.topics import Channel, Topics
from tests.api.support import FAST, Api, bearer, problem
from tests.store.databases import DatabaseUnderTest
from tests.support.brokers import free_port
from tests.support.fleet import mqtt_settings
from tests.support.waiting import eventually


class RecordingAccounts(BrokerAccounts):
    """The broker-account seam, recording what enrolment asked of it."""

    def __init__(self) -> None:
        self.provisioned: list[str] = []
        self.revoked: list[str] = []
        self.fail = False
        self.foreign: set[str] = set()

    async def provision(self, node_id: str) -> NodeCredentials:
        if self.fail:
            raise BrokerAccountError("broker away")
        if node_id in self.foreign:
            raise ForeignAccountError(f"the broker's account {node_id!r} is not a node's")
        self.provisioned.append(node_id)
        return NodeCredentials(username=f"node-{node_id}", password=f"pw-{node_id}")

    async def revoke(self, node_id: str) -> None:
        self.revoked.append(node_id)

    async def provision_reader(self, name: str) -> NodeCredentials:
        self.provisioned.append(f"reader:{name}")
        return NodeCredentials(username=name, password=f"pw-{name}")

    async def revoke_reader(self, name: str) -> None:
        self.revoked.append(f"reader:{name}")


@contextlib.asynccontextmanager
async def enrolment_api(
    database: DatabaseUnderTest, accounts: BrokerAccounts, **cloud: Any
) -> AsyncIterator[Api]:
    """`running_api`, with the broker-account seam replaced and no broker needed (the
    MQTT session retries in the background; ingestion is fed through `Ingestor.handle`)."""
    port = free_port()
    settings = Settings(
        mqtt=mqtt_settings(f"mqtt://user:secret@127.0.0.1:{free_port()}", "enroltest"),
        cloud=CloudSettings(
            invalid_log_interval_s=0, public_url=f"http://127.0.0.1:{port}", **cloud
        ),
        store=database.settings,
        scheduling=SchedulingSettings(enabled=False),
    )
    app = create_app(settings, tuning=FAST)
    app[BROKER_ACCOUNTS] = accounts
    async with TestClient(TestServer(app, port=port)) as client:
        admin = read_token_file(admin_token_path(database.settings))
        assert admin is not None
        yield Api(client, app, admin, database)


@pytest.fixture
def accounts() -> RecordingAccounts:
    return RecordingAccounts()


@pytest.fixture
async def api(database: DatabaseUnderTest, accounts: RecordingAccounts) -> AsyncIterator[Api]:
    async with enrolment_api(database, accounts) as running:
        yield running


async def create_token(api: Api, **body: Any) -> dict[str, Any]:
    response = await api.client.post(
        "/v1/nodes/join-tokens", json=body, headers=bearer(api.admin_token)
    )
    assert response.status == 201, await response.text()
    created: dict[str, Any] = await response.json()
    return created


async def enrol(api: Api, token: str, node_id: str, **body: Any) -> Any:
    return await api.client.post(
        "/v1/nodes/enrol", json={"token": token, "node_id": node_id, **body}
    )


async def test_only_an_admin_creates_lists_and_revokes_join_tokens(api: Api) -> None:
    tenant = await api.tenant("acme")
    for method, path in (
        ("POST", "/v1/nodes/join-tokens"),
        ("GET", "/v1/nodes/join-tokens"),
        ("DELETE", "/v1/nodes/join-tokens/x"),
        ("GET", "/v1/nodes/enrolled"),
        ("POST", "/v1/nodes/n1/revoke"),
    ):
        await problem(await api.client.request(method, path, json={}), 401)
        await problem(await api.client.request(method, path, json={}, headers=bearer(tenant)), 403)
    created = await create_token(api, uses=2, zone="DE", labels={"rack": "r1"})
    assert created["token"].startswith("gfj_")
    assert (created["uses"], created["max_uses"], created["state"]) == (0, 2, "active")
    listed = await (await api.get(api.admin_token, "/v1/nodes/join-tokens")).json()
    assert [item["id"] for item in listed["items"]] == [created["id"]]
    assert created["token"] not in str(listed)  # shown once, never again


async def test_the_default_ttl_is_the_setting(api: Api) -> None:
    created = await create_token(api)
    lifetime = datetime.fromisoformat(created["expires_at"]) - datetime.fromisoformat(
        created["created_at"]
    )
    assert lifetime.total_seconds() == pytest.approx(CloudSettings().join_token_ttl_s)


async def test_redemption_gives_credentials_cluster_id_and_public_key(
    api: Api, accounts: RecordingAccounts
) -> None:
    created = await create_token(api, site="edge", zone="DE", labels={"rack": "r1"})
    response = await enrol(
        api, created["token"], "edge-1", zone="FR", region="eu", labels={"rack": "x", "gpu": "t4"}
    )
    assert response.status == 200, await response.text()
    body = await response.json()
    assert body["node_id"] == "edge-1"
    assert body["cluster_id"] == await api.store.shared_secret(CLUSTER_ID_SECRET)
    key = public_key_base64(load_or_create_signing_key(api.app[SETTINGS]))
    assert body["control_plane_public_key"] == key
    assert len(base64.b64decode(body["control_plane_public_key"])) == 32
    assert body["mqtt"] == {
        "url": api.app[SETTINGS].mqtt.url.replace("user:secret@", ""),
        "topic_root": "enroltest",
        "username": "node-edge-1",
        "password": "pw-edge-1",
    }
    # The token's defaults win; the node fills in only what the token leaves open.
    assert (body["site"], body["zone"], body["region"]) == ("edge", "DE", "eu")
    assert body["labels"] == {"rack": "r1", "gpu": "t4"}
    assert accounts.provisioned == ["edge-1"]
    enrolled = await (await api.get(api.admin_token, "/v1/nodes/enrolled")).json()
    assert [(n["node_id"], n["state"], n["username"]) for n in enrolled["items"]] == [
        ("edge-1", "enrolled", "node-edge-1")
    ]


async def test_every_refused_token_is_the_same_401(api: Api) -> None:
    one_use = await create_token(api)
    assert (await enrol(api, one_use["token"], "edge-1")).status == 200
    revoked = await create_token(api, uses=5)
    response = await api.client.delete(
        f"/v1/nodes/join-tokens/{revoked['id']}", headers=bearer(api.admin_token)
    )
    assert response.status == 200
    assert (await response.json())["state"] == "revoked"
    expired = await create_token(api, ttl_s=0.001)
    await asyncio.sleep(0.01)  # outlive a one-millisecond token (no event to await)
    bodies = []
    for token in (one_use["token"], revoked["token"], expired["token"], "gfj_guess"):
        body = await problem(await enrol(api, token, "edge-2"), 401)
        bodies.append((body["type"], body["detail"]))
    assert len(set(bodies)) == 1  # used up, revoked, expired, unknown: indistinguishable
    assert not await api.store.is_enrolled("edge-2")
    await problem(
        await api.client.delete("/v1/nodes/join-tokens/nope", headers=bearer(api.admin_token)),
        404,
    )


@pytest.mark.parametrize("uses", [1, 4])
async def test_an_n_use_token_enrols_exactly_n_nodes_concurrently(api: Api, uses: int) -> None:
    created = await create_token(api, uses=uses)
    responses = await asyncio.gather(
        *(enrol(api, created["token"], f"edge-{index}") for index in range(10))
    )
    statuses = sorted(response.status for response in responses)
    assert statuses == [200] * uses + [401] * (10 - uses)
    enrolled = await (await api.get(api.admin_token, "/v1/nodes/enrolled")).json()
    assert enrolled["count"] == uses


async def test_an_enrolled_id_is_not_taken_over(api: Api) -> None:
    created = await create_token(api, uses=3)
    key = _sealing_key()
    response = await enrol(api, created["token"], "edge-1", sealing_public_key=key)
    assert response.status == 200
    for other_key in (None, _sealing_key()):
        body = await problem(
            await enrol(api, created["token"], "edge-1", sealing_public_key=other_key), 409
        )
        assert "greenfed nodes revoke edge-1" in body["detail"]


async def _proof(api: Api, key: X25519PrivateKey, node_id: str, token: str) -> str:
    """What `greenfed edge enrol` sends with the node's key (against GET /v1/nodes/enrol)."""
    answer = await api.client.get("/v1/nodes/enrol")
    assert answer.status == 200, await answer.text()
    exchange_key = load_public_key((await answer.json())["exchange_key"])
    return enrolment_proof(key, exchange_key, node_id=node_id, join_token=token)


async def test_an_enrolled_node_enrols_again_with_its_own_key_for_new_credentials(
    api: Api, accounts: RecordingAccounts
) -> None:
    """Re-enrolling rotates the broker password without a revocation: the node stays
    admitted throughout (its work goes on), pinned to the same key."""
    private = X25519PrivateKey.generate()
    key = public_key_text(private)
    first = await create_token(api, site="edge")
    assert (await enrol(api, first["token"], "edge-1", sealing_public_key=key)).status == 200
    second = await create_token(api, site="edge", work="inference")
    proof = await _proof(api, private, "edge-1", second["token"])
    response = await enrol(
        api, second["token"], "edge-1", sealing_public_key=key, identity_proof=proof
    )
    assert response.status == 200, await response.text()
    assert accounts.provisioned == ["edge-1", "edge-1"]
    assert api.app[ENROLLED_NODES].admits("edge-1")
    envelope = api.app[ENROLLED_NODES].envelope("edge-1")
    assert envelope is not None
    assert envelope.work == "inference"  # the new token's
    enrolled = await (await api.get(api.admin_token, "/v1/nodes/enrolled")).json()
    (view,) = enrolled["items"]
    assert (view["state"], view["join_token_id"]) == ("enrolled", second["id"])


async def test_a_join_token_cannot_take_the_id_of_a_node_the_registry_knows(api: Api) -> None:
    """Without require_enrolment a node runs before it enrols: only that node (the holder
    of its births' sealing key) may enrol its id."""
    private = X25519PrivateKey.generate()
    key = public_key_text(private)
    api.app[INGESTOR].handle(*_birth_payload("edge-1", key))
    created = await create_token(api, uses=2)
    forged = await _proof(api, X25519PrivateKey.generate(), "edge-1", created["token"])
    for other_key, proof in ((None, None), (_sealing_key(), None), (key, None), (key, forged)):
        body = await problem(
            await enrol(
                api, created["token"], "edge-1", sealing_public_key=other_key, identity_proof=proof
            ),
            409,
        )
        assert body["type"].endswith("/node-id-in-use")
    proof = await _proof(api, private, "edge-1", created["token"])
    response = await enrol(
        api, created["token"], "edge-1", sealing_public_key=key, identity_proof=proof
    )
    assert response.status == 200, await response.text()


@pytest.mark.parametrize("require_enrolment", [False, True])
async def test_a_refused_token_learns_nothing_about_node_ids(
    database: DatabaseUnderTest, accounts: RecordingAccounts, require_enrolment: bool
) -> None:
    """A node id the control plane knows (a live node; an enrolled one) and one it does
    not get the same refusal for a token that does not work, and both count against the
    address's budget: no caller without a token can probe which node ids exist."""
    async with enrolment_api(database, accounts, require_enrolment=require_enrolment) as api:
        key = _sealing_key()
        if require_enrolment:
            created = await create_token(api)
            response = await enrol(api, created["token"], "edge-1", sealing_public_key=key)
            assert response.status == 200, await response.text()
        api.app[INGESTOR].handle(*_birth_payload("edge-1", key))
        assert api.app[REGISTRY].get("edge-1") is not None
        refusals = set()
        for node_id in ("edge-1", "never-seen") * 5:  # the address's ten refusals
            body = await problem(await enrol(api, "gfj_guess", node_id), 401)
            refusals.add((body["type"], body["detail"]))
        assert len(refusals) == 1
        for node_id in ("edge-1", "never-seen"):
            await problem(await enrol(api, "gfj_guess", node_id), 429)


async def test_a_token_redeemable_only_by_its_redemption_still_cannot_take_a_known_id(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A use given back (another enrolment's broker failed) between the read that judges
    the token and its redemption: the node id check comes after, and gives the use back."""
    api.app[INGESTOR].handle(*_birth_payload("edge-1", _sealing_key()))
    created = await create_token(api)

    async def read_before_the_use_was_given_back(token: str) -> bool:
        return False

    monkeypatch.setattr(api.store, "join_token_is_redeemable", read_before_the_use_was_given_back)
    body = await problem(await enrol(api, created["token"], "edge-1"), 409)
    assert body["type"].endswith("/node-id-in-use")
    assert not await api.store.is_enrolled("edge-1")
    assert (await enrol(api, created["token"], "edge-2")).status == 200  # its one use kept


async def test_an_enrolled_nodes_public_key_alone_does_not_enrol_its_id_again(
    api: Api, accounts: RecordingAccounts
) -> None:
    """The sealing public key is in every birth and certificate: sent without proof that
    its holder sends it, it must not get anyone the node's broker account or envelope."""
    private = X25519PrivateKey.generate()
    key = public_key_text(private)
    first = await create_token(api, site="edge", zone="CA-ON", work="inference")
    assert (await enrol(api, first["token"], "edge-1", sealing_public_key=key)).status == 200
    other = await create_token(api, uses=3, site="cloud")
    elsewhere = await _proof(api, private, "edge-2", other["token"])  # another id's proof
    another_token = await _proof(api, private, "edge-1", first["token"])  # another token's
    for proof in (None, elsewhere, another_token):
        body = await problem(
            await enrol(
                api, other["token"], "edge-1", sealing_public_key=key, identity_proof=proof
            ),
            409,
        )
        assert body["type"].endswith("/node-already-enrolled")
    assert accounts.provisioned == ["edge-1"]
    envelope = api.app[ENROLLED_NODES].envelope("edge-1")
    assert envelope is not None
    assert (envelope.site, envelope.work) == ("edge", "inference")


async def test_a_broker_failure_leaves_the_token_unused(
    api: Api, accounts: RecordingAccounts
) -> None:
    created = await create_token(api)
    accounts.fail = True
    await problem(await enrol(api, created["token"], "edge-1"), 503)
    assert not await api.store.is_enrolled("edge-1")
    accounts.fail = False
    assert (await enrol(api, created["token"], "edge-1")).status == 200


async def test_a_node_id_naming_a_foreign_broker_account_is_a_409_and_spends_nothing(
    api: Api, accounts: RecordingAccounts
) -> None:
    created = await create_token(api)
    accounts.foreign.add("admin")
    body = await problem(await enrol(api, created["token"], "admin"), 409)
    assert body["type"].endswith("/node-id-taken")
    assert not await api.store.is_enrolled("admin")
    assert (await enrol(api, created["token"], "edge-1")).status == 200  # still one use


async def test_failed_redemptions_are_rate_limited_per_address(api: Api) -> None:
    created = await create_token(api)
    for _ in range(10):
        await problem(await enrol(api, "gfj_guess", "edge-1"), 401)
    response = await enrol(api, "gfj_guess", "edge-1")
    body = await problem(response, 429)
    assert int(response.headers["Retry-After"]) >= 1
    assert "retry in" in body["detail"]
    # A valid token from the same address is never held up by the guesses.
    assert (await enrol(api, created["token"], "edge-1")).status == 200


async def test_the_refused_token_budget_is_shared_by_every_replica(
    database: DatabaseUnderTest, accounts: RecordingAccounts
) -> None:
    """Two control planes on one store: five guesses at each use up the address's ten,
    so an eleventh at either waits (a per-process budget gave each replica ten)."""
    async with (
        enrolment_api(database, accounts) as first,
        enrolment_api(database, accounts) as second,
    ):
        for _ in range(5):
            await problem(await enrol(first, "gfj_guess", "edge-1"), 401)
            await problem(await enrol(second, "gfj_guess", "edge-1"), 401)
        await problem(await enrol(first, "gfj_guess", "edge-1"), 429)
        await problem(await enrol(second, "gfj_guess", "edge-1"), 429)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"node_id": "edge-1"}, "$.token"),
        ({"token": "t", "node_id": "no/slashes"}, "$.node_id"),
        ({"token": "t", "node_id": "edge-1\n"}, "$.node_id"),  # Python's $ matches before \n
        ({"token": "t", "node_id": "edge-1", "labels": {"k\n": "v"}}, "$.labels"),
        ({"token": "t", "node_id": "edge-1", "site": "moon"}, "$.site"),
        ({"token": "t", "node_id": "edge-1", "labels": {"k": 1}}, "$.labels"),
        ({"token": "t", "node_id": "edge-1", "extra": 1}, "$.extra"),
        ({"token": "t", "node_id": "edge-1", "sealing_public_key": "c2hvcnQ="}, "$.sealing"),
        ({"token": "t", "node_id": "edge-1", "sealing_public_key": "not base64"}, "$.sealing"),
        ({"token": "t", "node_id": "edge-1", "sealing_public_key": "A" * 65}, "$.sealing"),
    ],
)
async def test_bad_enrol_bodies_name_the_field(api: Api, body: dict[str, Any], field: str) -> None:
    problem_body = await problem(await api.client.post("/v1/nodes/enrol", json=body), 422)
    assert problem_body["invalid_params"][0]["name"].startswith(field)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"uses": 0}, "$.uses"),
        ({"ttl_s": -1}, "$.ttl_s"),
        ({"labels": {"bad key!": "v"}}, "$.labels"),
        ({"zone": ""}, "$.zone"),
    ],
)
async def test_bad_join_token_bodies_name_the_field(
    api: Api, body: dict[str, Any], field: str
) -> None:
    response = await api.client.post(
        "/v1/nodes/join-tokens", json=body, headers=bearer(api.admin_token)
    )
    problem_body = await problem(response, 422)
    assert problem_body["invalid_params"][0]["name"].startswith(field)


def _birth_payload(node_id: str, sealing_public_key: str | None = None) -> tuple[str, bytes]:
    now = time.time()
    status = NodeStatus(
        node_id=node_id,
        state="online",
        instance_id="i1",
        agent_version="0.1.0",
        site="edge",
        zone="DE",
        region="europe-west3",
        host=HostInfo(
            hostname=node_id, os="Linux", arch="x86_64", cpu_logical_cores=8, memory_total_bytes=8
        ),
        accelerators=(
            Accelerator(
                id="gpu0",
                kind="gpu",
                vendor="nvidia",
                model="T4",
                memory_bytes=16 * 1024**3,
                compute_units=40,
            ),
        ),
        telemetry_interval_s=5.0,
        started_at=now,
        sent_at=now,
        sealing_public_key=sealing_public_key,
    )
    return Topics("enroltest").node(node_id, Channel.STATUS), encode(status)


async def test_revoked_and_unenrolled_nodes_are_refused_by_ingestion(
    database: DatabaseUnderTest, accounts: RecordingAccounts
) -> None:
    async with enrolment_api(database, accounts, require_enrolment=True) as api:
        ingestor = api.app[INGESTOR]
        registry = api.app[REGISTRY]
        created = await create_token(api)
        assert (await enrol(api, created["token"], "edge-1")).status == 200
        ingestor.handle(*_birth_payload("edge-1"))
        ingestor.handle(*_birth_payload("stranger"))
        assert registry.get("edge-1") is not None
        assert registry.get("stranger") is None
        assert ingestor.stats.invalid[("status", InvalidReason.NOT_ENROLLED.value)] == 1

        response = await api.client.post("/v1/nodes/edge-1/revoke", headers=bearer(api.admin_token))
        assert response.status == 200, await response.text()
        assert (await response.json())["state"] == "revoked"
        assert accounts.revoked == ["edge-1"]
        assert registry.get("edge-1") is None
        ingestor.handle(*_birth_payload("edge-1"))
        assert registry.get("edge-1") is None
        assert ingestor.stats.invalid[("status", InvalidReason.NOT_ENROLLED.value)] == 2
        await problem(
            await api.client.post("/v1/nodes/never-seen/revoke", headers=bearer(api.admin_token)),
            404,
        )

        # Enrolled again with a new token, the node is admitted again.
        fresh = await create_token(api)
        assert (await enrol(api, fresh["token"], "edge-1")).status == 200
        ingestor.handle(*_birth_payload("edge-1"))
        assert registry.get("edge-1") is not None


async def test_a_revocation_reaches_every_replica(
    database: DatabaseUnderTest, accounts: RecordingAccounts
) -> None:
    """Two control planes on one store: a node revoked through one is refused by the
    other once it reloads the enrolled ids (a few seconds)."""
    async with (
        enrolment_api(database, accounts, require_enrolment=True) as first,
        enrolment_api(database, accounts, require_enrolment=True) as second,
    ):
        created = await create_token(first)
        assert (await enrol(first, created["token"], "edge-1")).status == 200
        await eventually(lambda: second.app[ENROLLED_NODES].admits("edge-1"), timeout_s=10)
        second.app[INGESTOR].handle(*_birth_payload("edge-1"))
        assert second.app[REGISTRY].get("edge-1") is not None
        await first.client.post("/v1/nodes/edge-1/revoke", headers=bearer(first.admin_token))
        await eventually(lambda: second.app[REGISTRY].get("edge-1") is None, timeout_s=10)
        assert not await second.app[STORE].is_enrolled("edge-1")


def _sealing_key() -> str:
    return public_key_text(X25519PrivateKey.generate())


async def test_enrolment_pins_the_nodes_sealing_key_and_births_must_announce_it(
    database: DatabaseUnderTest, accounts: RecordingAccounts
) -> None:
    async with enrolment_api(database, accounts, require_enrolment=True) as api:
        ingestor = api.app[INGESTOR]
        registry = api.app[REGISTRY]
        key, impostor = _sealing_key(), _sealing_key()
        created = await create_token(api, uses=2)
        response = await enrol(api, created["token"], "edge-1", sealing_public_key=key)
        assert response.status == 200, await response.text()
        enrolled = await (await api.get(api.admin_token, "/v1/nodes/enrolled")).json()
        (view,) = enrolled["items"]
        assert view["sealing_key_fingerprint"] == sealing_key_fingerprint(key)
        stored = await api.store.get_enrolled_node("edge-1")
        assert stored is not None
        assert stored.sealing_public_key == key

        # A birth with another key is kept, without it: the node receives no secrets.
        ingestor.handle(*_birth_payload("edge-1", impostor))
        record = registry.get("edge-1")
        assert record is not None
        assert record.status.sealing_public_key is None
        assert ingestor.stats.invalid[("status", InvalidReason.SEALING_KEY_MISMATCH.value)] == 1
        # Its enrolled key is kept.
        ingestor.handle(*_birth_payload("edge-1", key))
        record = registry.get("edge-1")
        assert record is not None
        assert record.status.sealing_public_key == key

        # A node enrolled without a key is trusted with the key its own account announces.
        assert (await enrol(api, created["token"], "edge-2")).status == 200
        ingestor.handle(*_birth_payload("edge-2", impostor))
        other = registry.get("edge-2")
        assert other is not None
        assert other.status.sealing_public_key == impostor
        enrolled = await (await api.get(api.admin_token, "/v1/nodes/enrolled")).json()
        assert [n["sealing_key_fingerprint"] for n in enrolled["items"]] == [
            sealing_key_fingerprint(key),
            None,
        ]


async def test_a_pinned_key_reaches_every_replica(
    database: DatabaseUnderTest, accounts: RecordingAccounts
) -> None:
    async with (
        enrolment_api(database, accounts, require_enrolment=True) as first,
        enrolment_api(database, accounts, require_enrolment=True) as second,
    ):
        key = _sealing_key()
        created = await create_token(first)
        response = await enrol(first, created["token"], "edge-1", sealing_public_key=key)
        assert response.status == 200
        enrolled = second.app[ENROLLED_NODES]
        await eventually(lambda: enrolled.pinned_sealing_key("edge-1") == key, timeout_s=10)
        second.app[INGESTOR].handle(*_birth_payload("edge-1", _sealing_key()))
        record = second.app[REGISTRY].get("edge-1")
        assert record is not None
        assert record.status.sealing_public_key is None
