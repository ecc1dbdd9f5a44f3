"""Sealed secrets: a job's secrets as only the one node that runs it can read them.

A node holds an X25519 key pair (made at enrolment, edge/sealing_key.py) and announces
the public half in its birth (`NodeStatus.sealing_public_key`) and at enrolment. The
control plane seals each worker's secrets (its `secret_env` and registry credentials)
to that key with HPKE (RFC 9180, base mode: DHKEM(X25519, HKDF-SHA256), HKDF-SHA256,
ChaCha20-Poly1305) and puts the result in the worker's `DesiredTraining.sealed_secrets`:

    hpke1.<base64 of the HPKE encapsulated key and ciphertext>

HPKE's `info` binds the ciphertext to where it belongs (the node, the job, the
attempt), so a sealed value copied into another job's, attempt's or node's document
does not open. A reader of the broker, the retained `desired` documents or another
node sees only ciphertext; the node opens it in its launcher, just before the worker
starts (edge/training/reconcile.py).

cryptography is imported when a key is used: an agent that never receives a secret
never loads it.
"""

from __future__ import annotations

import base64
import binascii
from typing import TYPE_CHECKING, Annotated, Final

import msgspec

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.x25519 import (
        X25519PrivateKey,
        X25519PublicKey,
    )
    from cryptography.hazmat.primitives.hpke import Suite

SEALED_PREFIX: Final = "hpke1."
_INFO_PREFIX: Final = b"greenfed/v1 sealed secrets\x00"
PUBLIC_KEY_BYTES: Final = 32
# Sealed values are bounded like the specs they come from (secret_env: 256 values of at
# most 64 KiB): a document cannot make a node decrypt gigabytes.
MAX_SEALED_CHARS: Final = 24 * 1024 * 1024


class SealingKeyError(ValueError):
    """A public key that is not base64 of 32 raw X25519 bytes."""


class SealedSecretsError(ValueError):
    """Sealed secrets that do not open with this node's key for this worker."""


class RegistryCredentials(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What pulls a worker's image from a private registry."""

    registry: Annotated[str, msgspec.Meta(description="Host[:port], e.g. ghcr.io.")]
    username: str
    password: str


class SealedSecrets(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The plaintext inside a worker's `sealed_secrets`."""

    env: dict[str, str] = {}
    registry: RegistryCredentials | None = None


_ENCODER: Final = msgspec.json.Encoder()
_DECODER: Final = msgspec.json.Decoder(SealedSecrets)


def _suite() -> Suite:
    from cryptography.hazmat.primitives.hpke import AEAD, KDF, KEM, Suite

    return Suite(KEM.X25519, KDF.HKDF_SHA256, AEAD.CHACHA20_POLY1305)


def _info(node_id: str, job_id: str, attempt: int) -> bytes:
    return _INFO_PREFIX + f"{node_id}\x00{job_id}\x00{attempt}".encode()


def public_key_text(key: X25519PrivateKey) -> str:
    """Base64 (standard, padded) of the 32 raw bytes of `key`'s public half."""
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    raw = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return base64.b64encode(raw).decode("ascii")


def load_public_key(text: str) -> X25519PublicKey:
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise SealingKeyError("sealing public key is not base64") from None
    if len(raw) != PUBLIC_KEY_BYTES:
        raise SealingKeyError(f"sealing public key has {len(raw)} bytes, not {PUBLIC_KEY_BYTES}")
    return X25519PublicKey.from_public_bytes(raw)


def is_valid_public_key(text: str) -> bool:
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return False
    return len(raw) == PUBLIC_KEY_BYTES


def seal(
    secrets: SealedSecrets, public_key: str, *, node_id: str, job_id: str, attempt: int
) -> str:
    """`secrets` sealed to the node key `public_key` (base64) for that worker only.
    Raises SealingKeyError for a key that is not one."""
    suite = _suite()
    sealed = suite.encrypt(
        _ENCODER.encode(secrets), load_public_key(public_key), info=_info(node_id, job_id, attempt)
    )
    return SEALED_PREFIX + base64.b64encode(sealed).decode("ascii")


def open_sealed(
    sealed: str, private_key: X25519PrivateKey, *, node_id: str, job_id: str, attempt: int
) -> SealedSecrets:
    """What `seal` sealed for exactly this node, job and attempt."""
    from cryptography.exceptions import InvalidTag

    if not sealed.startswith(SEALED_PREFIX) or len(sealed) > MAX_SEALED_CHARS:
        raise SealedSecretsError("not sealed secrets of a known version")
    try:
        data = base64.b64decode(sealed[len(SEALED_PREFIX) :], validate=True)
    except (binascii.Error, ValueError):
        raise SealedSecretsError("sealed secrets are not base64") from None
    try:
        plaintext = _suite().decrypt(data, private_key, info=_info(node_id, job_id, attempt))
    except (InvalidTag, ValueError):
        raise SealedSecretsError(
            "sealed secrets do not open with this node's key for this job and attempt "
            "(sealed to another node, or the node's key changed since it enrolled)"
        ) from None
    try:
        return _DECODER.decode(plaintext)
    except msgspec.DecodeError as error:
        raise SealedSecretsError(f"sealed secrets are malformed: {error}") from None
