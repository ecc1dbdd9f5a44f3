"""Enrolment certificates and identity proofs (shared/enrolment_certificate.py,
cloud/fleet/certificates.py): a birth re-admits a node only if this control plane
certified that node id with that sealing key and the sender holds the key."""

from __future__ import annotations

import base64
from pathlib import Path

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from cloud.fleet.certificates import CertificateAuthority
from cloud.fleet.envelope import NodeEnvelope
from cloud.fleet.unenrolled import UnenrolledNodes
from edge.enrolment_proof import EnrolmentProof, load_enrolment_proof, save_certificate
from shared.enrolment_certificate import CertificateError, certificate_head
from shared.messages import NodeStatus, encode
from shared.sealing import public_key_text
from tests.cloud.test_ingest_unit import birth as plain_birth

ENVELOPE = NodeEnvelope(site="edge", zone="DE", region="europe-west3", work="inference")


def issued(authority: CertificateAuthority, node_id: str, key: X25519PrivateKey) -> str:
    return authority.issue(
        cluster_id="cluster-1",
        node_id=node_id,
        sealing_public_key=public_key_text(key),
        envelope=ENVELOPE,
        enrolled_at=1_700_000_000.0,
        join_token_id="jt-1",
        username=node_id,
    )


def birth(node_id: str, key: X25519PrivateKey, certificate: str, instance_id: str) -> NodeStatus:
    proof = EnrolmentProof(certificate, key).proof(instance_id)
    return msgspec.structs.replace(
        plain_birth(node_id),
        instance_id=instance_id,
        sealing_public_key=public_key_text(key),
        enrolment_certificate=certificate,
        identity_proof=proof,
    )


@pytest.fixture
def authority() -> CertificateAuthority:
    return CertificateAuthority(Ed25519PrivateKey.generate())


def test_a_birth_with_its_certificate_and_proof_names_what_the_node_enrolled_as(
    authority: CertificateAuthority,
) -> None:
    key = X25519PrivateKey.generate()
    certificate = issued(authority, "edge-1", key)
    found = authority.judge_birth(birth("edge-1", key, certificate, "instance-a"))
    assert found.node_id == "edge-1"
    assert found.envelope == ENVELOPE
    assert found.sealing_public_key == public_key_text(key)
    assert (found.cluster_id, found.join_token_id, found.username) == (
        "cluster-1",
        "jt-1",
        "edge-1",
    )


def test_another_control_planes_certificate_is_refused(authority: CertificateAuthority) -> None:
    key = X25519PrivateKey.generate()
    foreign = CertificateAuthority(Ed25519PrivateKey.generate())
    certificate = issued(foreign, "edge-1", key)
    with pytest.raises(CertificateError, match="not signed"):
        authority.judge_birth(birth("edge-1", key, certificate, "instance-a"))


