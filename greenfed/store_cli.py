"""`greenfed store backup FILE` and `greenfed store restore FILE [--force]`.

They talk to the database `[store]` names (`--config`, `GREENFED_STORE__*`), not to the
API: a backup is taken while the control plane runs, a restore is made while none does
(docs/operations.md). Both say what a backup does not hold and a restore needs: the
key files, the admin token, the model files and the broker's accounts.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from greenfed.arguments import EXIT_FAILURE, EXIT_OK
from shared.settings import Settings, load_settings

# Where `greenfed up` keeps its embedded broker's accounts (greenfed/up.py says the same
# name; a test holds them together). Mosquitto keeps them in its dynamic-security file.
EMBEDDED_BROKER_ACCOUNTS_FILE = "broker-accounts.json"


@dataclass(frozen=True, slots=True)
class CompanionFile:
    """A file a backup does not hold and a restored control plane needs."""

    what: str
    path: Path
    why: str
    always: bool = True  # every control plane has one (the models and accounts: some do)


def companion_files(settings: Settings) -> list[CompanionFile]:
    from cloud.loop import signing
    from cloud.secrets import at_rest
    from shared.token_files import admin_token_path

    data_dir = settings.store.resolved_data_dir()
    return [
        CompanionFile(
            "secrets key",
            at_rest.secrets_key_path(settings),
            f"{at_rest.SETTING}: opens the jobs' secrets the store keeps encrypted; "
            "without it they must be submitted again",
        ),
        CompanionFile(
            "signing key",
            signing.signing_key_path(settings),
            f"{signing.SETTING}: agents apply only desired state signed with it; "
            "without it every node must enrol again",
        ),
        CompanionFile(
            "admin token",
            admin_token_path(settings.store),
            "the admin's bearer token; the store keeps only its hash",
        ),
        CompanionFile(
            "models",
            data_dir / "models",
            "the uploaded ONNX files deployments serve",
            always=False,
        ),
        CompanionFile(
            "broker accounts",
            data_dir / EMBEDDED_BROKER_ACCOUNTS_FILE,
            "greenfed up's embedded broker; with Mosquitto, its dynamic-security file",
            always=False,
        ),
    ]


def _companions_text(settings: Settings, *, restoring: bool) -> str:
    lines = [
        "put these back beside it before starting greenfed cloud (a backup holds none of them):"
        if restoring
        else "NOT in the backup: keep copies of these with it, stored apart from it:"
    ]
    for companion in companion_files(settings):
        lines.append(
            f"  {companion.what:<16}{companion.path}{_presence(companion, restoring=restoring)}"
        )
        lines.append(f"  {'':<16}{companion.why}")
    return "\n".join(lines) + "\n"


def _presence(companion: CompanionFile, *, restoring: bool) -> str:
    """What the line says after a companion's path: nothing where it is there."""
    try:
        present = companion.path.exists()
    except OSError as error:
        # A data directory this user may not look into (the control plane's image run
        # with another --user, docs/deploy.md): the backup is made all the same, and
        # the files are listed by where the control plane keeps them.
        return f"  (cannot check: {error.strerror or error})"
    if present:
        return ""
    return "  (MISSING)" if restoring and companion.always else "  (none here)"


def _when(epoch_s: float) -> str:
    """The time as a date, or as its number where no date holds it: a restore's output
    comes after its commit, and must not fail there (the reader refuses such a header)."""
    try:
        return datetime.fromtimestamp(epoch_s, UTC).isoformat(timespec="seconds")
    except (OverflowError, ValueError, OSError):  # past time_t, or the years datetime holds
        return f"{epoch_s!r} (epoch seconds)"


def _size(size_bytes: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size_bytes >= scale:
            return f"{size_bytes / scale:.1f} {unit}"
    return f"{size_bytes} B"


def cmd_store_backup(args: argparse.Namespace, out: TextIO | None = None) -> int:
    from cloud.store import StoreError
    from cloud.store.backup import take_backup
    from cloud.store.backup_file import describe_counts
    from shared import __version__

    out = out or sys.stdout
    settings = load_settings(args.config)
    try:
        report = asyncio.run(take_backup(settings.store, args.file, greenfed_version=__version__))
    except StoreError as error:
        print(f"greenfed: {error}", file=sys.stderr)
        return EXIT_FAILURE
    header = report.header
    out.write(
        f"backup of {header.source} written to {report.path}\n"
        f"  taken {_when(header.created_at)}, schema version {header.schema_version}, "
        f"cluster {header.cluster_id or '(none yet)'}\n"
        f"  {describe_counts(report.rows)}\n"
        f"  {_size(report.size_bytes)} in {report.elapsed_s:.2f} s\n"
    )
    out.write(_companions_text(settings, restoring=False))
    return EXIT_OK


def cmd_store_restore(args: argparse.Namespace, out: TextIO | None = None) -> int:
    from cloud.store import StoreError
    from cloud.store.backup_file import describe_counts
    from cloud.store.restore import restore_backup
    from greenfed.data_dir_lock import data_dir_lock

    out = out or sys.stdout
    settings = load_settings(args.config)
    # No greenfed up or greenfed cloud may use the data directory meanwhile (the store's
    # own locks refuse a scheduling control plane on any database, too).
    with data_dir_lock(settings.store.resolved_data_dir(), "store restore"):
        try:
            report = asyncio.run(restore_backup(settings.store, args.file, force=args.force))
        except StoreError as error:
            print(f"greenfed: {error}", file=sys.stderr)
            return EXIT_FAILURE
    header = report.header
    migrated = (
        f", migrated to {report.migrated_to}" if report.migrated_to != header.schema_version else ""
    )
    if report.replaced is not None:
        out.write(f"replaced what {report.target} held: {report.replaced.describe()}\n")
    out.write(
        f"restored {args.file} into {report.target} in {report.elapsed_s:.2f} s\n"
        f"  taken {_when(header.created_at)} by greenfed {header.greenfed_version} from "
        f"{header.source}\n"
        f"  schema version {header.schema_version}{migrated}, cluster "
        f"{header.cluster_id or '(none yet)'}\n"
        f"  {describe_counts(report.rows)}\n"
    )
    out.write(_companions_text(settings, restoring=True))
    return EXIT_OK


def add_store_commands(commands: Any) -> None:
    """Add `store backup|restore` to `greenfed`'s subparsers."""
    store = commands.add_parser(
        "store", help="back up the control plane's store, or restore a backup"
    )
    store_commands = store.add_subparsers(dest="store_command", required=True, metavar="COMMAND")
    backup = store_commands.add_parser(
        "backup",
        help="write a consistent backup of the store to FILE, while the control plane runs",
    )
    backup.add_argument("file", type=Path, metavar="FILE")
    backup.add_argument("--config", type=Path, help="TOML settings file (its [store] section)")
    backup.set_defaults(handler=cmd_store_backup)
    restore = store_commands.add_parser(
        "restore",
        help="restore a backup into an empty database; no control plane may run on it",
    )
    restore.add_argument("file", type=Path, metavar="FILE")
    restore.add_argument("--config", type=Path, help="TOML settings file (its [store] section)")
    restore.add_argument(
        "--force",
        action="store_true",
        help="replace a database that holds a store (says what it replaced)",
    )
    restore.set_defaults(handler=cmd_store_restore)
