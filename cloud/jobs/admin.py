"""The first admin tenant and where its token goes.

At start the control plane calls `Store.bootstrap_admin()`. When that creates the admin
tenant (a fresh database), its bearer token is written to `<store data dir>/admin-token`
with mode 0600, and the location is logged; the store keeps only the token's hash, so
this file is the only copy. The CLI uses that file when no other token is given.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Final

import structlog

from shared.settings import StoreSettings

if TYPE_CHECKING:  # the CLI reads token files without the database stack
    from cloud.store import Store

ADMIN_TOKEN_FILE_NAME: Final = "admin-token"


def admin_token_path(settings: StoreSettings) -> Path:
    return settings.resolved_data_dir() / ADMIN_TOKEN_FILE_NAME


def write_secret(path: Path, secret: str) -> None:
    """Write `secret` to `path` readable by its owner only, replacing it atomically."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        temporary.unlink()
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(secret + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


async def bootstrap_admin(store: Store, settings: StoreSettings) -> Path:
    """Create the admin tenant if there is none; return where its token is (or was) kept."""
    log = structlog.get_logger("greenfed.cloud")
    path = admin_token_path(settings)
    created = await store.bootstrap_admin()
    if created is None:
        log.info("admin tenant exists", admin_token_file=str(path), file_exists=path.exists())
        return path
    try:
        await asyncio.to_thread(write_secret, path, created.token)
    except OSError as error:
        # The store has only the hash: without this line the token would be lost.
        log.error(
            "could not write the admin token; here it is, keep it safe",
            admin_token_file=str(path),
            error=str(error),
            admin_token=created.token,
        )
        return path
    log.info("admin tenant created", admin_token_file=str(path))
    return path


def read_token_file(path: Path) -> str | None:
    """The token in a token file, or None when there is no such file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    return text.strip() or None
