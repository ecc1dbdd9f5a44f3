"""Where a backup may be written: never over the store's own database or its side
files (through links too), a directory, or a file that is not a greenfed backup."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from cloud.store import NewTenant, open_store
from cloud.store.backup import BackupPathError, take_backup
from cloud.store.backup_file import BackupReader
from greenfed.cli import main
from shared.settings import StoreSettings

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def settings(tmp_path: Path) -> StoreSettings:
    """A SQLite store in tmp_path/data holding one tenant."""
    store_settings = StoreSettings(data_dir=str(tmp_path / "data"))
    async with await open_store(store_settings) as store:
        await store.create_tenant(NewTenant(name="precious"))
    return store_settings


def database_of(settings: StoreSettings) -> Path:
    return settings.resolved_data_dir() / "greenfed.db"


def partial_files(directory: Path) -> list[Path]:
    return list(directory.glob(".*.partial"))


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def tenants_in(settings: StoreSettings) -> list[str]:
    async with await open_store(settings) as store:
        return [tenant.name for tenant in await store.list_tenants()]


@pytest.mark.parametrize(
    "name", ["greenfed.db", "greenfed.db-wal", "greenfed.db-shm", "greenfed.db-journal"]
)
async def test_the_store_s_own_database_and_side_files_are_refused(
    settings: StoreSettings, name: str
) -> None:
    database = database_of(settings)
    before = digest(database)
    with pytest.raises(BackupPathError, match="is the store's own database"):
        await take_backup(settings, database.parent / name, greenfed_version="test")
    assert digest(database) == before
    assert await tenants_in(settings) == ["precious"]


async def test_a_link_to_the_database_is_refused(settings: StoreSettings, tmp_path: Path) -> None:
    database = database_of(settings)
    (tmp_path / "symbolic.backup").symlink_to(database)
    os.link(database, tmp_path / "hard.backup")
    for name in ("symbolic.backup", "hard.backup"):
        with pytest.raises(BackupPathError, match="is the store's own database"):
            await take_backup(settings, tmp_path / name, greenfed_version="test")
    # The same file named through another path (a `..` in it) is the same file.
    with pytest.raises(BackupPathError):
        await take_backup(
            settings, tmp_path / "elsewhere" / ".." / "data" / "greenfed.db", greenfed_version="t"
        )
    assert await tenants_in(settings) == ["precious"]


async def test_a_file_that_is_not_a_backup_is_not_replaced(
    settings: StoreSettings, tmp_path: Path
) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("not mine to lose\n", encoding="utf-8")
    with pytest.raises(BackupPathError, match="not a greenfed store backup"):
        await take_backup(settings, notes, greenfed_version="test")
    assert notes.read_text(encoding="utf-8") == "not mine to lose\n"
    with pytest.raises(BackupPathError, match="is a directory"):
        await take_backup(settings, tmp_path, greenfed_version="test")
    assert partial_files(tmp_path) == []


async def test_an_earlier_backup_or_an_empty_file_is_replaced(
    settings: StoreSettings, tmp_path: Path
) -> None:
    backup = tmp_path / "store.backup"
    backup.touch()  # as `mktemp` leaves it
    await take_backup(settings, backup, greenfed_version="first")
    await take_backup(settings, backup, greenfed_version="second")
    reader = BackupReader(backup)
    try:
        assert reader.header.greenfed_version == "second"
    finally:
        reader.close()


def test_the_cli_refuses_the_database_as_the_backup_file(
    settings: StoreSettings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "cloud.toml"
    config.write_text(f'[store]\ndata_dir = "{settings.data_dir}"\n', encoding="utf-8")
    database = database_of(settings)
    before = digest(database)
    assert main(["store", "backup", "--config", str(config), str(database)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"greenfed: {database} is the store's own database")
    assert err.count("\n") == 1
    assert digest(database) == before
