"""The control plane's Ed25519 key that every `desired` document is signed with.

It lives in `cloud.signing_key_file` (empty: `store.data_dir/desired-signing.key`),
PEM, mode 0600, made on first start. Every replica of a control plane, `greenfed up`
and the tests read it before the app starts (to hand the public key to agents), so
loading is idempotent and two processes creating it at once agree on one key: the
new key is written to a private temporary file and hard-linked into place, which
fails instead of overwriting when another process got there first.

A file that is not an Ed25519 private key in PEM, or that others can read, is refused
with an error naming the setting: a leaked key lets anyone run commands on every node.
"""

from __future__ import annotations

import contextlib
import os
import stat
import uuid
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    load_pem_private_key,
)

from shared.desired_signature import public_key_base64
from shared.settings import ConfigError, Settings

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
    path = signing_key_path(settings)
    try:
        return _load(path)
    except FileNotFoundError:
        pass
    _create(path)
    return _load(path)


def _load(path: Path) -> Ed25519PrivateKey:
    with path.open("rb") as file:
        mode = os.fstat(file.fileno()).st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ConfigError(
                f"{SETTING}: {path} is readable by others (mode {stat.S_IMODE(mode):04o}); "
                f"run chmod 600 {path}",
                key=SETTING,
            )
        data = file.read()
    try:
        key = load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as error:
        raise ConfigError(
            f"{SETTING}: {path} is not an unencrypted PEM private key ({error})", key=SETTING
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(
            f"{SETTING}: {path} holds a {type(key).__name__}, not an Ed25519 key", key=SETTING
        )
    return key


def _create(path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"{SETTING}: cannot create {path.parent}: {error}", key=SETTING) from None
    pem = Ed25519PrivateKey.generate().private_bytes(
        Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()
    )
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "wb") as file:
            file.write(pem)
            file.flush()
            os.fsync(file.fileno())
        # link, not rename: a key another process linked first must win, or the two would
        # sign with different keys.
        with contextlib.suppress(FileExistsError):
            os.link(temporary, path)
    except OSError as error:
        raise ConfigError(f"{SETTING}: cannot write {path}: {error}", key=SETTING) from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
