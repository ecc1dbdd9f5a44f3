"""What the control plane certifies a node enrolled as, and how it checks a birth that
shows such a certificate (the format and the proof: shared/enrolment_certificate.py).

`CertificateAuthority` issues one certificate per enrolment (cloud/api/enrolment.py)
and judges the births of nodes its store does not know (cloud/fleet/unenrolled.py):
a birth is taken as the enrolled node's only if its certificate is signed by this
control plane's signing key, names the birth's node id and sealing key, and its
identity proof holds for the birth's agent instance.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import msgspec

from cloud.fleet.envelope import NodeEnvelope
from shared.desired_signature import public_key_base64
from shared.enrolment_certificate import (
    CertificateError,
    enrolment_proof_holds,
    exchange_private_key,
    proof_holds,
    sign_certificate,
    verified_payload,
)
from shared.messages import NodeId, NodeStatus
from shared.sealing import SealingKeyError, load_public_key, public_key_text

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

CERTIFICATE_VERSION: Final = 1


class NodeCertificate(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a node enrolled as, signed (shared/enrolment_certificate.py)."""

    version: int = CERTIFICATE_VERSION
    cluster_id: str
    node_id: NodeId
    sealing_public_key: str
    exchange_key: str  # the control plane's X25519 public key, for the identity proof
    envelope: NodeEnvelope
    enrolled_at: float
    join_token_id: str | None
    username: str | None


_ENCODER: Final = msgspec.json.Encoder()
_DECODER: Final = msgspec.json.Decoder(NodeCertificate)


class CertificateAuthority:
    """Issues certificates with the signing key; checks births against them."""

    def __init__(self, signing_key: Ed25519PrivateKey) -> None:
        self._signing_key = signing_key
        self._public_key = signing_key.public_key()
        self._exchange_key = exchange_private_key(signing_key)
        self.exchange_key = public_key_text(self._exchange_key)
        # What agents verify `desired` documents with (base64 of the raw public key).
        self.public_key_text = public_key_base64(signing_key)

    def issue(
        self,
        *,
        cluster_id: str,
        node_id: str,
        sealing_public_key: str,
        envelope: NodeEnvelope,
        enrolled_at: float,
        join_token_id: str | None,
        username: str | None,
    ) -> str:
        certificate = NodeCertificate(
            cluster_id=cluster_id,
            node_id=node_id,
            sealing_public_key=sealing_public_key,
            exchange_key=self.exchange_key,
            envelope=envelope,
            enrolled_at=enrolled_at,
            join_token_id=join_token_id,
            username=username,
        )
        return sign_certificate(_ENCODER.encode(certificate), self._signing_key)

    def proves_key(
        self, proof: str, sealing_public_key: str, *, node_id: str, join_token: str
    ) -> bool:
        """Whether an enrolment's `identity_proof` shows it comes from the holder of
        `sealing_public_key` (shared/enrolment_certificate.py `enrolment_proof`)."""
        try:
            key = load_public_key(sealing_public_key)
        except SealingKeyError:
            return False
        return enrolment_proof_holds(
            proof, self._exchange_key, key, node_id=node_id, join_token=join_token
        )

    def read(self, text: str) -> NodeCertificate:
        """The certificate, once its signature is this control plane's; raises
        CertificateError."""
        payload = verified_payload(text, self._public_key)
        try:
            certificate = _DECODER.decode(payload)
        except msgspec.DecodeError as error:  # signed by us, yet unreadable: a newer release
            raise CertificateError(f"unreadable payload: {error}") from None
        if certificate.version != CERTIFICATE_VERSION:
            raise CertificateError(f"certificate version {certificate.version} is not known")
        return certificate

    def judge_birth(self, status: NodeStatus) -> NodeCertificate:
        """The certificate a birth shows, if the birth proves the identity it names;
        raises CertificateError saying why not."""
        text = status.enrolment_certificate
        if text is None or status.identity_proof is None:
            raise CertificateError("the birth shows no certificate and proof")
        certificate = self.read(text)
        if certificate.node_id != status.node_id:
            raise CertificateError(f"the certificate names node {certificate.node_id!r}")
        if certificate.sealing_public_key != status.sealing_public_key:
            raise CertificateError("the birth announces another sealing key")
        try:
            sealing_key = load_public_key(certificate.sealing_public_key)
        except SealingKeyError as error:
            raise CertificateError(str(error)) from None
        if not proof_holds(
            status.identity_proof,
            self._exchange_key,
            sealing_key,
            node_id=status.node_id,
            instance_id=status.instance_id,
            certificate=text,
        ):
            raise CertificateError("the identity proof does not hold")
        return certificate
