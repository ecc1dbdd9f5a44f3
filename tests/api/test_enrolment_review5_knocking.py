"""A node knocking after a store loss (refused as not enrolled, proving a certificate of
this control plane) through the real API on SQLite and PostgreSQL: an admin can revoke
it, as docs/operations.md tells them to, and `readmit --all` then leaves it out; and a
join token cannot take its id (resetting its broker password) unless the enrolling node
proves the certificate's sealing key."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from cloud.app_keys import ENROLLED_NODES, REGISTRY
from shared.enrolment_certificate import enrolment_proof
from shared.sealing import load_public_key, public_key_text
from tests.api.support import Api, bearer, problem
from tests.api.test_enrolment import RecordingAccounts, create_token, enrol, enrolment_api
from tests.api.test_readmission import knock, lost_enrolment, proving_birth, readmit, unenrolled
from tests.store.databases import DatabaseUnderTest


@pytest.fixture
def accounts() -> RecordingAccounts:
    return RecordingAccounts()


@pytest.fixture
async def api(database: DatabaseUnderTest, accounts: RecordingAccounts) -> AsyncIterator[Api]:
    async with enrolment_api(database, accounts, require_enrolment=True) as running:
        yield running


async def _proof(api: Api, key: X25519PrivateKey, node_id: str, token: str) -> str:
    answer = await api.client.get("/v1/nodes/enrol")
    exchange_key = load_public_key((await answer.json())["exchange_key"])
    return enrolment_proof(key, exchange_key, node_id=node_id, join_token=token)


async def test_a_knocking_node_is_revoked_and_readmit_all_leaves_it_out(
    api: Api, accounts: RecordingAccounts
) -> None:
    stolen, honest = X25519PrivateKey.generate(), X25519PrivateKey.generate()
    knock(api, proving_birth("stolen-1", stolen, lost_enrolment(api, "stolen-1", stolen)))
    knock(api, proving_birth("edge-1", honest, lost_enrolment(api, "edge-1", honest)))
    assert set(await unenrolled(api)) == {"stolen-1", "edge-1"}

    response = await api.client.post("/v1/nodes/stolen-1/revoke", headers=bearer(api.admin_token))
    assert response.status == 200, await response.text()
    assert (await response.json())["state"] == "revoked"
    assert accounts.revoked == ["stolen-1"]  # its broker account disabled too
    assert (await unenrolled(api))["stolen-1"]["state"] == "revoked"

    everyone = await readmit(api, all=True)
    assert [node["node_id"] for node in everyone["readmitted"]] == ["edge-1"]
    named = await readmit(api, node_ids=["stolen-1"])
    assert [(r["node_id"], r["reason"]) for r in named["refused"]] == [("stolen-1", "revoked")]
    assert api.app[REGISTRY].get("stolen-1") is None
    stored = await api.store.get_enrolled_node("stolen-1")
    assert stored is not None
    assert not stored.active
    # An id neither enrolled, live nor knocking is still unknown.
    await problem(
        await api.client.post("/v1/nodes/never-seen/revoke", headers=bearer(api.admin_token)),
        404,
    )


async def test_a_join_token_cannot_take_the_id_of_a_knocking_node(
    api: Api, accounts: RecordingAccounts
) -> None:
    real = X25519PrivateKey.generate()
    certificate = lost_enrolment(api, "edge-1", real)
    knock(api, proving_birth("edge-1", real, certificate))
    created = await create_token(api, uses=3)
    other = X25519PrivateKey.generate()
    forged = await _proof(api, other, "edge-1", created["token"])
    real_key = public_key_text(real)
    for key, proof in (
        (None, None),
        (public_key_text(other), None),
        (public_key_text(other), forged),
        (real_key, None),  # the certificate's key, public, without its proof
        (real_key, forged),
    ):
        body = await problem(
            await enrol(
                api, created["token"], "edge-1", sealing_public_key=key, identity_proof=proof
            ),
            409,
        )
        assert body["type"].endswith("/node-id-in-use")
    assert accounts.provisioned == []  # its broker account (and password) untouched
    assert not await api.store.is_enrolled("edge-1")
    joined = await (await api.get(api.admin_token, "/v1/nodes/join-tokens")).json()
    assert [token["uses"] for token in joined["items"]] == [0]

    result = await readmit(api, node_ids=["edge-1"])
    assert [node["node_id"] for node in result["readmitted"]] == ["edge-1"]
    assert api.app[REGISTRY].get("edge-1") is not None


async def test_the_knocking_node_itself_enrols_with_its_proven_key(
    api: Api, accounts: RecordingAccounts
) -> None:
    real = X25519PrivateKey.generate()
    knock(api, proving_birth("edge-1", real, lost_enrolment(api, "edge-1", real)))
    created = await create_token(api)
    proof = await _proof(api, real, "edge-1", created["token"])
    response = await enrol(
        api,
        created["token"],
        "edge-1",
        sealing_public_key=public_key_text(real),
        identity_proof=proof,
    )
    assert response.status == 200, await response.text()
    assert accounts.provisioned == ["edge-1"]
    assert api.app[ENROLLED_NODES].admits("edge-1")


async def test_a_revoked_knocking_id_is_free_for_a_new_device(api: Api) -> None:
    """Revoked (stolen), the old device still knocking: a join token enrols a new one."""
    stolen = X25519PrivateKey.generate()
    knock(api, proving_birth("edge-1", stolen, lost_enrolment(api, "edge-1", stolen)))
    response = await api.client.post("/v1/nodes/edge-1/revoke", headers=bearer(api.admin_token))
    assert response.status == 200, await response.text()
    created = await create_token(api)
    response = await enrol(
        api,
        created["token"],
        "edge-1",
        sealing_public_key=public_key_text(X25519PrivateKey.generate()),
    )
    assert response.status == 200, await response.text()
