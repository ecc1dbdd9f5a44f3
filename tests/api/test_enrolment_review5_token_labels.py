"""A join token's labels are what a node enrolled with it is fixed to (docs/rest.md),
through the real API on SQLite and PostgreSQL: its births may add labels but never
change or drop the token's; selectors (the scheduler's node) and the node view see the
token's; adding labels needs no approval; an admin's label still wins; the enrolment's
envelope and certificate carry them."""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from cloud.api.enrolment import ENROLMENT_STATE
from cloud.loop.nodes import scheduler_node
from shared.sealing import public_key_text
from tests.api.support import Api, bearer
from tests.api.test_enrolment import RecordingAccounts, create_token, enrol, enrolment_api
from tests.api.test_node_approval import announce, birth, first_claim_recorded, node_view
from tests.store.databases import DatabaseUnderTest


@pytest.fixture
async def api(database: DatabaseUnderTest) -> AsyncIterator[Api]:
    async with enrolment_api(database, RecordingAccounts(), require_enrolment=True) as running:
        yield running


async def test_a_node_cannot_change_or_drop_its_tokens_labels(api: Api) -> None:
    created = await create_token(api, labels={"pool": "quarantine"})
    response = await enrol(api, created["token"], "e1", labels={"gpu": "t4"})
    assert response.status == 200, await response.text()
    assert (await response.json())["labels"] == {"gpu": "t4", "pool": "quarantine"}
    announce(api, birth("e1", runs_training=False))
    await first_claim_recorded(api, "e1")

    lying = msgspec.structs.replace(
        birth("e1", runs_training=False, instance="i2"),
        labels={"pool": "trusted", "compliance": "pci"},
    )
    record = announce(api, lying)
    assert record.approval == "approved"  # labels are laid over, not judged
    view = await node_view(api, "e1")
    assert view["approval"] == "approved"
    assert view["labels"]["pool"] == "quarantine"
    assert view["labels"]["compliance"] == "pci"  # added: its own to say
    assert scheduler_node(record).labels["pool"] == "quarantine"  # what selectors match

    dropping = msgspec.structs.replace(birth("e1", runs_training=False, instance="i3"), labels={})
    record = announce(api, dropping)
    assert (await node_view(api, "e1"))["labels"]["pool"] == "quarantine"
    assert scheduler_node(record).labels["pool"] == "quarantine"

    enrolled = await (await api.get(api.admin_token, "/v1/nodes/enrolled")).json()
    (item,) = enrolled["items"]
    assert item["envelope"]["labels"] == {"pool": "quarantine"}


async def test_an_admins_label_wins_over_the_tokens(api: Api) -> None:
    created = await create_token(api, labels={"pool": "quarantine"})
    assert (await enrol(api, created["token"], "e1")).status == 200
    announce(api, birth("e1", runs_training=False))
    response = await api.client.patch(
        "/v1/nodes/e1", json={"labels": {"pool": "cleared"}}, headers=bearer(api.admin_token)
    )
    assert response.status == 200, await response.text()
    assert (await response.json())["labels"]["pool"] == "cleared"


async def test_a_token_without_labels_holds_none(api: Api) -> None:
    created = await create_token(api)
    assert (await enrol(api, created["token"], "e1")).status == 200
    own = msgspec.structs.replace(birth("e1", runs_training=False), labels={"pool": "mine"})
    announce(api, own)
    assert (await node_view(api, "e1"))["labels"]["pool"] == "mine"
    enrolled = await (await api.get(api.admin_token, "/v1/nodes/enrolled")).json()
    assert "labels" not in enrolled["items"][0]["envelope"]  # as envelopes were before


async def test_the_certificate_carries_the_tokens_labels(api: Api) -> None:
    """So a node re-admitted after a store loss is held to them again."""
    created = await create_token(api, labels={"pool": "quarantine"})
    key = X25519PrivateKey.generate()
    response = await enrol(api, created["token"], "e1", sealing_public_key=public_key_text(key))
    assert response.status == 200, await response.text()
    authority = api.app[ENROLMENT_STATE].authority
    assert authority is not None
    certificate = authority.read((await response.json())["enrolment_certificate"])
    assert certificate.envelope.labels == {"pool": "quarantine"}
