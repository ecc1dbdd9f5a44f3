"""Job secrets at rest: every `secret_env` value and registry password the store keeps is
ciphertext, `gfenc1:<base64>`, written into the spec before it is encoded and stored.

The key lives in `cloud.secrets_key_file` (empty: `store.data_dir/secrets.key`): 64 random
bytes in base64, mode 0600, made on first start (shared/key_files.py, as the signing key).
Every replica must read the same file, and a store restored from a backup is useless
without it: back it up with the store (docs/store.md), never beside it in the same place.

Deterministic authenticated encryption (AES-SIV, RFC 5297): the same value of one tenant
under one name always encrypts to the same text, so a retried submission (Idempotency-Key)
encodes to the same bytes as the original and is recognised. The associated data binds
each ciphertext to its tenant and to the field it fills (`secret_env.NAME`,
`registry_auth.password`): copied into another tenant's job, or under another name, it
does not open. What SIV gives away, and all it gives away: that two stored values of one
tenant under one name are equal.

A submitted value is always plaintext, whatever it looks like: a value that happens to
start with `gfenc1:` is encrypted like any other.
"""

from __future__ import annotations

import base64
import binascii
import secrets
from pathlib import Path
from typing import Final, TypeVar

import msgspec
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESSIV

from cloud.work.specs import DeploymentSpec, TrainingJobSpec
from shared.key_files import load_or_create_key
from shared.settings import Settings

SETTING: Final = "cloud.secrets_key_file"
DEFAULT_FILE_NAME: Final = "secrets.key"
PREFIX: Final = "gfenc1:"
KEY_BYTES: Final = 64  # AES-SIV with two AES-256 keys
_CONTEXT: Final = b"greenfed/v1 secret at rest"
REGISTRY_PASSWORD_FIELD: Final = "registry_auth.password"

SpecT = TypeVar("SpecT", TrainingJobSpec, DeploymentSpec)


class SecretNotOpenedError(ValueError):
    """A stored secret that does not open with this key for this tenant and field (the
    key file was replaced, or the value was copied from elsewhere)."""


def secret_env_field(name: str) -> str:
    """The field a `secret_env` value fills, as its ciphertext is bound to it."""
    return f"secret_env.{name}"


class SecretsAtRest:
    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_BYTES:
            raise ValueError(f"a secrets key has {KEY_BYTES} bytes, not {len(key)}")
        self._cipher = AESSIV(key)

    def encrypt(self, plaintext: str, *, tenant_id: str, field: str) -> str:
        sealed = self._cipher.encrypt(plaintext.encode(), _associated(tenant_id, field))
        return PREFIX + base64.b64encode(sealed).decode("ascii")

    def decrypt(self, stored: str, *, tenant_id: str, field: str) -> str:
        """What `encrypt` encrypted for this tenant and field; SecretNotOpenedError else."""
        if not stored.startswith(PREFIX):
            raise SecretNotOpenedError(f"{field} is not encrypted")
        try:
            data = base64.b64decode(stored[len(PREFIX) :], validate=True)
            return self._cipher.decrypt(data, _associated(tenant_id, field)).decode()
        except (binascii.Error, ValueError, InvalidTag):
            raise SecretNotOpenedError(
                f"{field} does not open with this control plane's secrets key "
                f"({SETTING} replaced, or the value is not this tenant's)"
            ) from None

    def encrypt_spec(self, spec: SpecT, *, tenant_id: str) -> SpecT:
        """`spec` as the store keeps it: every secret it holds (as submitted, plaintext)
        replaced by its ciphertext. Work without secrets comes back as it is."""
        if not isinstance(spec, TrainingJobSpec) or not spec.has_secrets:
            return spec
        secret_env = {
            name: self.encrypt(value, tenant_id=tenant_id, field=secret_env_field(name))
            for name, value in spec.secret_env.items()
        }
        auth = spec.registry_auth
        if auth is not None:
            password = self.encrypt(
                auth.password, tenant_id=tenant_id, field=REGISTRY_PASSWORD_FIELD
            )
            auth = msgspec.structs.replace(auth, password=password)
        return msgspec.structs.replace(spec, secret_env=secret_env, registry_auth=auth)


def _associated(tenant_id: str, field: str) -> list[bytes]:
    return [_CONTEXT, tenant_id.encode(), field.encode()]


def secrets_key_path(settings: Settings) -> Path:
    configured = settings.cloud.secrets_key_file
    if configured:
        return Path(configured).expanduser()
    return settings.store.resolved_data_dir() / DEFAULT_FILE_NAME


def load_or_create_secrets_key(settings: Settings) -> SecretsAtRest:
    """The key in the configured file, made there first if there is none (blocking I/O:
    call it off the event loop)."""
    return load_or_create_key(secrets_key_path(settings), setting=SETTING, make=_new, parse=_parse)


def _new() -> bytes:
    return base64.b64encode(secrets.token_bytes(KEY_BYTES)) + b"\n"


def _parse(data: bytes) -> SecretsAtRest:
    try:
        key = base64.b64decode(data.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("not a secrets key (base64 of 64 bytes)") from None
    return SecretsAtRest(key)
