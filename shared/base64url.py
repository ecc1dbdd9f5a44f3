"""Unpadded base64url (RFC 4648 §5 without `=`): what greenfed's hashes and certificates
write where a value sits between separators (`$`, `.`)."""

from __future__ import annotations

import base64


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def unb64url(text: str) -> bytes:
    """The bytes of `b64url` text; raises ValueError (binascii.Error) for other text."""
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
