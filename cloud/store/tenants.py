"""Tenant rows and bearer-token authentication."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from sqlalchemy import insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from cloud.store.errors import TenantExistsError, TenantNotFoundError
from cloud.store.records import ACCELERATOR_KINDS, NewTenant, TenantRecord
from cloud.store.rows import encode_json, quotas_json, tenant_from_row
from cloud.store.schema import tenants
from cloud.store.tokens import IssuedToken, issue_token

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
CACHE_ENTRIES: Final = 4096


def check_new_tenant(tenant: NewTenant) -> None:
    if not _NAME.match(tenant.name):
        raise ValueError(f"tenant name {tenant.name!r} must match [a-z0-9][a-z0-9._-]{{0,62}}")
    for what, quotas in (("quotas", tenant.quotas), ("borrowing_limit", tenant.borrowing_limit)):
        for kind, count in quotas.items():
            if kind not in ACCELERATOR_KINDS:
                raise ValueError(f"{what}: unknown accelerator kind {kind!r}")
            if count < 0:
                raise ValueError(f"{what}: {kind} must not be negative")
    if not tenant.allowed_priorities:
        raise ValueError("allowed_priorities must name at least one priority class")


async def insert_tenant(
    connection: AsyncConnection, tenant_id: str, tenant: NewTenant, now: float
) -> tuple[TenantRecord, str]:
    """The new record and its bearer token (issued here, only its hash is stored)."""
    check_new_tenant(tenant)
    issued = await asyncio.to_thread(issue_token)  # scrypt: off the event loop
    try:
        await connection.execute(
            insert(tenants).values(
                id=tenant_id,
                name=tenant.name,
                token_id=issued.token_id,
                token_hash=issued.secret_hash,
                quotas=quotas_json(tenant.quotas),
                borrowing_limit=quotas_json(tenant.borrowing_limit),
                cohort=tenant.cohort,
                allowed_priorities=encode_json(list(tenant.allowed_priorities)),
                admin=tenant.admin,
                created_at=now,
            )
        )
    except IntegrityError:
        raise TenantExistsError(tenant.name) from None
    record = TenantRecord(
        tenant_id=tenant_id,
        name=tenant.name,
        quotas=tenant.quotas,
        borrowing_limit=tenant.borrowing_limit,
        cohort=tenant.cohort,
        allowed_priorities=tenant.allowed_priorities,
        admin=tenant.admin,
        created_at=now,
    )
    return record, issued.token


async def replace_token(connection: AsyncConnection, tenant_id: str) -> IssuedToken:
    issued = await asyncio.to_thread(issue_token)
    result = await connection.execute(
        update(tenants)
        .where(tenants.c.id == tenant_id)
        .values(token_id=issued.token_id, token_hash=issued.secret_hash)
    )
    if result.rowcount != 1:
        raise TenantNotFoundError(tenant_id)
    return issued


@dataclass(frozen=True, slots=True)
class _Verified:
    token_digest: bytes
    tenant: TenantRecord
    expires_at: float  # monotonic


class TokenCache:
    """Tokens verified recently, so that a request costs a SHA-256 rather than a scrypt.

    A rotated token stops working at once in this process and within `ttl_s` in others.
    """

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl_s = ttl_s
        self._clock = clock
        self._entries: OrderedDict[str, _Verified] = OrderedDict()

    def get(self, token_id: str, token: str) -> TenantRecord | None:
        entry = self._entries.get(token_id)
        if entry is None:
            return None
        if entry.expires_at <= self._clock():
            del self._entries[token_id]
            return None
        if not hmac.compare_digest(entry.token_digest, hashlib.sha256(token.encode()).digest()):
            return None
        self._entries.move_to_end(token_id)
        return entry.tenant

    def put(self, token_id: str, token: str, tenant: TenantRecord) -> None:
        if self._ttl_s <= 0:
            return
        digest = hashlib.sha256(token.encode()).digest()
        self._entries[token_id] = _Verified(digest, tenant, self._clock() + self._ttl_s)
        self._entries.move_to_end(token_id)
        while len(self._entries) > CACHE_ENTRIES:
            self._entries.popitem(last=False)

    def forget_tenant(self, tenant_id: str) -> None:
        for token_id in [k for k, v in self._entries.items() if v.tenant.tenant_id == tenant_id]:
            del self._entries[token_id]


async def select_by_token_id(
    connection: AsyncConnection, token_id: str
) -> tuple[str, TenantRecord] | None:
    """(stored secret hash, tenant) for a token id; the caller verifies the secret."""
    row = (await connection.execute(select(tenants).where(tenants.c.token_id == token_id))).first()
    return None if row is None else (row.token_hash, tenant_from_row(row))
