"""The control plane's Ed25519 key that every `desired` document is signed with.

It lives in `cloud.signing_key_file` (empty: `store.data_dir/desired-signing.key`),
PEM, mode 0600, made on first start. Every replica of a control plane, `greenfed up`
and the tests read it before the app starts (to hand the public key to agents), so
loading is idempotent and two processes creating it at once agree on one key
(shared/key_files.py).

A file that is not an Ed25519 private key in PEM, or that others can read, is refused
with an error naming the setting: a leaked key lets anyone run commands on every node.
"""

from __future__ import annotations

from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from shared.desired_signature import public_key_base64
from shared.key_files import load_or_create_key
from shared.pem_keys import new_pem_key, parse_pem_key
from shared.settings import Settings

__all__ = ["load_or_create_signing_key", "public_key_base64", "signing_key_path"]

SETTING = "cloud.signing_key_file"
DEFAULT_FILE_NAME = "desired-signing.key"


def signing_key_path(settings: Settings) -> Path:
    configured = settings.cloud.signing_key_file
    if configured:
        return Path(configured).expanduser()
    return settings.store.resolved_data_dir() / DEFAULT_FILE_NAME


def load_or_create_signing_key(settings: Settings) -> Ed25519PrivateKey:
    """The key in the configured file, made there first if there is none."""
    return load_or_create_key(signing_key_path(settings), setting=SETTING, make=_new, parse=_parse)


def _new() -> bytes:
    return new_pem_key(Ed25519PrivateKey.generate)


def _parse(data: bytes) -> Ed25519PrivateKey:
    return parse_pem_key(data, Ed25519PrivateKey, "the signing key")  # type: ignore[type-abstract]
