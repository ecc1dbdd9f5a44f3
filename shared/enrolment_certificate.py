"""Enrolment certificates and identity proofs: how a node shows who it enrolled as to a
control plane that lost its store (issue 25, docs/operations.md "Without a backup").

At enrolment the control plane signs what it enrolled the node as (its node id, the
sealing public key it enrolled with, what it may be, when, with which join token;
cloud/fleet/certificates.py) with the Ed25519 key it signs `desired` documents with
(`cloud.signing_key_file`, a file beside the store, not in it). The agent keeps that
certificate (`<data_dir>/state/enrolment.cert`) and repeats it in every birth
(`NodeStatus.enrolment_certificate`, 1.10) with an **identity proof**: an HMAC keyed by
the X25519 agreement between the node's sealing key and the control plane's exchange
key, over the node id, the agent instance and the certificate. The certificate says
"this control plane enrolled this id with this key"; the proof says "the sender of this
birth holds that key". A birth copied off the broker proves only its own instance; a
certificate moved to another node id or key does not verify.

The exchange key is derived from the signing key (HKDF), so no second key file is
kept; its public half is inside the certificate, where the agent reads it.

Wire format, for anyone who writes an agent (docs/mqtt.md says the same):

    certificate = "gfcert1." base64url(payload) "." base64url(signature)
    signature   = Ed25519(signing key, CERTIFICATE_CONTEXT || payload)
    payload     = JSON object; members read by agents: node_id, sealing_public_key,
                  exchange_key (base64 of 32 raw X25519 bytes)
    proof       = base64(HMAC-SHA256(K, PROOF_CONTEXT || node_id 0x00 instance_id 0x00
                                        SHA-256(certificate text)))
    K           = HKDF-SHA256(X25519(node sealing key, exchange_key), info=PROOF_KEY_INFO)

base64url is without padding; `proof` is standard base64, padded (44 characters).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import TYPE_CHECKING, Final

import msgspec

from shared.base64url import b64url, unb64url

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )
    from cryptography.hazmat.primitives.asymmetric.x25519 import (
        X25519PrivateKey,
        X25519PublicKey,
    )

CERTIFICATE_PREFIX: Final = "gfcert1."
CERTIFICATE_CONTEXT: Final = b"greenfed/v1 enrolment certificate\x00"
PROOF_CONTEXT: Final = b"greenfed/v1 identity proof\x00"
PROOF_KEY_INFO: Final = b"greenfed/v1 identity proof key"
_EXCHANGE_KEY_INFO: Final = b"greenfed/v1 control plane exchange key"
# A certificate is a few hundred bytes; this bounds what a birth can make us parse.
MAX_CERTIFICATE_CHARS: Final = 4096
PROOF_CHARS: Final = 44  # base64 of 32 bytes, padded


class CertificateError(ValueError):
    """A certificate that is not one, or not signed by the key we trust."""


class CertificateHead(msgspec.Struct, frozen=True, kw_only=True):
    """What an agent reads of its certificate (the control plane reads all of it)."""

    node_id: str
    sealing_public_key: str
    exchange_key: str


_HEAD_DECODER: Final = msgspec.json.Decoder(CertificateHead)


def _unb64url(text: str) -> bytes:
    try:
        return unb64url(text)
    except ValueError:  # binascii.Error included
        raise CertificateError("not base64url") from None


def sign_certificate(payload: bytes, signing_key: Ed25519PrivateKey) -> str:
    """The certificate text of `payload` (JSON bytes)."""
    signature = signing_key.sign(CERTIFICATE_CONTEXT + payload)
    return f"{CERTIFICATE_PREFIX}{b64url(payload)}.{b64url(signature)}"


def certificate_payload(text: str) -> bytes:
    """The payload bytes of a certificate, unverified (what an agent reads of its own)."""
    if len(text) > MAX_CERTIFICATE_CHARS:
        raise CertificateError(f"longer than {MAX_CERTIFICATE_CHARS} characters")
    if not text.startswith(CERTIFICATE_PREFIX):
        raise CertificateError(f"does not start with {CERTIFICATE_PREFIX!r}")
    payload, dot, _ = text[len(CERTIFICATE_PREFIX) :].partition(".")
    if not dot:
        raise CertificateError("has no signature")
    return _unb64url(payload)


def verified_payload(text: str, public_key: Ed25519PublicKey) -> bytes:
    """The payload of a certificate signed by `public_key`; raises CertificateError."""
    from cryptography.exceptions import InvalidSignature

    payload = certificate_payload(text)
    signature = _unb64url(text.rpartition(".")[2])
    try:
        public_key.verify(signature, CERTIFICATE_CONTEXT + payload)
    except InvalidSignature:
        raise CertificateError("not signed by this control plane's key") from None
    return payload


def certificate_head(text: str) -> CertificateHead:
    """The node id, sealing key and exchange key a certificate names, unverified."""
    try:
        return _HEAD_DECODER.decode(certificate_payload(text))
    except msgspec.DecodeError as error:
        raise CertificateError(f"unreadable payload: {error}") from None


def exchange_private_key(signing_key: Ed25519PrivateKey) -> X25519PrivateKey:
    """The control plane's X25519 key, derived from its signing key (no file of its own)."""
    return derived_x25519_key(signing_key, _EXCHANGE_KEY_INFO)


