"""`greenfed store backup` and `greenfed store restore`: what they print and how they
refuse (the drill itself under a live fleet: tests/e2e/test_store_restore.py)."""

from __future__ import annotations

import asyncio
import gzip
from pathlib import Path

import msgspec
import pytest

from cloud.store import NewTenant, open_store
from greenfed import up
from greenfed.cli import main
from greenfed.store_cli import EMBEDDED_BROKER_ACCOUNTS_FILE, _when
from shared import secret_hashes
from shared.settings import StoreSettings


@pytest.fixture(autouse=True)
def cheap_token_hashing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(secret_hashes, "SCRYPT_LOG2_N", 10)


def config(tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(f'[store]\ndata_dir = "{tmp_path / name}"\n', encoding="utf-8")
    return path


def run(*argv: str) -> int:
    try:
        return main(list(argv))
    except SystemExit as usage:
        return int(usage.code or 0)


async def _store_with(data_dir: Path, tenant: str) -> None:
    async with await open_store(StoreSettings(data_dir=str(data_dir))) as store:
        await store.create_tenant(NewTenant(name=tenant))


def test_a_restore_refuses_a_store_unless_forced_and_says_what_it_replaced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    asyncio.run(_store_with(tmp_path / "source", "from-backup"))
    asyncio.run(_store_with(tmp_path / "target", "already-here"))
    backup = tmp_path / "store.backup"
    assert run("store", "backup", "--config", str(config(tmp_path, "source")), str(backup)) == 0
    said = capsys.readouterr().out
    assert f"written to {backup}" in said
    assert "1 tenants, 0 jobs and deployments, 0 enrolled nodes" in said
    assert "NOT in the backup" in said
    for setting in ("cloud.secrets_key_file", "cloud.signing_key_file"):
        assert setting in said

    target = str(config(tmp_path, "target"))
    assert run("store", "restore", "--config", target, str(backup)) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("greenfed: ")
    assert "is not empty (schema version" in err
    assert "1 tenants" in err
    assert "--force" in err
    assert err.count("\n") == 1

    assert run("store", "restore", "--config", target, "--force", str(backup)) == 0
    said = capsys.readouterr().out
    assert said.startswith("replaced what sqlite")
    assert "1 tenants" in said.splitlines()[0]
    assert "put these back beside it" in said
    assert "(MISSING)" in said  # nothing was put back in this data directory


def test_a_backup_of_nothing_or_a_damaged_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = str(config(tmp_path, "empty"))
    assert run("store", "backup", "--config", empty, str(tmp_path / "x.backup")) == 1
    _, err = capsys.readouterr()
    assert err.startswith("greenfed: no store database at ")
    assert not (tmp_path / "x.backup").exists()
    (tmp_path / "junk.backup").write_bytes(b"not a backup")
    assert run("store", "restore", "--config", empty, str(tmp_path / "junk.backup")) == 1
    _, err = capsys.readouterr()
    assert err.startswith("greenfed: ")
    assert err.count("\n") == 1


def test_a_backup_taken_at_no_date_is_refused_before_the_store_is_touched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The output says when the backup was taken: a header's created_at past datetime's
    range once crashed it after the restore had committed, leaving the operator unsure
    whether the store was replaced."""
    asyncio.run(_store_with(tmp_path / "source", "from-backup"))
    asyncio.run(_store_with(tmp_path / "target", "already-here"))
    backup = tmp_path / "store.backup"
    assert run("store", "backup", "--config", str(config(tmp_path, "source")), str(backup)) == 0
    capsys.readouterr()
    lines = gzip.decompress(backup.read_bytes()).splitlines(keepends=True)
    header = msgspec.json.decode(lines[0])
    odd = tmp_path / "odd.backup"
    odd.write_bytes(
        gzip.compress(
            msgspec.json.encode({**header, "created_at": 1e300}) + b"\n" + b"".join(lines[1:])
        )
    )

    target = str(config(tmp_path, "target"))
    assert run("store", "restore", "--config", target, "--force", str(odd)) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("greenfed: ")
    assert "created_at" in err
    assert err.count("\n") == 1
    assert asyncio.run(_tenant_names(tmp_path / "target")) == ["already-here"]


async def _tenant_names(data_dir: Path) -> list[str]:
    async with await open_store(StoreSettings(data_dir=str(data_dir))) as store:
        return [tenant.name for tenant in await store.list_tenants()]


def test_a_time_no_date_holds_is_shown_as_its_number() -> None:
    assert _when(0.0) == "1970-01-01T00:00:00+00:00"
    assert _when(1e300) == "1e+300 (epoch seconds)"


def test_the_broker_accounts_file_is_the_one_greenfed_up_uses() -> None:
    assert EMBEDDED_BROKER_ACCOUNTS_FILE == up.BROKER_ACCOUNTS_FILE
