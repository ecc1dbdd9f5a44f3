"""Tenant bearer tokens: `gf_<token id>_<secret>`, stored as a salted scrypt hash.

The token id is not secret: it is stored in clear, indexed and unique, so that
authentication finds its one candidate row without hashing against every tenant.
Only the secret's scrypt hash is stored; comparing is constant-time.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from typing import Final

TOKEN_PREFIX: Final = "gf"
_TOKEN = re.compile(r"^gf_(?P<token_id>[0-9a-f]{16})_(?P<secret>[A-Za-z0-9_-]{43})$")
# scrypt cost: 2**14 x 8 x 1 takes 16 MiB and tens of milliseconds, the interactive-login
# recommendation. The secrets are 256 random bits, so the cost is defence in depth only;
# the store caches successful verifications (`store.token_cache_s`) to keep requests fast.
SCRYPT_LOG2_N: Final = 14
SCRYPT_R: Final = 8
SCRYPT_P: Final = 1
_KEY_BYTES: Final = 32


@dataclass(frozen=True, slots=True)
class IssuedToken:
    token: str  # shown to the tenant once, never stored
    token_id: str
    secret_hash: str


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _scrypt(secret: str, salt: bytes, log2_n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(
        secret.encode(), salt=salt, n=1 << log2_n, r=r, p=p, dklen=_KEY_BYTES, maxmem=64 << 20
    )


def hash_secret(secret: str) -> str:
    """`scrypt$<log2 n>$<r>$<p>$<salt>$<key>`: the parameters travel with the hash."""
    salt = secrets.token_bytes(16)
    key = _scrypt(secret, salt, SCRYPT_LOG2_N, SCRYPT_R, SCRYPT_P)
    return f"scrypt${SCRYPT_LOG2_N}${SCRYPT_R}${SCRYPT_P}${_b64(salt)}${_b64(key)}"


def verify_secret(secret: str, encoded: str) -> bool:
    try:
        algorithm, log2_n, r, p, salt, key = encoded.split("$")
        if algorithm != "scrypt":
            return False
        actual = _scrypt(secret, _unb64(salt), int(log2_n), int(r), int(p))
    except ValueError:
        return False
    return hmac.compare_digest(actual, _unb64(key))


def issue_token() -> IssuedToken:
    token_id = secrets.token_hex(8)
    secret = secrets.token_urlsafe(32)
    return IssuedToken(
        token=f"{TOKEN_PREFIX}_{token_id}_{secret}",
        token_id=token_id,
        secret_hash=hash_secret(secret),
    )


def parse_token(token: str) -> tuple[str, str] | None:
    """(token id, secret), or None for anything not shaped like a greenfed token."""
    match = _TOKEN.match(token)
    if match is None:
        return None
    return match.group("token_id"), match.group("secret")
