"""The control plane's `desired` signing key file (cloud/loop/signing.py): made once with
mode 0600, the same key on every later load and for processes racing to make it, and
refused, naming `cloud.signing_key_file`, when it is not a private Ed25519 PEM key."""

from __future__ import annotations

import multiprocessing
import os
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from cloud.loop.signing import load_or_create_signing_key, public_key_base64, signing_key_path
from shared.settings import CloudSettings, ConfigError, Settings, StoreSettings


def settings_for(data_dir: Path, key_file: Path | None = None) -> Settings:
    return Settings(
        store=StoreSettings(data_dir=str(data_dir)),
        cloud=CloudSettings(signing_key_file=str(key_file) if key_file else ""),
    )


def test_the_key_is_made_once_in_the_data_dir_with_mode_0600(tmp_path: Path) -> None:
    settings = settings_for(tmp_path / "data")
    first = load_or_create_signing_key(settings)
    path = tmp_path / "data" / "desired-signing.key"
    assert signing_key_path(settings) == path
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert public_key_base64(load_or_create_signing_key(settings)) == public_key_base64(first)
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left


def test_a_configured_file_is_used_wherever_the_data_dir_is(tmp_path: Path) -> None:
    key_file = tmp_path / "keys" / "desired.key"
    one = load_or_create_signing_key(settings_for(tmp_path / "a", key_file))
    other = load_or_create_signing_key(settings_for(tmp_path / "b", key_file))
    assert public_key_base64(one) == public_key_base64(other)
    assert not (tmp_path / "a" / "desired-signing.key").exists()


def _load_in_child(data_dir: str, results: multiprocessing.Queue[str]) -> None:
    results.put(public_key_base64(load_or_create_signing_key(settings_for(Path(data_dir)))))


def test_processes_making_the_key_at_once_all_get_the_one_in_the_file(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue[str] = context.Queue()
    children = [
        context.Process(target=_load_in_child, args=(str(tmp_path / "data"), results))
        for _ in range(6)
    ]
    for child in children:
        child.start()
    keys = [results.get(timeout=60) for _ in children]
    for child in children:
        child.join(timeout=60)
        assert child.exitcode == 0
    on_disk = public_key_base64(load_or_create_signing_key(settings_for(tmp_path / "data")))
    assert set(keys) == {on_disk}


def test_a_key_file_others_can_read_is_refused(tmp_path: Path) -> None:
    settings = settings_for(tmp_path / "data")
    load_or_create_signing_key(settings)
    os.chmod(signing_key_path(settings), 0o640)
    with pytest.raises(ConfigError, match="readable by others") as refused:
        load_or_create_signing_key(settings)
    assert refused.value.key == "cloud.signing_key_file"
    assert "cloud.signing_key_file" in str(refused.value)


@pytest.mark.parametrize(
    "content",
    [
        b"not a key at all\n",
        ec.generate_private_key(ec.SECP256R1()).private_bytes(
            Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()
        ),
    ],
    ids=["garbage", "ecdsa-key"],
)
def test_a_file_that_is_not_an_ed25519_pem_key_is_refused(tmp_path: Path, content: bytes) -> None:
    key_file = tmp_path / "desired.key"
    key_file.write_bytes(content)
    key_file.chmod(0o600)
    with pytest.raises(ConfigError) as refused:
        load_or_create_signing_key(settings_for(tmp_path / "data", key_file))
    assert refused.value.key == "cloud.signing_key_file"
    assert str(key_file) in str(refused.value)
    assert key_file.read_bytes() == content  # never overwritten


def test_a_key_file_that_is_a_link_or_another_users_is_refused(tmp_path: Path) -> None:
    # Whoever could plant a link (or a file of their own) there would choose the key.
    planted = tmp_path / "planted.key"
    load_or_create_signing_key(settings_for(tmp_path / "other", planted))
    key_file = tmp_path / "desired.key"
    key_file.symlink_to(planted)
    with pytest.raises(ConfigError, match="symbolic link") as refused:
        load_or_create_signing_key(settings_for(tmp_path / "data", key_file))
    assert refused.value.key == "cloud.signing_key_file"
    dangling = tmp_path / "dangling.key"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="symbolic link"):
        load_or_create_signing_key(settings_for(tmp_path / "data", dangling))
    if os.geteuid() == 0:  # only root can give a file away
        os.chown(planted, 65534, 65534)
        with pytest.raises(ConfigError, match="owned by uid 65534"):
            load_or_create_signing_key(settings_for(tmp_path / "data", planted))
