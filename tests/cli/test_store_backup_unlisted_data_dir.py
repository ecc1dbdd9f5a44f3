"""`greenfed store backup` from a data directory its user may not look into: the
Kubernetes upgrade of docs/deploy.md runs the control plane's image with the caller's
uid, whose data directory (/var/lib/greenfed, 0700, uid 10001) that user cannot
search. The backup is written all the same, so the command succeeds and says which
key files it could not check, instead of failing after the backup was made."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cloud.store import NewTenant, open_store
from tests.store.databases import DatabaseUnderTest
from tests.support.processes import greenfed_env

pytestmark = pytest.mark.timeout(60)

IMAGE_UID = 10001  # the image's user (deploy/containers/Containerfile.cloud)


@pytest.fixture
def unlisted_dir(tmp_path: Path) -> Iterator[tuple[Path, list[str]]]:
    """A directory the command cannot search, and the prefix to run it with: as root,
    another user's 0700 directory and no capability that overrides its mode; otherwise
    a directory of mode 0."""
    directory = tmp_path / "image-data"
    directory.mkdir()
    if os.geteuid() != 0:
        directory.chmod(0)
        yield directory, []
        directory.chmod(0o700)
        return
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv (util-linux) is not installed: root reads every directory")
    os.chown(directory, IMAGE_UID, IMAGE_UID)
    directory.chmod(0o700)
    drop = "-dac_override,-dac_read_search"
    yield directory, [setpriv, f"--bounding-set={drop}", f"--inh-caps={drop}"]


async def test_a_backup_says_what_it_cannot_check_and_succeeds(
    database: DatabaseUnderTest, tmp_path: Path, unlisted_dir: tuple[Path, list[str]]
) -> None:
    async with await open_store(database.settings) as store:
        await store.create_tenant(NewTenant(name="acme"))
    store_lines = [f"data_dir = {str(unlisted_dir[0])!r}"]
    if database.kind == "sqlite":
        database_file = database.settings.resolved_data_dir() / "greenfed.db"
        store_lines.append(f"database_url = {'sqlite:///' + str(database_file)!r}")
    else:
        store_lines.append(f"database_url = {database.settings.database_url!r}")
        store_lines.append(f"database_schema = {database.settings.database_schema!r}")
    config = tmp_path / "cloud.toml"
    config.write_text("[store]\n" + "\n".join(store_lines) + "\n")
    backup = tmp_path / "before-upgrade.backup"

    process = await asyncio.create_subprocess_exec(
        *unlisted_dir[1],
        sys.executable,
        "-m",
        "greenfed.cli",
        "store",
        "backup",
        "--config",
        str(config),
        str(backup),
        env=greenfed_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 45)
    said = out.decode()
    assert process.returncode == 0, said + err.decode()
    assert backup.is_file()
    assert f"written to {backup}" in said
    assert "1 tenants" in said
    # Each key file is named, with why it could not be checked.
    for what in ("secrets key", "signing key", "admin token"):
        [line] = [line for line in said.splitlines() if line.strip().startswith(what)]
        assert str(unlisted_dir[0]) in line
        assert "(cannot check: Permission denied)" in line
