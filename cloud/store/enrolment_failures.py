"""Refused join tokens per remote address, as a token bucket every replica of the control
plane shares (table `enrolment_failures`): `burst` refusals at once, then one more per
`1 / refill_per_s` seconds. A row that has refilled completely says nothing an absent
row does not, so rows are deleted once they have (the table holds only addresses
refused within the last `burst / refill_per_s` seconds, however many there are)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import case, delete, literal, select
from sqlalchemy.ext.asyncio import AsyncConnection

from cloud.store.engine import Backend
from cloud.store.schema import enrolment_failures
from cloud.store.sql import dialect_insert


@dataclass(frozen=True, slots=True)
class FailureBudget:
    burst: int = 10
    refill_per_s: float = 0.2

    @property
    def full_after_s(self) -> float:
        return self.burst / self.refill_per_s


async def retry_after_s(
    connection: AsyncConnection, address: str, now: float, budget: FailureBudget
) -> float:
    """0 when `address` may be refused once more now, else how long until it may."""
    row = (
        await connection.execute(
            select(enrolment_failures.c.tokens, enrolment_failures.c.updated_at).where(
                enrolment_failures.c.address == address
            )
        )
    ).first()
    if row is None:
        return 0.0
    tokens = min(
        float(budget.burst),
        float(row.tokens) + max(0.0, now - row.updated_at) * budget.refill_per_s,
    )
    return 0.0 if tokens >= 1 else (1 - tokens) / budget.refill_per_s


async def record_failure(
    connection: AsyncConnection, backend: Backend, address: str, now: float, budget: FailureBudget
) -> None:
    """Take one token from `address`'s bucket, atomically (two replicas refusing at once
    both count), and drop the buckets that have refilled."""
    table = enrolment_failures
    # The bucket as it stands now, less one, within [0, burst].
    refilled = table.c.tokens + (literal(now) - table.c.updated_at) * budget.refill_per_s
    capped = case((refilled > budget.burst, float(budget.burst)), else_=refilled)
    taken = case((capped < 1, 0.0), else_=capped - 1)
    insert = dialect_insert(backend, table)
    await connection.execute(
        insert.values(
            address=address, tokens=float(budget.burst - 1), updated_at=now
        ).on_conflict_do_update(
            index_elements=["address"], set_={"tokens": taken, "updated_at": now}
        )
    )
    await connection.execute(delete(table).where(table.c.updated_at < now - budget.full_after_s))
