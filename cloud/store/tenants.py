"""Tenant rows (quotas, caps, cohort) and the cache of verified bearer tokens."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from sqlalchemy import insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from cloud.store.errors import TenantExistsError, TenantNotFoundError
from cloud.store.records import ACCELERATOR_KINDS, NewTenant, TenantChanges, TenantRecord
from cloud.store.rows import encode_json, quotas_json, tenant_from_row
from cloud.store.schema import tenants
from cloud.store.tenant_tokens import Authenticated, TokenCheck, TokenRefused, insert_token
from cloud.store.tokens import issue_token
from shared.messages import AcceleratorKind
from shared.mig_profiles import is_quota_resource
from shared.work_literals import PriorityClass

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
CACHE_ENTRIES: Final = 4096
FIRST_TOKEN_NAME: Final = "initial"


def check_limits(
    *,
    quotas: Mapping[AcceleratorKind, int] | Mapping[str, int],
    borrowing_limit: Mapping[AcceleratorKind, int],
    allowed_priorities: tuple[PriorityClass, ...],
    max_running: int | None,
    max_queued: int | None,
    lending_limit: Mapping[AcceleratorKind, int] | None = None,
) -> None:
    for what, counts in (
        ("quotas", quotas),
        ("borrowing_limit", borrowing_limit),
        ("lending_limit", lending_limit or {}),
    ):
        for kind, count in counts.items():
            # Quotas may also name a MIG profile's slices; limits are per kind only.
            slices = what == "quotas" and is_quota_resource(kind)
            if kind not in ACCELERATOR_KINDS and not slices:
                raise ValueError(f"{what}: unknown accelerator kind {kind!r}")
            if count < 0:
                raise ValueError(f"{what}: {kind} must not be negative")
    if not allowed_priorities:
        raise ValueError("allowed_priorities must name at least one priority class")
    for what, cap in (("max_running", max_running), ("max_queued", max_queued)):
        if cap is not None and cap < 0:
            raise ValueError(f"{what} must not be negative")


def check_new_tenant(tenant: NewTenant) -> None:
    if not _NAME.match(tenant.name):
        raise ValueError(f"tenant name {tenant.name!r} must match [a-z0-9][a-z0-9._-]{{0,62}}")
    check_limits(
        quotas=tenant.quotas,
        borrowing_limit=tenant.borrowing_limit,
        allowed_priorities=tenant.allowed_priorities,
        max_running=tenant.max_running,
        max_queued=tenant.max_queued,
        lending_limit=tenant.lending_limit,
    )


async def insert_tenant(
    connection: AsyncConnection,
    tenant_id: str,
    tenant: NewTenant,
    now: float,
    created_by: str | None = None,
) -> tuple[TenantRecord, str]:
    """The new record and its first bearer token (issued here, only its hash is stored)."""
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
                max_running=tenant.max_running,
                max_queued=tenant.max_queued,
                lending_limit=quotas_json(tenant.lending_limit),
            )
        )
    except IntegrityError:
        raise TenantExistsError(tenant.name) from None
    await insert_token(connection, tenant_id, FIRST_TOKEN_NAME, issued, now, created_by)
    record = TenantRecord(
        tenant_id=tenant_id,
        name=tenant.name,
        quotas=tenant.quotas,
        borrowing_limit=tenant.borrowing_limit,
        cohort=tenant.cohort,
        allowed_priorities=tenant.allowed_priorities,
        admin=tenant.admin,
        created_at=now,
        max_running=tenant.max_running,
        max_queued=tenant.max_queued,
        lending_limit=tenant.lending_limit,
    )
    return record, issued.token


async def change_tenant(
    connection: AsyncConnection, tenant_id: str, changes: TenantChanges
) -> tuple[TenantRecord, TenantRecord]:
    """(before, after): the tenant's row changed under a row lock; raises
    `TenantNotFoundError`, ValueError for values that cannot be stored."""
    query = select(tenants).where(tenants.c.id == tenant_id).with_for_update()
    row = (await connection.execute(query)).first()
    if row is None:
        raise TenantNotFoundError(tenant_id)
    before = tenant_from_row(row)
    after = changes.applied_to(before)
    check_limits(
        quotas=after.quotas,
        borrowing_limit=after.borrowing_limit,
        allowed_priorities=after.allowed_priorities,
        max_running=after.max_running,
        max_queued=after.max_queued,
        lending_limit=after.lending_limit,
    )
    await connection.execute(
        update(tenants)
        .where(tenants.c.id == tenant_id)
        .values(
            quotas=quotas_json(after.quotas),
            borrowing_limit=quotas_json(after.borrowing_limit),
            cohort=after.cohort,
            allowed_priorities=encode_json(list(after.allowed_priorities)),
            max_running=after.max_running,
            max_queued=after.max_queued,
            lending_limit=quotas_json(after.lending_limit),
        )
    )
    return before, after


@dataclass(frozen=True, slots=True)
class _Verified:
    token_digest: bytes
    verdict: Authenticated | TokenRefused
    expires_at: float  # monotonic


class TokenCache:
    """Verdicts on tokens verified recently (accepted, or refused with a reason), so that
    a request costs a SHA-256 rather than a scrypt.

    A token revoked or rotated here, or a tenant changed here, is forgotten at once;
    other processes see the change within `ttl_s`. A verification that began before
    such a change is not cached (`epoch`): it read the token's row before the change.

    It also remembers, beyond `ttl_s`, the digest of each token id's secret once it was
    verified (`known_good`: a token's secret never changes, so a digest match needs no
    scrypt once its row has been read again; the scrypts of other secrets are rationed,
    cloud/store/tenant_tokens.py `ScryptBudget`).
    """

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl_s = ttl_s
        self._clock = clock
        self._entries: OrderedDict[str, _Verified] = OrderedDict()
        self._known_good: OrderedDict[str, bytes] = OrderedDict()
        self.epoch = 0

    def get(self, token_id: str, token: str) -> TokenCheck:
        entry = self._entries.get(token_id)
        if entry is None:
            return None
        if entry.expires_at <= self._clock():
            del self._entries[token_id]
            return None
        if not hmac.compare_digest(entry.token_digest, _digest(token)):
            return None
        self._entries.move_to_end(token_id)
        return entry.verdict

    def put(
        self, token_id: str, token: str, verdict: Authenticated | TokenRefused, epoch: int
    ) -> None:
        """Cache a verdict reached by a verification that began at `epoch`."""
        digest = _digest(token)
        self._known_good[token_id] = digest
        self._known_good.move_to_end(token_id)
        while len(self._known_good) > CACHE_ENTRIES:
            self._known_good.popitem(last=False)
        if self._ttl_s <= 0 or epoch != self.epoch:
            return
        self._entries[token_id] = _Verified(digest, verdict, self._clock() + self._ttl_s)
        self._entries.move_to_end(token_id)
        while len(self._entries) > CACHE_ENTRIES:
            self._entries.popitem(last=False)

    def known_good(self, token_id: str, token: str) -> bool:
        """This token's secret was verified for its id before (no scrypt needed)."""
        digest = self._known_good.get(token_id)
        return digest is not None and hmac.compare_digest(digest, _digest(token))

    def forget(self, token_id: str) -> None:
        self.epoch += 1
        self._entries.pop(token_id, None)

    def forget_tenant(self, tenant_id: str) -> None:
        self.epoch += 1
        for token_id in [
            key
            for key, entry in self._entries.items()
            if entry.verdict.token.tenant_id == tenant_id
        ]:
            del self._entries[token_id]


def _digest(token: str) -> bytes:
    # surrogateescape: a header's undecodable bytes arrive as surrogates
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
