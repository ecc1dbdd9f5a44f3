"""Secrets at rest (cloud/secrets/at_rest.py), their redaction in views and their
release to one node (cloud/secrets/release.py), without a store: the key file, what the
ciphertext is bound to, and what each step gives away."""

from __future__ import annotations

import base64
import os
import stat
from pathlib import Path

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from structlog.testing import capture_logs

from cloud.secrets.at_rest import (
    KEY_BYTES,
    PREFIX,
    SecretNotOpenedError,
    SecretsAtRest,
    load_or_create_secrets_key,
    secrets_key_path,
)
from cloud.secrets.redaction import redacted
from cloud.secrets.release import SecretRelease
from cloud.work.specs import DeploymentSpec, TrainingJobSpec
from shared.redact import MASK
from shared.sealing import RegistryCredentials, SealedSecretsError, open_sealed, public_key_text
from shared.settings import CloudSettings, ConfigError, Settings, StoreSettings

TENANT = "01ARZ3NDEKTSV4RRFFQ69G5FAW"
OTHER_TENANT = "01ARZ3NDEKTSV4RRFFQ69G5FAX"
SECRET = "hunter2-aws-secret"
PASSWORD = "registry-password-42"


def at_rest() -> SecretsAtRest:
    return SecretsAtRest(os.urandom(KEY_BYTES))


def spec_with_secrets(**fields: object) -> TrainingJobSpec:
    return msgspec.convert(
        {
            "name": "a",
            "command": ["x"],
            "env": {"PLAIN": "shown"},
            "secret_env": {"AWS_SECRET_ACCESS_KEY": SECRET, "EMPTY": ""},
            "image": "ghcr.io/acme/trainer:2",
            "registry_auth": {"username": "ci", "password": PASSWORD},
            **fields,
        },
        TrainingJobSpec,
    )


def test_equal_values_encrypt_to_equal_text_bound_to_tenant_and_field() -> None:
    keys = at_rest()
    first = keys.encrypt(SECRET, tenant_id=TENANT, field="secret_env.A")
    assert first.startswith(PREFIX)
    assert SECRET not in first
    assert keys.encrypt(SECRET, tenant_id=TENANT, field="secret_env.A") == first
    assert keys.decrypt(first, tenant_id=TENANT, field="secret_env.A") == SECRET
    # Another tenant, another name, another key: it does not open.
    with pytest.raises(SecretNotOpenedError):
        keys.decrypt(first, tenant_id=OTHER_TENANT, field="secret_env.A")
    with pytest.raises(SecretNotOpenedError):
        keys.decrypt(first, tenant_id=TENANT, field="secret_env.B")
    with pytest.raises(SecretNotOpenedError):
        at_rest().decrypt(first, tenant_id=TENANT, field="secret_env.A")
    assert keys.encrypt(SECRET, tenant_id=OTHER_TENANT, field="secret_env.A") != first


def test_tampered_or_unencrypted_text_does_not_open() -> None:
    keys = at_rest()
    stored = keys.encrypt(SECRET, tenant_id=TENANT, field="f")
    data = bytearray(base64.b64decode(stored[len(PREFIX) :]))
    data[-1] ^= 1
    tampered = PREFIX + base64.b64encode(bytes(data)).decode()
    for text in (tampered, SECRET, PREFIX + "not base64!", PREFIX):
        with pytest.raises(SecretNotOpenedError) as error:
            keys.decrypt(text, tenant_id=TENANT, field="f")
        assert SECRET not in str(error.value)


def test_a_spec_is_stored_with_every_secret_encrypted_and_nothing_else_changed() -> None:
    keys = at_rest()
    spec = spec_with_secrets()
    stored = keys.encrypt_spec(spec, tenant_id=TENANT)
    document = msgspec.json.encode(stored)
    assert SECRET.encode() not in document
    assert PASSWORD.encode() not in document
    assert stored.env == {"PLAIN": "shown"}
    assert set(stored.secret_env) == {"AWS_SECRET_ACCESS_KEY", "EMPTY"}
    assert all(value.startswith(PREFIX) for value in stored.secret_env.values())
    assert stored.registry_auth is not None
    assert stored.registry_auth.username == "ci"
    assert msgspec.structs.replace(stored, secret_env=spec.secret_env, registry_auth=None) == (
        msgspec.structs.replace(spec, registry_auth=None)
    )
    # Deterministic: a retry's spec encodes to the same bytes.
    assert msgspec.json.encode(keys.encrypt_spec(spec, tenant_id=TENANT)) == document
    # What looks like ciphertext when submitted is a plaintext like any other.
    lookalike = msgspec.structs.replace(spec, secret_env={"A": stored.secret_env["EMPTY"]})
    again = keys.encrypt_spec(lookalike, tenant_id=TENANT)
    assert again.secret_env["A"] != lookalike.secret_env["A"]
    release = SecretRelease(keys)
    assert release.plaintext(again, tenant_id=TENANT).env == {"A": stored.secret_env["EMPTY"]}


def test_work_without_secrets_is_stored_as_it_is() -> None:
    keys = at_rest()
    plain = msgspec.convert({"name": "a", "command": ["x"]}, TrainingJobSpec)
    assert keys.encrypt_spec(plain, tenant_id=TENANT) is plain
    deployment = DeploymentSpec(name="d", model_id="m")
    assert keys.encrypt_spec(deployment, tenant_id=TENANT) is deployment


