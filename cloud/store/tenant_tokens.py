"""A tenant's bearer tokens (table `tenant_tokens`): several per tenant, each rotated
with an overlap or revoked on its own.

A token's row outlives its use: a rotated token keeps working until the end of its
overlap (`expires_at`), a revoked one is refused from `revoked_at` on, and either is
then refused with the reason rather than as unknown. The secret's salted scrypt hash is
all that is stored of it (cloud/store/tokens.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

from sqlalchemy import Row, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from cloud.store.errors import TokenNotFoundError
from cloud.store.records import TenantRecord
from cloud.store.rows import tenant_from_row
from cloud.store.schema import tenant_tokens, tenants
from cloud.store.tokens import IssuedToken

# active: works; rotated: replaced, works until `expires_at`; expired: rotated and its
# overlap over; revoked: refused since `revoked_at`.
TokenState = Literal["active", "rotated", "expired", "revoked"]


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenRecord:
    token_id: str  # not secret: the `<token id>` of `gf_<token id>_<secret>`
    tenant_id: str
    name: str  # a label its owner chose ("ci", "laptop"); "initial" for the first
    created_at: float
    created_by: str | None  # the tenant who made it, by name (None: with its tenant)
    expires_at: float | None  # set by rotation: the end of the overlap
    rotated_at: float | None
    replaced_by: str | None  # the id of the token that replaced it
    revoked_at: float | None
    last_used_at: float | None  # updated at most once per `store.token_cache_s`

    def state(self, now: float) -> TokenState:
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and now >= self.expires_at:
            return "expired"
        if self.rotated_at is not None:
            return "rotated"
        return "active"

    def works(self, now: float) -> bool:
        return self.state(now) in ("active", "rotated")

    def lasts(self, now: float) -> bool:
        """Works with no end set: neither revoked nor rotated (a rotated token works only
        until its overlap ends)."""
        return self.state(now) == "active"


@dataclass(frozen=True, slots=True)
class CreatedToken:
    record: TokenRecord
    token: str  # the only time it is visible; the store keeps its hash


@dataclass(frozen=True, slots=True)
class RotatedToken:
    old: TokenRecord  # as it is now: rotated, working until its `expires_at`
    new: CreatedToken


@dataclass(frozen=True, slots=True)
class Authenticated:
    tenant: TenantRecord
    token: TokenRecord


@dataclass(frozen=True, slots=True)
class TokenRefused:
    """A token of ours whose secret matched, but which no longer works: its `state`
    (revoked or expired) says why."""

    token: TokenRecord


@dataclass(frozen=True, slots=True)
class TokenThrottled:
    """A secret left unchecked for now: its token id has had as many scrypts lately as
    it may (`ScryptBudget`). Neither accepted nor refused: ask again after
    `retry_after_s`."""

    retry_after_s: float


# What a bearer token is worth: a tenant, a refusal with its reason, "ask again later",
# or None (malformed, unknown, or a wrong secret: indistinguishable to the caller).
TokenCheck = Authenticated | TokenRefused | TokenThrottled | None

# Secrets that this process has not verified before, per token id: the first
# FREE_SCRYPTS_PER_WINDOW in a window are hashed at once; past them, one may start every
# THROTTLED_SCRYPT_INTERVAL_S, and one that would wait longer than MAX_TURN_WAIT_S for
# its turn is throttled (429) unchecked.
FREE_SCRYPTS_PER_WINDOW: Final = 10
SCRYPT_WINDOW_S: Final = 60.0
THROTTLED_SCRYPT_INTERVAL_S: Final = 2.0
MAX_TURN_WAIT_S: Final = 2.0
_BUDGET_ENTRIES: Final = 4096


@dataclass(slots=True)
class _Spent:
    window_start: float  # monotonic
    scrypts: int  # started in this window
    next_turn_at: float  # past the free ones: when the next may start


class ScryptBudget:
    """How much scrypt work the secrets of one token id may cost this process.

    Token ids are not secret, so anyone may send secrets for one, and each secret the
    process has not verified before costs a scrypt. Past the free ones, the id gets a
    turn every THROTTLED_SCRYPT_INTERVAL_S: a flood of guesses costs ten scrypts a minute
    and one every two seconds, not one per request. A secret is never refused for the
    flood, only told to ask again (`TokenThrottled`): the owner's secret, new to a
    restarted or another replica, is verified at its next free turn, so guesses cannot
    refuse the owner. (While a flood takes every turn, the owner waits with it: only a
    rate limit in front of the control plane tells the two apart.)
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._spent: dict[str, _Spent] = {}

    def claim(self, token_id: str) -> float | TokenThrottled:
        """A scrypt for one of the id's secrets: the seconds to wait before starting it
        (0: at once), or `TokenThrottled` when no turn is free within MAX_TURN_WAIT_S."""
        now = self._clock()
        spent = self._spent.get(token_id)
        if spent is None or now - spent.window_start >= SCRYPT_WINDOW_S:
            spent = _Spent(window_start=now, scrypts=0, next_turn_at=now)
            self._spent[token_id] = spent
            self._forget_old(now)
        if spent.scrypts < FREE_SCRYPTS_PER_WINDOW:
            spent.scrypts += 1
            return 0.0
        turn_at = max(now, spent.next_turn_at)
        if turn_at - now > MAX_TURN_WAIT_S:
            return TokenThrottled(retry_after_s=turn_at - MAX_TURN_WAIT_S - now)
        spent.scrypts += 1
        spent.next_turn_at = turn_at + THROTTLED_SCRYPT_INTERVAL_S
        return turn_at - now

    def _forget_old(self, now: float) -> None:
        if len(self._spent) <= _BUDGET_ENTRIES:
            return
        self._spent = {
            token_id: spent
            for token_id, spent in self._spent.items()
            if now - spent.window_start < SCRYPT_WINDOW_S or spent.next_turn_at > now
        }


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def token_from_row(row: Row[Any]) -> TokenRecord:
    return TokenRecord(
        token_id=row.id,
        tenant_id=row.tenant_id,
        name=row.name,
        created_at=float(row.created_at),
        created_by=row.created_by,
        expires_at=_float(row.expires_at),
        rotated_at=_float(row.rotated_at),
        replaced_by=row.replaced_by,
        revoked_at=_float(row.revoked_at),
        last_used_at=_float(row.last_used_at),
    )


