"""What a node is approved as belongs to the device that earned it, on SQLite and
PostgreSQL: revoking a node id, or enrolling a new device under it, leaves nothing
approved (an admin's approval, trusted figures, a first claim), so the new device is
held to its own join token; the same node enrolling again with its proven key keeps an
admin's approval, and its first claim is recorded anew against its new envelope."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from cloud.app_keys import REGISTRY
from cloud.fleet.envelope import NodeClaim
from shared.enrolment_certificate import enrolment_proof
from shared.sealing import load_public_key, public_key_text
from tests.api.support import Api, bearer, problem
from tests.api.test_enrolment import RecordingAccounts, create_token, enrol, enrolment_api
from tests.api.test_node_approval import announce, approve, birth, first_claim_recorded, gpu
from tests.store.databases import DatabaseUnderTest
from tests.support.waiting import eventually


@pytest.fixture
def accounts() -> RecordingAccounts:
    return RecordingAccounts()


@pytest.fixture
async def api(database: DatabaseUnderTest, accounts: RecordingAccounts) -> AsyncIterator[Api]:
    async with enrolment_api(database, accounts, require_enrolment=True) as running:
        yield running


async def _revoke(api: Api, node_id: str) -> None:
    response = await api.client.post(f"/v1/nodes/{node_id}/revoke", headers=bearer(api.admin_token))
    assert response.status == 200, await response.text()


async def _proof(api: Api, key: X25519PrivateKey, node_id: str, token: str) -> str:
    answer = await api.client.get("/v1/nodes/enrol")
    exchange_key = load_public_key((await answer.json())["exchange_key"])
    return enrolment_proof(key, exchange_key, node_id=node_id, join_token=token)


async def _stored_approval(api: Api, node_id: str) -> tuple[NodeClaim | None, bool]:
    record = (await api.store.node_admin()).get(node_id)
    return (None, False) if record is None else (record.approved, record.trust_figures)


async def test_a_new_device_under_a_revoked_id_is_held_to_its_own_token(api: Api) -> None:
    """The review's case: the old device (8 GPUs, cloud, training) approved by an admin
    with its own figures, then revoked (stolen); a new device enrolled under its id with
    a strict token (edge, inference, one GPU) announces what the old one was approved as."""
    old_key = public_key_text(X25519PrivateKey.generate())
    anything = await create_token(api, site="cloud")
    response = await enrol(api, anything["token"], "n1", sealing_public_key=old_key)
    assert response.status == 200, await response.text()
    eight_gpus = tuple(gpu(index) for index in range(8))
    announce(api, birth("n1", site="cloud", gpus=eight_gpus, key=old_key))
    await first_claim_recorded(api, "n1")
    approved = await approve(api, "n1", trust_figures=True)
    assert approved.status == 200, await approved.text()
    await _revoke(api, "n1")
    assert await _stored_approval(api, "n1") == (None, False)  # in the revocation's transaction

    new_key = public_key_text(X25519PrivateKey.generate())
    strict = await create_token(api, site="edge", work="inference", max_accelerators={"gpu": 1})
    response = await enrol(api, strict["token"], "n1", sealing_public_key=new_key)
    assert response.status == 200, await response.text()
    record = announce(api, birth("n1", site="cloud", gpus=eight_gpus, key=new_key, instance="i9"))
    assert record.approval == "pending-approval"
    assert "site 'cloud'; enrolled as 'edge'" in record.awaiting_approval
    assert "runs training; enrolled for inference only" in record.awaiting_approval
    assert "8 gpu accelerators; at most 1" in record.awaiting_approval
    assert record.admin is None or not record.admin.trust_figures
    view = await (await api.get(api.admin_token, "/v1/nodes/n1")).json()
    assert (view["approval"], view["receives_secrets"]) == ("pending-approval", False)


async def test_a_new_device_under_a_revoked_id_gets_a_first_claim_of_its_own(api: Api) -> None:
    """No admin involved: the old device's first claim (zone DE) must not hold the new
    one, enrolled in zone FR by its token."""
    first = await create_token(api, site="edge", zone="DE")
    assert (await enrol(api, first["token"], "n1")).status == 200
    announce(api, birth("n1", zone="DE", gpus=(gpu(0),)))
    await first_claim_recorded(api, "n1")
    await _revoke(api, "n1")

    moved = await create_token(api, site="edge", zone="FR")
    assert (await enrol(api, moved["token"], "n1")).status == 200
    record = announce(api, birth("n1", zone="FR", gpus=(gpu(0),), instance="i2"))
    assert record.approval == "approved", record.awaiting_approval
    await first_claim_recorded(api, "n1")
    claim, _ = await _stored_approval(api, "n1")
    assert claim is not None
    assert claim.zone == "FR"


async def test_the_same_node_enrolling_again_keeps_an_admins_approval_and_claims_anew(
    api: Api,
) -> None:
    """A proven re-enrolment (rotating credentials) with a token that moves the node: the
    first claim of the old zone must not put it in pending-approval; an admin's approval
    and trusted figures of the same device stay."""
    private = X25519PrivateKey.generate()
    key = public_key_text(private)
    first = await create_token(api, site="edge", zone="DE")
    assert (await enrol(api, first["token"], "n1", sealing_public_key=key)).status == 200
    announce(api, birth("n1", zone="DE", gpus=(gpu(0),), key=key))
    await first_claim_recorded(api, "n1")

    moved = await create_token(api, site="edge", zone="FR")
    proof = await _proof(api, private, "n1", moved["token"])
    response = await enrol(api, moved["token"], "n1", sealing_public_key=key, identity_proof=proof)
    assert response.status == 200, await response.text()
    record = announce(api, birth("n1", zone="FR", gpus=(gpu(0),), key=key, instance="i2"))
    assert record.approval == "approved", record.awaiting_approval

    def claimed_in_fr() -> bool:
        admin = api.app[REGISTRY].admin.get("n1")
        return admin is not None and admin.approved is not None and admin.approved.zone == "FR"

    await eventually(claimed_in_fr, timeout_s=15)

    # An admin approves two GPUs with the node's own figures; it enrols again, proven.
    record = announce(api, birth("n1", zone="FR", gpus=(gpu(0), gpu(1)), key=key, instance="i3"))
    assert record.approval == "pending-approval"
    assert (await approve(api, "n1", trust_figures=True)).status == 200
    again = await create_token(api, site="edge", zone="FR")
    proof = await _proof(api, private, "n1", again["token"])
    response = await enrol(api, again["token"], "n1", sealing_public_key=key, identity_proof=proof)
    assert response.status == 200, await response.text()
    claim, trust_figures = await _stored_approval(api, "n1")
    assert claim is not None
    assert claim.by_admin
    assert trust_figures
    record = announce(api, birth("n1", zone="FR", gpus=(gpu(0), gpu(1)), key=key, instance="i4"))
    assert record.approval == "approved", record.awaiting_approval


async def test_a_failed_re_enrolment_gives_the_first_claim_back(
    api: Api, accounts: RecordingAccounts
) -> None:
    """The broker refuses the account: the redemption is undone, its claim with it."""
    private = X25519PrivateKey.generate()
    key = public_key_text(private)
    first = await create_token(api, site="edge")
    assert (await enrol(api, first["token"], "n1", sealing_public_key=key)).status == 200
    announce(api, birth("n1", gpus=(gpu(0),), key=key))
    await first_claim_recorded(api, "n1")
    before = await _stored_approval(api, "n1")

    again = await create_token(api, site="edge")
    proof = await _proof(api, private, "n1", again["token"])
    accounts.fail = True
    await problem(
        await enrol(api, again["token"], "n1", sealing_public_key=key, identity_proof=proof),
        503,
    )
    assert await _stored_approval(api, "n1") == before
