"""Private keys as PEM (PKCS#8, unencrypted): made and read back for shared/key_files.py,
whatever their algorithm (the control plane's Ed25519 signing key, a node's X25519
sealing key). cryptography is imported when a key is made or read."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes

KeyT = TypeVar("KeyT")


def new_pem_key(generate: Callable[[], PrivateKeyTypes]) -> bytes:
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        NoEncryption,
        PrivateFormat,
    )

    return generate().private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())


def parse_pem_key(data: bytes, expected: type[KeyT], what: str) -> KeyT:
    """The key in `data`; ValueError naming `what` when it is not one of `expected`."""
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    try:
        key = load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as error:
        raise ValueError(f"{what} is not an unencrypted PEM private key ({error})") from None
    if not isinstance(key, expected):
        raise ValueError(f"{what} holds a {type(key).__name__}, not an {expected.__name__}")
    return key