async def insert_token(
    connection: AsyncConnection,
    tenant_id: str,
    name: str,
    issued: IssuedToken,
    now: float,
    created_by: str | None,
) -> TokenRecord:
    record = TokenRecord(
        token_id=issued.token_id,
        tenant_id=tenant_id,
        name=name,
        created_at=now,
        created_by=created_by,
        expires_at=None,
        rotated_at=None,
        replaced_by=None,
        revoked_at=None,
        last_used_at=None,
    )
    await connection.execute(
        insert(tenant_tokens).values(
            id=issued.token_id,
            tenant_id=tenant_id,
            name=name,
            secret_hash=issued.secret_hash,
            created_at=now,
            created_by=created_by,
        )
    )
    return record


async def select_tokens(
    connection: AsyncConnection, tenant_id: str | None
) -> tuple[TokenRecord, ...]:
    """A tenant's tokens (every tenant's with None), oldest first; no secrets."""
    query = select(tenant_tokens)
    if tenant_id is not None:
        query = query.where(tenant_tokens.c.tenant_id == tenant_id)
    query = query.order_by(tenant_tokens.c.created_at, tenant_tokens.c.id)
    return tuple(token_from_row(row) for row in await connection.execute(query))


async def select_token(
    connection: AsyncConnection, token_id: str, *, for_update: bool = False
) -> TokenRecord:
    """Raises `TokenNotFoundError`."""
    query = select(tenant_tokens).where(tenant_tokens.c.id == token_id)
    if for_update:
        query = query.with_for_update()
    row = (await connection.execute(query)).first()
    if row is None:
        raise TokenNotFoundError(token_id)
    return token_from_row(row)


async def lock_tenant_tokens(connection: AsyncConnection, tenant_id: str) -> bool:
    """Lock the tenant's row until the transaction ends (PostgreSQL; SQLite's writes
    are serialised anyway), so that what is decided from its tokens' states is decided
    by one transaction at a time; whether the tenant is an admin.

    FOR NO KEY UPDATE: rows that refer to the tenant (a new token, submitted work) only
    take a key share lock on it, which this does not block."""
    query = select(tenants.c.admin).where(tenants.c.id == tenant_id).with_for_update(key_share=True)
    return bool((await connection.execute(query)).scalar_one())


async def select_for_authentication(
    connection: AsyncConnection, token_id: str
) -> tuple[str, TokenRecord, TenantRecord] | None:
    """(stored secret hash, token, its tenant); the caller verifies the secret. Two
    primary-key reads, made only when the token is not in the cache."""
    row = (
        await connection.execute(select(tenant_tokens).where(tenant_tokens.c.id == token_id))
    ).first()
    if row is None:
        return None
    owner = (await connection.execute(select(tenants).where(tenants.c.id == row.tenant_id))).one()
    return str(row.secret_hash), token_from_row(row), tenant_from_row(owner)


async def mark_rotated(
    connection: AsyncConnection, token_id: str, replaced_by: str, now: float, expires_at: float
) -> None:
    await connection.execute(
        update(tenant_tokens)
        .where(tenant_tokens.c.id == token_id)
        .values(rotated_at=now, replaced_by=replaced_by, expires_at=expires_at)
    )


async def mark_revoked(connection: AsyncConnection, token_id: str, now: float) -> None:
    await connection.execute(
        update(tenant_tokens)
        .where(tenant_tokens.c.id == token_id, tenant_tokens.c.revoked_at.is_(None))
        .values(revoked_at=now)
    )


async def mark_used(connection: AsyncConnection, token_id: str, now: float) -> None:
    await connection.execute(
        update(tenant_tokens).where(tenant_tokens.c.id == token_id).values(last_used_at=now)
    )
