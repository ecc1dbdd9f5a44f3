"""Salted scrypt hashes of secrets (tenant tokens, broker passwords): the parameters
travel with the hash, and comparing is constant-time. Blocking for tens of
milliseconds: call it off the event loop where a request waits."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Final

from shared.base64url import b64url, unb64url

# scrypt cost: 2**14 x 8 x 1 takes 16 MiB and tens of milliseconds, the interactive-login
# recommendation. The secrets are 256 random bits, so the cost is defence in depth only;
# the store caches successful verifications (`store.token_cache_s`) to keep requests fast.
SCRYPT_LOG2_N: Final = 14
SCRYPT_R: Final = 8
SCRYPT_P: Final = 1
_KEY_BYTES: Final = 32


def _scrypt(secret: str, salt: bytes, log2_n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(
        secret.encode(), salt=salt, n=1 << log2_n, r=r, p=p, dklen=_KEY_BYTES, maxmem=64 << 20
    )


def hash_secret(secret: str) -> str:
    """`scrypt$<log2 n>$<r>$<p>$<salt>$<key>`: the parameters travel with the hash."""
    salt = secrets.token_bytes(16)
    key = _scrypt(secret, salt, SCRYPT_LOG2_N, SCRYPT_R, SCRYPT_P)
    return f"scrypt${SCRYPT_LOG2_N}${SCRYPT_R}${SCRYPT_P}${b64url(salt)}${b64url(key)}"


def verify_secret(secret: str, encoded: str) -> bool:
    try:
        algorithm, log2_n, r, p, salt, key = encoded.split("$")
        if algorithm != "scrypt":
            return False
        actual = _scrypt(secret, unb64url(salt), int(log2_n), int(r), int(p))
    except ValueError:
        return False
    return hmac.compare_digest(actual, unb64url(key))
