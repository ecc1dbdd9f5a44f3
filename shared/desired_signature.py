"""Signed `desired` documents (schema 1.3): the control plane signs, agents verify.

The signing rule, for anyone who writes an agent (docs/mqtt.md says the same):

1. The publisher encodes the document with `"signature": null`. `signature` is the
   document's last member, so those bytes end with `,"signature":null}`.
2. It signs exactly those bytes with its Ed25519 key and replaces the final `null`
   with the base64 (standard alphabet, padded) of the 64-byte signature in quotes:
   the published payload ends with `,"signature":"<88 characters>"}`.
3. A verifier undoes the splice on the raw payload it received (never on a document
   it decoded and encoded again: it need not know every field, nor encode them as we
   do), checks the signature over the result and only then decodes the JSON.

Every member before `signature` is covered, so the instance a document was issued for
(`for_instance`, 1.9: what keeps an old document from running again on an agent that lost
its state) cannot be changed without the key either.

A document that does not end that way is refused before any JSON is read, so an
attacker who can publish on the broker (a stolen node credential, a compromised
broker, any local process on an anonymous one) reaches nothing but this check.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import TYPE_CHECKING, Literal

import msgspec

from shared.ed25519 import PUBLIC_KEY_BYTES, VerifyKey, is_signature
from shared.messages import DESIRED_DECODER, DesiredState, encode

# cryptography is imported only to sign (the control plane): about 7 MB resident that an
# agent, which only verifies, never needs (shared/ed25519.py checks signatures with the
# libcrypto the interpreter has loaded).
if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

SignatureFailure = Literal["unsigned", "malformed", "bad-signature"]

_UNSIGNED_TAIL = b',"signature":null}'
# 64 bytes of signature are 88 base64 characters, the last two "=" padding.
_SIGNED_TAIL = re.compile(rb',"signature":"([A-Za-z0-9+/]{86}==)"\}\Z')
_SIGNATURE_MEMBER = re.compile(rb'"signature"\s*:')


class DesiredSignatureError(ValueError):
    """A `desired` payload that is not a document signed by the key we trust.
    `reason` is data (counted, raised as the event's detail); `str()` is for people."""

    def __init__(self, reason: SignatureFailure, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason: SignatureFailure = reason
        self.detail = detail


class PublicKeyError(ValueError):
    """A control-plane public key that is not base64 of 32 raw Ed25519 bytes."""


def load_public_key(text: str) -> VerifyKey:
    """The key from its base64 (of the 32 raw bytes, as `public_key_base64` writes it)."""
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise PublicKeyError("not valid base64") from None
    if len(raw) != PUBLIC_KEY_BYTES:
        raise PublicKeyError(
            f"an Ed25519 public key is {PUBLIC_KEY_BYTES} bytes, this one is {len(raw)}"
        )
    return VerifyKey(raw)


def public_key_base64(key: Ed25519PublicKey | Ed25519PrivateKey) -> str:
    """Base64 of the 32 raw public-key bytes: what agents are configured with."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return base64.b64encode(public.public_bytes(Encoding.Raw, PublicFormat.Raw)).decode("ascii")


def sign_desired(document: DesiredState, private_key: Ed25519PrivateKey) -> bytes:
    """The payload to publish: `document` (its `signature` ignored) encoded and signed."""
    unsigned = encode(msgspec.structs.replace(document, signature=None))
    if not unsigned.endswith(_UNSIGNED_TAIL):  # only if someone moved the field
        raise AssertionError("DesiredState.signature must stay the last field")
    signature = base64.b64encode(private_key.sign(unsigned))
    return unsigned[: -len(b"null}")] + b'"' + signature + b'"}'


def verify_desired(payload: bytes, public_key: VerifyKey | Ed25519PublicKey) -> DesiredState:
    """The document in `payload` once its signature checks out; raises
    `DesiredSignatureError` otherwise. Nothing is decoded before the check."""
    tail = _SIGNED_TAIL.search(payload)
    if tail is None:
        if payload.endswith(_UNSIGNED_TAIL) or _SIGNATURE_MEMBER.search(payload) is None:
            raise DesiredSignatureError("unsigned", "the document carries no signature")
        raise DesiredSignatureError(
            "malformed", 'the document does not end with ,"signature":"<base64>"}'
        )
    signed = payload[: tail.start()] + _UNSIGNED_TAIL
    signature = base64.b64decode(tail.group(1))
    if base64.b64encode(signature) != tail.group(1):
        # The last character's spare bits changed: one signature has one spelling (else a
        # copy with other bytes verifies too, and looks like a new document).
        raise DesiredSignatureError("malformed", "the signature is not in canonical base64")
    if not is_signature(public_key, signature, signed):
        raise DesiredSignatureError("bad-signature", "the signature is not the control plane's")
    try:
        return DESIRED_DECODER.decode(payload)
    except msgspec.DecodeError as error:
        # Signed by our key yet not a document we can read: a newer control plane's
        # change that is not additive, never an attacker.
        raise DesiredSignatureError("malformed", str(error)) from None
