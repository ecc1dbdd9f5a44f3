"""Secrets out of log lines: passwords in URLs and the values of secret-named keys.

`redact_url` masks the password of a URL's userinfo (`mqtt://user:***@host:1883`);
`redact` walks a log event (dicts, lists and tuples, nested) and masks the value of
every key named like a secret (password, token, secret, authorization, api_key, ...)
and any URL with a password inside any string. `shared.logs` runs `redact` on every
event, so a secret that reaches a log call anyway never reaches the output.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

MASK: Final = "***"

# A key is secret if one of its words (split at '_', '-', '.' and case changes) is one
# of these, or it is one of the compounds; "token_ttl_s" or "tokens" are not secrets.
_SECRET_WORDS: Final = frozenset(
    {"password", "passwd", "pwd", "secret", "token", "authorization", "credential", "credentials"}
)
_SECRET_COMPOUNDS: Final = frozenset(
    {"apikey", "api_key", "privatekey", "private_key", "accesskey", "access_key", "cookie"}
)
_NOT_SECRET_SUFFIXES: Final = ("_file", "_path", "_ttl_s", "_id", "_count", "_s")
_WORD_SPLIT: Final = re.compile(r"[_\-.\s]+|(?<=[a-z])(?=[A-Z])")

# scheme://user:password@ -> scheme://user:***@. The password ends at the last '@' before
# the host: base64 passwords hold '/' (SQLAlchemy and the database drivers take them
# unencoded) and an unencoded '@' leaves the host after the last one (urllib's reading).
# It never spans whitespace or another URL's "://" (a URL inside a query keeps its own
# host). Masking too much (a URL with no password but a port, then '@' in its path)
# costs a reader some text; masking too little would print a secret.
_URL_PASSWORD: Final = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^:/@\s]*:)(?:(?!://)\S)+@")
# "Bearer abc..." anywhere in text (an Authorization header copied into a message).
_BEARER: Final = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}")


def is_secret_key(key: str) -> bool:
    lowered = key.lower()
    if lowered.endswith(_NOT_SECRET_SUFFIXES):
        return False
    if lowered in _SECRET_COMPOUNDS or lowered.replace("-", "_") in _SECRET_COMPOUNDS:
        return True
    return any(word.lower() in _SECRET_WORDS for word in _WORD_SPLIT.split(key) if word)


def redact_url(url: str) -> str:
    """The URL with its password (if any) masked; everything else as it was."""
    return _URL_PASSWORD.sub(rf"\g<head>{MASK}@", url)


def redact_text(text: str) -> str:
    """URLs' passwords and bearer credentials masked anywhere in free text."""
    if "://" in text:
        text = redact_url(text)
    return _BEARER.sub(rf"\1 {MASK}", text) if len(text) >= 15 else text


def redact(value: object, *, depth: int = 0) -> object:
    """A copy of `value` with secrets masked; values that hold none come back as they are."""
    if depth > 8:  # log events are shallow; a deep structure is not worth walking
        return value
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return {
            key: (
                MASK
                if isinstance(key, str) and is_secret_key(key) and value[key] not in (None, "")
                else redact(item, depth=depth + 1)
            )
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        redacted = [redact(item, depth=depth + 1) for item in value]
        return redacted if isinstance(value, list) else tuple(redacted)
    return value
