"""Make the upgrade tests' fixtures: a store filled by a previous release's own code.

    .venv/bin/python -m tests.store_upgrade.make_fixture [--commit SHA]

Checks the release out into a temporary `git worktree`, runs tests/store_upgrade/
populate.py with that checkout first on PYTHONPATH (its REST API and its `Store`), once
on SQLite and once on PostgreSQL, and writes under fixtures/<short commit>/:

- `sqlite.db.gz`: the SQLite database file, WAL checkpointed into it, gzipped;
- `postgresql.sql`: `pg_dump --inserts` of the schema the release filled, plain SQL
  (psql's `\\restrict` lines dropped, so any client can run it), its schema named
  `greenfed_upgrade_fixture`, which a test renames to its own;
- `sqlite.json`, `postgresql.json`: what populate.py made (ids, tokens, states, events,
  usage totals) as that release read it back.

Needs git, the repository's history, pg_dump and the PostgreSQL of the tests
(GREENFED_TEST_POSTGRES_URL, default postgresql://postgres@127.0.0.1:5432/test).
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy.engine import make_url

from tests.store.databases import POSTGRES_URL, drop_schema
from tests.store_upgrade.previous_release import (
    FIXTURE_SCHEMA,
    FIXTURES,
    PREVIOUS_RELEASE,
    REPOSITORY,
    fixture_paths,
)

POPULATE = Path(__file__).with_name("populate.py")


@contextmanager
def worktree(commit: str) -> Iterator[Path]:
    """A detached checkout of `commit`, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="greenfed-release-") as parent:
        path = Path(parent) / "tree"
        subprocess.run(
            ["git", "-C", str(REPOSITORY), "worktree", "add", "--detach", str(path), commit],
            check=True,
        )
        try:
            yield path
        finally:
            subprocess.run(
                ["git", "-C", str(REPOSITORY), "worktree", "remove", "--force", str(path)],
                check=True,
            )


def populate(tree: Path, data_dir: Path, manifest: Path, *postgres: str) -> None:
    """populate.py on the release's code (its checkout first on PYTHONPATH; the
    interpreter's own directory is the script's, which holds no package)."""
    check = (
        "import cloud.store, pathlib, sys; "
        f"sys.exit(0 if pathlib.Path(cloud.store.__file__).is_relative_to({str(tree)!r}) else 1)"
    )
    environment = {**os.environ, "PYTHONPATH": str(tree)}
    subprocess.run([sys.executable, "-c", check], cwd=tree, env=environment, check=True)
    subprocess.run(
        [
            sys.executable,
            str(POPULATE),
            "--data-dir",
            str(data_dir),
            "--manifest",
            str(manifest),
            *postgres,
        ],
        cwd=tree,
        env=environment,
        check=True,
    )


def sqlite_fixture(tree: Path, work: Path, database_out: Path, manifest: Path) -> None:
    data_dir = work / "sqlite"
    populate(tree, data_dir, manifest)
    database = data_dir / "greenfed.db"
    with sqlite3.connect(database) as connection:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    with database.open("rb") as source, gzip.GzipFile(database_out, "wb", 9, mtime=0) as target:
        shutil.copyfileobj(source, target)


def postgres_fixture(tree: Path, work: Path, dump_out: Path, manifest: Path) -> None:
    asyncio.run(drop_schema(FIXTURE_SCHEMA))
    try:
        populate(
            tree,
            work / "postgresql",
            manifest,
            "--postgres-url",
            POSTGRES_URL,
            "--schema",
            FIXTURE_SCHEMA,
        )
        url = make_url(POSTGRES_URL)
        dump = subprocess.run(
            [
                "pg_dump",
                f"--dbname={url.set(drivername='postgresql').render_as_string(hide_password=False)}",
                f"--schema={FIXTURE_SCHEMA}",
                "--no-owner",
                "--no-privileges",
                "--inserts",
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    finally:
        asyncio.run(drop_schema(FIXTURE_SCHEMA))
    # psql meta-commands (pg_dump's \restrict guard): the tests load the dump over a
    # plain connection, which runs SQL only.
    lines = [line for line in dump.splitlines() if not line.startswith("\\")]
    dump_out.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commit", default=PREVIOUS_RELEASE, help="the release (a commit)")
    args = parser.parse_args(argv)
    paths = fixture_paths(args.commit)
    paths.directory.mkdir(parents=True, exist_ok=True)
    with worktree(args.commit) as tree, tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        sqlite_fixture(tree, work, paths.sqlite_database, paths.manifest("sqlite"))
        postgres_fixture(tree, work, paths.postgres_dump, paths.manifest("postgresql"))
    for path in sorted(paths.directory.iterdir()):
        print(f"{path.relative_to(FIXTURES.parent)}  {path.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
