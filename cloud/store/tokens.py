"""Tenant bearer tokens: `gf_<token id>_<secret>`, stored as a salted scrypt hash.

The token id is not secret: it is stored in clear, indexed and unique, so that
authentication finds its one candidate row without hashing against every tenant.
Only the secret's scrypt hash is stored; comparing is constant-time.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from typing import Final

from shared.secret_hashes import hash_secret

TOKEN_PREFIX: Final = "gf"
_TOKEN = re.compile(r"^gf_(?P<token_id>[0-9a-f]{16})_(?P<secret>[A-Za-z0-9_-]{43})$")


@dataclass(frozen=True, slots=True)
class IssuedToken:
    token: str  # shown to the tenant once, never stored
    token_id: str
    secret_hash: str


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
