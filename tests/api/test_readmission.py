"""Re-admission after a store lost without a backup (issue 25), through the real API on
SQLite and PostgreSQL: a node refused as not enrolled whose birth proves the enrolment
certificate this control plane issued is listed with what it enrolled as, and an admin
re-admits it (by name or all at once, audited): it is enrolled again as the certificate
says and online at once. A revoked node, a node that proves nothing and a birth copied
to another node id are never re-admitted. (The whole story, a control plane started on
an empty store with a running fleet on Mosquitto: tests/e2e/test_readmission.py.)"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from cloud.api.enrolment import ENROLMENT_STATE
from cloud.app_keys import INGESTOR, REGISTRY
from cloud.fleet.envelope import NodeEnvelope
from edge.enrolment_proof import EnrolmentProof
from shared.messages import NodeStatus, encode
from shared.sealing import public_key_text
from shared.topics import Channel, Topics
from tests.api.support import Api, bearer, problem
from tests.api.test_enrolment import RecordingAccounts, create_token, enrol, enrolment_api
from tests.api.test_node_approval import birth
from tests.store.databases import DatabaseUnderTest

ENVELOPE = NodeEnvelope(site="edge", zone="DE", region="europe-west3", work="inference")


@pytest.fixture
async def api(database: DatabaseUnderTest) -> AsyncIterator[Api]:
    async with enrolment_api(database, RecordingAccounts(), require_enrolment=True) as running:
        yield running


def lost_enrolment(api: Api, node_id: str, key: X25519PrivateKey) -> str:
    """A certificate this control plane issued before its store was lost."""
    authority = api.app[ENROLMENT_STATE].authority
    assert authority is not None  # loaded as the app started
    return authority.issue(
        cluster_id="the-lost-cluster",
        node_id=node_id,
        sealing_public_key=public_key_text(key),
        envelope=ENVELOPE,
        enrolled_at=1_700_000_000.0,
        join_token_id="jt-lost",
        username=f"node-{node_id}",
    )


def proving_birth(
    node_id: str, key: X25519PrivateKey, certificate: str, instance: str = "i1"
) -> NodeStatus:
    return msgspec.structs.replace(
        birth(node_id, key=public_key_text(key), runs_training=False, instance=instance),
        enrolment_certificate=certificate,
        identity_proof=EnrolmentProof(certificate, key).proof(instance),
    )


def knock(api: Api, status: NodeStatus) -> None:
    api.app[INGESTOR].handle(
        Topics("enroltest").node(status.node_id, Channel.STATUS), encode(status)
    )


async def unenrolled(api: Api) -> dict[str, dict[str, Any]]:
    response = await api.get(api.admin_token, "/v1/nodes/unenrolled")
    assert response.status == 200, await response.text()
    return {item["node_id"]: item for item in (await response.json())["items"]}


async def readmit(api: Api, **body: Any) -> dict[str, Any]:
    response = await api.client.post(
        "/v1/nodes/readmit", json=body, headers=bearer(api.admin_token)
    )
    assert response.status == 200, await response.text()
    result: dict[str, Any] = await response.json()
    return result


async def test_a_node_proving_a_lost_enrolment_is_re_admitted_as_it_enrolled(api: Api) -> None:
    key = X25519PrivateKey.generate()
    status = proving_birth("edge-1", key, lost_enrolment(api, "edge-1", key))
    knock(api, status)
    assert api.app[REGISTRY].get("edge-1") is None  # refused: the store does not know it
    listed = (await unenrolled(api))["edge-1"]
    assert listed["state"] == "unenrolled"
    assert listed["cluster_id"] == "the-lost-cluster"
    assert listed["envelope"] == msgspec.to_builtins(ENVELOPE)
    assert listed["instance_id"] == "i1"

    result = await readmit(api, node_ids=["edge-1", "edge-9"])
    (readmitted,) = result["readmitted"]
    assert readmitted["node_id"] == "edge-1"
    assert readmitted["username"] == "node-edge-1"  # the broker account it still has
    assert readmitted["envelope"] == msgspec.to_builtins(ENVELOPE)
    assert readmitted["join_token_id"] == "jt-lost"
    assert [(r["node_id"], r["reason"]) for r in result["refused"]] == [("edge-9", "not-knocking")]

    # Online at once (its birth ingested again), its sealing key pinned, held to its
    # envelope: a birth outside it waits for an admin's approval.
    record = api.app[REGISTRY].get("edge-1")
    assert record is not None
    assert record.state == "online"
    assert record.status.sealing_public_key == public_key_text(key)
    assert await unenrolled(api) == {}
    enrolled = await (await api.get(api.admin_token, "/v1/nodes/enrolled")).json()
    assert [n["node_id"] for n in enrolled["items"]] == ["edge-1"]
    audit = await (await api.get(api.admin_token, "/v1/audit?action=node.readmit")).json()
    assert [(e["target"], e["actor"]) for e in audit["items"]] == [("edge-1", "admin")]
    moved = msgspec.structs.replace(status, zone="FR", instance_id="i2", identity_proof=None)
    knock(api, moved)
    pending = await (await api.get(api.admin_token, "/v1/nodes/edge-1")).json()
    assert pending["approval"] == "pending-approval"

    again = await readmit(api, node_ids=["edge-1"])  # enrolled: nothing to do
    assert [(r["node_id"], r["reason"]) for r in again["refused"]] == [("edge-1", "enrolled")]


async def test_nothing_but_a_proven_certificate_of_this_control_plane_is_listed(
    api: Api,
) -> None:
    key = X25519PrivateKey.generate()
    certificate = lost_enrolment(api, "edge-1", key)
    status = proving_birth("edge-1", key, certificate)
    # Copied off the broker to another node id, or to another instance of the same node.
    knock(api, msgspec.structs.replace(status, node_id="intruder"))
    knock(api, msgspec.structs.replace(status, instance_id="i2"))
    # A birth that shows nothing; one whose proof is another key's.
    knock(api, birth("edge-2", key=public_key_text(key)))
    stranger = X25519PrivateKey.generate()
    knock(
        api,
        msgspec.structs.replace(
            status, identity_proof=EnrolmentProof(certificate, stranger).proof("i1")
        ),
    )
    assert await unenrolled(api) == {}
    assert api.app[ENROLMENT_STATE].unenrolled.unproven == 3
    result = await readmit(api, all=True)
    assert result == {"readmitted": [], "refused": []}
    assert api.app[REGISTRY].nodes() == []


async def test_a_revoked_node_stays_revoked_whatever_it_proves(api: Api) -> None:
    token = (await create_token(api, uses=1))["token"]
    key = X25519PrivateKey.generate()
    response = await enrol(api, token, "edge-1", sealing_public_key=public_key_text(key))
    assert response.status == 200, await response.text()
    certificate = (await response.json())["enrolment_certificate"]
    knock(api, proving_birth("edge-1", key, certificate))
    assert api.app[REGISTRY].get("edge-1") is not None  # enrolled: admitted as usual
    response = await api.client.post("/v1/nodes/edge-1/revoke", headers=bearer(api.admin_token))
    assert response.status == 200, await response.text()

    knock(api, proving_birth("edge-1", key, certificate, instance="i2"))
    other = X25519PrivateKey.generate()
    knock(api, proving_birth("edge-2", other, lost_enrolment(api, "edge-2", other)))
    listed = await unenrolled(api)
    assert {n: item["state"] for n, item in listed.items()} == {
        "edge-1": "revoked",
        "edge-2": "unenrolled",
    }
    everyone = await readmit(api, all=True)  # every unenrolled node: not the revoked one
    assert [n["node_id"] for n in everyone["readmitted"]] == ["edge-2"]
    named = await readmit(api, node_ids=["edge-1"])
    assert named["readmitted"] == []
    assert [(r["node_id"], r["reason"]) for r in named["refused"]] == [("edge-1", "revoked")]
    assert api.app[REGISTRY].get("edge-1") is None


async def test_the_enrolment_reply_carries_a_certificate_of_what_the_node_enrolled_as(
    api: Api,
) -> None:
    token = (await create_token(api, uses=2, site="edge", zone="DE", work="inference"))["token"]
    key = X25519PrivateKey.generate()
    response = await enrol(api, token, "edge-1", sealing_public_key=public_key_text(key))
    assert response.status == 200, await response.text()
    body = await response.json()
    authority = api.app[ENROLMENT_STATE].authority
    assert authority is not None
    certificate = authority.read(body["enrolment_certificate"])
    assert certificate.node_id == "edge-1"
    assert certificate.cluster_id == body["cluster_id"]
    assert certificate.sealing_public_key == public_key_text(key)
    assert certificate.envelope.site == "edge"
    assert certificate.envelope.work == "inference"
    assert certificate.username == "node-edge-1"
    # Without a sealing key there is nothing to prove it with: no certificate.
    response = await enrol(api, token, "edge-2")
    assert (await response.json())["enrolment_certificate"] is None


@pytest.mark.parametrize(
    ("body", "field"),
    [({}, "node_ids"), ({"node_ids": ["a"], "all": True}, "all"), ({"node_ids": ["a/b"]}, "")],
)
async def test_a_readmit_body_names_what_is_wrong(
    api: Api, body: dict[str, Any], field: str
) -> None:
    response = await api.client.post(
        "/v1/nodes/readmit", json=body, headers=bearer(api.admin_token)
    )
    found = await problem(response, 422)
    assert found["invalid_params"][0]["name"].startswith(f"$.{field}")


async def test_only_an_admin_lists_and_readmits(api: Api) -> None:
    tenant = await api.tenant("acme")
    for method, path in (("GET", "/v1/nodes/unenrolled"), ("POST", "/v1/nodes/readmit")):
        await problem(await api.client.request(method, path, json={"all": True}), 401)
        await problem(
            await api.client.request(method, path, json={"all": True}, headers=bearer(tenant)),
            403,
        )