def test_a_certificate_with_a_changed_payload_is_refused(authority: CertificateAuthority) -> None:
    key = X25519PrivateKey.generate()
    certificate = issued(authority, "edge-1", key)
    prefix, payload, signature = certificate.split(".")
    document = msgspec.json.decode(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    document["envelope"] = {"site": "cloud"}  # a bigger envelope, same signature
    forged_payload = base64.urlsafe_b64encode(msgspec.json.encode(document)).rstrip(b"=").decode()
    forged = f"{prefix}.{forged_payload}.{signature}"
    with pytest.raises(CertificateError, match="not signed"):
        authority.judge_birth(birth("edge-1", key, forged, "instance-a"))


def test_a_certificate_moved_to_another_node_id_or_key_is_refused(
    authority: CertificateAuthority,
) -> None:
    key = X25519PrivateKey.generate()
    certificate = issued(authority, "edge-1", key)
    with pytest.raises(CertificateError, match="node 'edge-1'"):
        authority.judge_birth(birth("intruder", key, certificate, "instance-a"))
    other_key = X25519PrivateKey.generate()
    with pytest.raises(CertificateError, match="another sealing key"):
        authority.judge_birth(birth("edge-1", other_key, certificate, "instance-a"))


def test_a_copied_certificate_without_the_key_proves_nothing(
    authority: CertificateAuthority,
) -> None:
    key = X25519PrivateKey.generate()
    certificate = issued(authority, "edge-1", key)
    copied = birth("edge-1", key, certificate, "instance-a")
    # Someone who read the birth off the broker: a new instance needs a new proof.
    with pytest.raises(CertificateError, match="proof"):
        authority.judge_birth(msgspec.structs.replace(copied, instance_id="instance-b"))
    # A proof made with another key, for the right certificate and instance.
    guessed = EnrolmentProof(certificate, X25519PrivateKey.generate()).proof("instance-b")
    with pytest.raises(CertificateError, match="proof"):
        authority.judge_birth(
            msgspec.structs.replace(copied, instance_id="instance-b", identity_proof=guessed)
        )
    with pytest.raises(CertificateError, match="no certificate"):
        authority.judge_birth(msgspec.structs.replace(copied, identity_proof=None))


@pytest.mark.parametrize(
    "text", ["", "gfcert1.", "gfcert1.abc", "gfcert2.a.b", "gfcert1.!!!.???", "x" * 5000]
)
def test_garbage_is_not_a_certificate(authority: CertificateAuthority, text: str) -> None:
    with pytest.raises(CertificateError):
        authority.read(text)
    with pytest.raises(CertificateError):
        certificate_head(text)


def test_unenrolled_nodes_keep_proven_births_only(authority: CertificateAuthority) -> None:
    now = [100.0]
    knocking = UnenrolledNodes(lambda: now[0], capacity=2, log_interval_s=0)
    key = X25519PrivateKey.generate()
    certificate = issued(authority, "edge-1", key)
    status = birth("edge-1", key, certificate, "instance-a")
    knocking.offer(status, encode(status))
    assert knocking.listing() == ()  # no signing key loaded yet: nothing judged
    knocking.authority = authority
    knocking.offer(status, encode(status))
    now[0] = 130.0
    knocking.offer(status, encode(status))  # the same birth again (retained, replayed)
    (node,) = knocking.listing()
    assert (node.first_seen_s, node.last_seen_s) == (100.0, 130.0)
    forged = msgspec.structs.replace(status, node_id="intruder")
    knocking.offer(forged, encode(forged))
    assert [n.status.node_id for n in knocking.listing()] == ["edge-1"]
    assert knocking.unproven == 1
    for node_id in ("edge-2", "edge-3"):  # bounded: the least recently seen makes room
        other_key = X25519PrivateKey.generate()
        other = birth(node_id, other_key, issued(authority, node_id, other_key), "i")
        knocking.offer(other, encode(other))
    assert [n.status.node_id for n in knocking.listing()] == ["edge-2", "edge-3"]
    (taken,) = knocking.admitted(["edge-2", "unknown"])
    assert taken.status.node_id == "edge-2"
    assert [n.status.node_id for n in knocking.listing()] == ["edge-3"]


def test_an_older_enrolment_of_a_knocking_node_never_displaces_a_newer_one(
    authority: CertificateAuthority,
) -> None:
    """A key the node was enrolled away from (a stolen device's, re-enrolled with a new
    key) still proves its older certificate: re-admission takes the newest enrolment."""
    knocking = UnenrolledNodes(lambda: 100.0, capacity=4, log_interval_s=0)
    knocking.authority = authority
    old_key, new_key = X25519PrivateKey.generate(), X25519PrivateKey.generate()
    old = authority.issue(
        cluster_id="cluster-1", node_id="edge-1", sealing_public_key=public_key_text(old_key),
        envelope=NodeEnvelope(site="cloud"), enrolled_at=1_700_000_000.0, join_token_id="jt-0",
        username="edge-1",
    )  # fmt: skip
    new = authority.issue(
        cluster_id="cluster-1", node_id="edge-1", sealing_public_key=public_key_text(new_key),
        envelope=ENVELOPE, enrolled_at=1_710_000_000.0, join_token_id="jt-1", username="edge-1",
    )  # fmt: skip
    current = birth("edge-1", new_key, new, "real")
    knocking.offer(current, encode(current))
    stale = birth("edge-1", old_key, old, "stolen")
    knocking.offer(stale, encode(stale))
    (node,) = knocking.listing()
    assert node.certificate.sealing_public_key == public_key_text(new_key)
    assert node.certificate.envelope == ENVELOPE
    assert knocking.unproven == 1


def test_the_agent_shows_its_certificate_only_with_its_own_key(
    authority: CertificateAuthority, tmp_path: Path
) -> None:
    key = X25519PrivateKey.generate()
    path = tmp_path / "state" / "enrolment.cert"
    assert load_enrolment_proof(path, "edge-1", key) is None  # none kept
    save_certificate(path, issued(authority, "edge-1", key))
    proof = load_enrolment_proof(path, "edge-1", key)
    assert proof is not None
    authority.judge_birth(birth("edge-1", key, proof.certificate, "instance-a"))
    # The data directory copied to another node, or the key made anew: not shown.
    assert load_enrolment_proof(path, "edge-2", key) is None
    assert load_enrolment_proof(path, "edge-1", X25519PrivateKey.generate()) is None
    path.write_text("not a certificate\n")
    assert load_enrolment_proof(path, "edge-1", key) is None
