"""PostgreSQL advisory lock keys, one per purpose and per schema.

Two greenfed installations in different schemas of one database (tests do this)
must not share a scheduler leader or wait for each other's migrations, so the key
is derived from the schema as well as the purpose.
"""

from __future__ import annotations

import hashlib
from typing import Final, Literal

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncConnection

# "clusters": registrations counted against their cap and added as one step.
# "replica": held shared by every running control plane (its change listener's
# connection, cloud/store/change_notify.py) and tried exclusively by a restore, which
# refuses to replace a store that one of them serves (cloud/store/restore.py).
LockPurpose = Literal["migrate", "leader", "events", "clusters", "replica"]
DEFAULT_NAMESPACE: Final = "public"


def advisory_key(namespace: str, purpose: LockPurpose) -> int:
    """A stable signed 64-bit key, as `pg_advisory_lock(bigint)` takes."""
    digest = hashlib.blake2b(f"greenfed:{namespace}:{purpose}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


async def current_namespace(connection: AsyncConnection) -> str:
    schema = (await connection.execute(select(func.current_schema()))).scalar()
    return str(schema) if schema else DEFAULT_NAMESPACE
