"""The first admin tenant and where its token goes.

At start the control plane calls `Store.bootstrap_admin()`. When that creates the admin
tenant (a fresh database), its bearer token is written to `<store data dir>/admin-token`
with mode 0600, and the location is logged; the store keeps only the token's hash, so
this file is the only copy. The CLI uses that file when no other token is given.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from shared.settings import StoreSettings
from shared.token_files import admin_token_path, write_secret

if TYPE_CHECKING:  # loaded by the app, which has the store anyway
    from cloud.store import Store


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
