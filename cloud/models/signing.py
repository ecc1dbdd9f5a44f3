"""Signed model download URLs: what a `desired` document gives agents.

Agents hold no tenant token. The control plane signs `(model id, sha256)` with a key
every replica shares (`Store.shared_secret`), and `GET /v1/models/{id}/blob?sig=…`
serves the file to whoever presents a valid signature. A signature names exactly one
immutable file and never expires (a retained `desired` document must stay usable);
anyone who can read the fleet's `desired` topics can fetch the models they name,
which is why the broker's ACLs are the boundary (docs/mqtt.md).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import socket
from urllib.parse import quote

from shared.settings import CloudSettings

SECRET_NAME = "model-url-key"
# What `signature` makes: lower-case hex sha256. Anything else cannot be one of ours,
# and is refused before it reaches `hmac.compare_digest` (which raises on non-ASCII).
_SIGNATURE = re.compile(r"[0-9a-f]{64}")


class ModelUrlSigner:
    def __init__(self, key: str, base_url: str) -> None:
        self._key = key.encode()
        self.base_url = base_url.rstrip("/")

    def signature(self, model_id: str, sha256: str) -> str:
        message = f"{model_id}:{sha256}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def verify(self, model_id: str, sha256: str, signature: str) -> bool:
        """False for any signature we did not make, however malformed."""
        if _SIGNATURE.fullmatch(signature) is None:
            return False
        return hmac.compare_digest(self.signature(model_id, sha256), signature)

    def url(self, model_id: str, sha256: str) -> str:
        return (
            f"{self.base_url}/v1/models/{quote(model_id)}/blob"
            f"?sig={self.signature(model_id, sha256)}"
        )


def api_base_url(settings: CloudSettings) -> str:
    """Where agents reach this API: `cloud.public_url`, else the address it listens on
    (the host name when it listens on every interface)."""
    if settings.public_url:
        return settings.public_url
    host = settings.api_host
    if host in ("0.0.0.0", "::", ""):
        host = socket.getfqdn()
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{settings.api_port}"