def test_views_show_names_and_masks_only() -> None:
    stored = at_rest().encrypt_spec(spec_with_secrets(), tenant_id=TENANT)
    shown = redacted(stored)
    assert shown.secret_env == {"AWS_SECRET_ACCESS_KEY": MASK, "EMPTY": MASK}
    assert shown.registry_auth is not None
    assert (shown.registry_auth.username, shown.registry_auth.password) == ("ci", MASK)
    assert PREFIX.encode() not in msgspec.json.encode(shown)
    assert shown.env == {"PLAIN": "shown"}
    plain = msgspec.convert({"name": "a", "command": ["x"]}, TrainingJobSpec)
    assert redacted(plain) is plain


def test_secrets_are_released_sealed_to_one_node_job_and_attempt() -> None:
    keys = at_rest()
    stored = keys.encrypt_spec(spec_with_secrets(), tenant_id=TENANT)
    node_key = X25519PrivateKey.generate()
    release = SecretRelease(keys)
    sealed = release.sealed(
        stored,
        tenant_id=TENANT,
        node_id="n1",
        job_id="job-1",
        attempt=2,
        public_key=public_key_text(node_key),
    )
    assert sealed is not None
    assert SECRET not in sealed
    assert PASSWORD not in sealed
    opened = open_sealed(sealed, node_key, node_id="n1", job_id="job-1", attempt=2)
    assert opened.env == {"AWS_SECRET_ACCESS_KEY": SECRET, "EMPTY": ""}
    assert opened.registry == RegistryCredentials(
        registry="ghcr.io", username="ci", password=PASSWORD
    )
    for elsewhere in (
        {"node_id": "n2", "job_id": "job-1", "attempt": 2},
        {"node_id": "n1", "job_id": "job-2", "attempt": 2},
        {"node_id": "n1", "job_id": "job-1", "attempt": 3},
    ):
        with pytest.raises(SealedSecretsError):
            open_sealed(sealed, node_key, **elsewhere)  # type: ignore[arg-type]
    with pytest.raises(SealedSecretsError):
        open_sealed(sealed, X25519PrivateKey.generate(), node_id="n1", job_id="job-1", attempt=2)


def test_nothing_is_released_without_a_key_or_when_they_do_not_open() -> None:
    keys = at_rest()
    stored = keys.encrypt_spec(spec_with_secrets(), tenant_id=TENANT)
    release = SecretRelease(keys, log_interval_s=0.0)
    node_key = public_key_text(X25519PrivateKey.generate())
    where = {"node_id": "n1", "job_id": "job-1", "attempt": 1}
    with capture_logs() as logs:
        assert release.sealed(stored, tenant_id=TENANT, public_key=None, **where) is None  # type: ignore[arg-type]
        # Another tenant's ciphertext, or a replaced key: nothing opens, nothing is sealed.
        assert release.sealed(stored, tenant_id=OTHER_TENANT, public_key=node_key, **where) is None  # type: ignore[arg-type]
        other_keys = SecretRelease(at_rest(), log_interval_s=0.0)
        assert other_keys.sealed(stored, tenant_id=TENANT, public_key=node_key, **where) is None  # type: ignore[arg-type]
        assert release.sealed(stored, tenant_id=TENANT, public_key="bad", **where) is None  # type: ignore[arg-type]
    assert [entry["event"] for entry in logs] == [
        "secrets withheld: the node has no usable sealing key",
        "secrets withheld",
        "secrets withheld",
        "secrets withheld",
    ]
    assert all(entry["node_id"] == "n1" and entry["job_id"] == "job-1" for entry in logs)
    assert SECRET not in repr(logs)
    assert PASSWORD not in repr(logs)
    plain = msgspec.convert({"name": "a", "command": ["x"]}, TrainingJobSpec)
    assert release.sealed(plain, tenant_id=TENANT, public_key=node_key, **where) is None  # type: ignore[arg-type]


def settings_in(tmp_path: Path, key_file: str = "") -> Settings:
    return Settings(
        store=StoreSettings(data_dir=str(tmp_path / "data")),
        cloud=CloudSettings(secrets_key_file=key_file),
    )


def test_the_key_is_made_once_private_and_shared_by_every_reader(tmp_path: Path) -> None:
    settings = settings_in(tmp_path)
    path = secrets_key_path(settings)
    assert path == tmp_path / "data" / "secrets.key"
    first = load_or_create_secrets_key(settings)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    second = load_or_create_secrets_key(settings)  # another replica, or a restart
    stored = first.encrypt(SECRET, tenant_id=TENANT, field="f")
    assert second.decrypt(stored, tenant_id=TENANT, field="f") == SECRET
    assert SECRET.encode() not in path.read_bytes()

    configured = settings_in(tmp_path, str(tmp_path / "elsewhere" / "k"))
    assert secrets_key_path(configured) == tmp_path / "elsewhere" / "k"
    load_or_create_secrets_key(configured)
    assert (tmp_path / "elsewhere" / "k").exists()


def test_an_exposed_or_broken_key_file_stops_the_control_plane(tmp_path: Path) -> None:
    settings = settings_in(tmp_path)
    load_or_create_secrets_key(settings)
    path = secrets_key_path(settings)
    path.chmod(0o644)
    with pytest.raises(ConfigError, match=r"cloud\.secrets_key_file: .* readable by others"):
        load_or_create_secrets_key(settings)
    path.chmod(0o600)
    path.write_bytes(base64.b64encode(b"short") + b"\n")
    with pytest.raises(ConfigError, match=r"cloud\.secrets_key_file: .*64 bytes"):
        load_or_create_secrets_key(settings)
    path.write_bytes(b"not base64 at all!\n")
    with pytest.raises(ConfigError, match="not a secrets key"):
        load_or_create_secrets_key(settings)