def derived_x25519_key(signing_key: Ed25519PrivateKey, purpose: bytes) -> X25519PrivateKey:
    """An X25519 key of the control plane's for one `purpose`, derived (HKDF-SHA256) from
    its signing key: every replica has it, and no file of its own is kept."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        NoEncryption,
        PrivateFormat,
    )

    seed = signing_key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    derived = HKDF(hashes.SHA256(), 32, salt=None, info=purpose).derive(seed)
    return X25519PrivateKey.from_private_bytes(derived)


def _proof(shared_secret: bytes, node_id: str, instance_id: str, certificate: str) -> str:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    key = HKDF(hashes.SHA256(), 32, salt=None, info=PROOF_KEY_INFO).derive(shared_secret)
    message = (
        PROOF_CONTEXT
        + f"{node_id}\x00{instance_id}\x00".encode()
        + hashlib.sha256(certificate.encode()).digest()
    )
    return base64.b64encode(hmac.new(key, message, hashlib.sha256).digest()).decode("ascii")


def identity_proof(
    sealing_key: X25519PrivateKey,
    exchange_key: X25519PublicKey,
    *,
    instance_id: str,
    certificate: str,
) -> str:
    """What a node's birth carries to prove it holds the key its certificate names."""
    head = certificate_head(certificate)
    shared_secret = sealing_key.exchange(exchange_key)
    return _proof(shared_secret, head.node_id, instance_id, certificate)


def proof_holds(
    proof: str,
    exchange_key: X25519PrivateKey,
    sealing_public_key: X25519PublicKey,
    *,
    node_id: str,
    instance_id: str,
    certificate: str,
) -> bool:
    """Whether `proof` was made with the private half of `sealing_public_key` for this
    node, instance and certificate (compared in constant time)."""
    try:
        shared_secret = exchange_key.exchange(sealing_public_key)
    except ValueError:  # a low-order point: no key anyone holds
        return False
    expected = _proof(shared_secret, node_id, instance_id, certificate)
    return hmac.compare_digest(expected.encode(), proof.encode("ascii", "replace"))


def _enrolment_instance(join_token: str) -> str:
    """What an enrolment's proof is bound to in place of an agent instance: the join
    token it comes with (its hash), so that a proof seen once enrols with no other."""
    return "enrol:" + hashlib.sha256(join_token.encode()).hexdigest()


def enrolment_proof(
    sealing_key: X25519PrivateKey, exchange_key: X25519PublicKey, *, node_id: str, join_token: str
) -> str:
    """What a node sends to enrol again under its id (`POST /v1/nodes/enrol`,
    `identity_proof`): that it holds the sealing key the id was enrolled with, which is
    public (every birth announces it) and so proves nothing by itself. Keyed as a birth's
    proof is, over the node id and the join token, with no certificate."""
    shared_secret = sealing_key.exchange(exchange_key)
    return _proof(shared_secret, node_id, _enrolment_instance(join_token), "")


def enrolment_proof_holds(
    proof: str,
    exchange_key: X25519PrivateKey,
    sealing_public_key: X25519PublicKey,
    *,
    node_id: str,
    join_token: str,
) -> bool:
    """Whether `proof` was made for this node id and join token with the private half of
    `sealing_public_key` (`enrolment_proof`)."""
    return proof_holds(
        proof,
        exchange_key,
        sealing_public_key,
        node_id=node_id,
        instance_id=_enrolment_instance(join_token),
        certificate="",
    )
