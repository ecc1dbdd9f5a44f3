"""The scheduling loop's side of fair share: each tenant's decayed past usage, advanced
every pass from what its allocations hold, handed to the scheduler in the snapshot with
the configured cohort tree, and written to the store now and then (`fair_share_usage`)
so that a new leader goes on from it and the API shows it (`greenfed tenants`).

Between two passes a tenant is taken to have held what it holds at the later one; the
passes are seconds apart, the half-life days (`scheduling.fair_share_half_life_s`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Final, Protocol

from cloud.loop.inputs import PassInputs
from cloud.scheduler import KINDS, Allocation, Cohort
from cloud.scheduler.fair_share import DecayedUsage, kind_usage
from cloud.store.fair_share import FairShareRow
from shared.settings import CohortSettings

PERSIST_INTERVAL_S: Final = 30.0
_KIND_CODE: Final = {kind: k for k, kind in enumerate(KINDS)}


class FairShareStore(Protocol):
    async def fair_share_usage(self) -> dict[str, FairShareRow]: ...
    async def put_fair_share_usage(self, rows: list[FairShareRow]) -> None: ...


def scheduler_cohorts(cohorts: Mapping[str, CohortSettings]) -> tuple[Cohort, ...]:
    """The settings' cohort tree as the scheduler's records."""
    return tuple(
        Cohort(
            name=name,
            parent=cohort.parent,
            nominal=cohort.quotas,
            borrowing_limit=cohort.borrowing_limit,
            lending_limit=cohort.lending_limit,
        )
        for name, cohort in sorted(cohorts.items())
    )


def held_by_tenant(allocations: Sequence[Allocation]) -> dict[str, list[int]]:
    """Tenant name -> accelerators held per kind (KINDS order)."""
    held: dict[str, list[int]] = {}
    for alloc in allocations:
        counts = held.setdefault(alloc.tenant, [0] * len(KINDS))
        counts[_KIND_CODE[alloc.accelerator_kind]] += alloc.accelerators
    return held


class FairShareLedger:
    def __init__(
        self,
        half_life_s: float,
        cohorts: Mapping[str, CohortSettings],
        persist_interval_s: float = PERSIST_INTERVAL_S,
    ) -> None:
        self._half_life_s = half_life_s
        self._cohorts = scheduler_cohorts(cohorts)
        self._persist_interval_s = persist_interval_s
        self._usage: dict[str, DecayedUsage] = {}
        self._loaded: dict[str, DecayedUsage] | None = None
        self._persisted_at = -math.inf
        self._persisted_names: set[str] = set()

    async def load(self, store: FairShareStore) -> None:
        """Once, before the first pass: the history the previous leader wrote."""
        if self._loaded is not None:
            return
        rows = await store.fair_share_usage()
        self._loaded = {
            name: DecayedUsage(kind_usage(row.accelerator_seconds), row.as_of)
            for name, row in rows.items()
        }

    @property
    def loaded(self) -> bool:
        """Whether `load` ran: until then the ledger knows no tenant's past."""
        return self._loaded is not None

    def applied(self, inputs: PassInputs, now: float) -> PassInputs:
        """``inputs`` with the cohort tree and every tenant's decayed usage as of ``now``,
        after adding what the snapshot's allocations hold."""
        usage = self._advanced(inputs, now)
        # Replaced, never changed in place: a dry run (`preview`) or `persist` reading
        # the previous one meanwhile reads a whole pass's figures.
        self._usage = usage
        if self._loaded:
            self._loaded = {}  # folded into `usage`
        return self._with_usage(inputs, usage, now)

    def preview(self, inputs: PassInputs, now: float) -> PassInputs:
        """``inputs`` as `applied` would make them now, with the accumulators left as
        they are: a dry run sees what a pass would, and counts nothing."""
        return self._with_usage(inputs, self._advanced(inputs, now), now)

    def _advanced(self, inputs: PassInputs, now: float) -> dict[str, DecayedUsage]:
        """Every tenant's accumulator advanced to ``now`` (a new dict)."""
        loaded, usage = self._loaded, dict(self._usage)
        if loaded:
            # What happened while no leader counted is unknown: decayed, nothing added.
            zero = [0] * len(KINDS)
            for name, loaded_usage in loaded.items():
                usage[name] = loaded_usage.advanced(now, zero, self._half_life_s)
        held = held_by_tenant(inputs.snapshot.allocations)
        nothing = [0] * len(KINDS)
        for name in set(usage) | set(held):
            before = usage.get(name) or DecayedUsage.empty(now)
            usage[name] = before.advanced(now, held.get(name, nothing), self._half_life_s)
        return usage

    def _with_usage(
        self, inputs: PassInputs, usage: Mapping[str, DecayedUsage], now: float
    ) -> PassInputs:
        past = {
            name: average
            for name, tenant_usage in sorted(usage.items())
            if any(average := tenant_usage.average(now, self._half_life_s))
        }
        snapshot = inputs.snapshot
        if past or self._cohorts:
            snapshot = dataclasses.replace(
                snapshot,
                past_usage=past,
                cohorts={cohort.name: cohort for cohort in self._cohorts},
            )
        return dataclasses.replace(inputs, snapshot=snapshot)

    async def persist(self, store: FairShareStore, monotonic_now: float) -> None:
        """Write the accumulators every ``persist_interval_s``, and at once when a tenant
        has usage for the first time (the API shows it without waiting)."""
        counted = {name for name, usage in self._usage.items() if any(usage.accelerator_seconds)}
        due = monotonic_now - self._persisted_at >= self._persist_interval_s
        if not counted or not (due or counted - self._persisted_names):
            return
        self._persisted_at = monotonic_now
        self._persisted_names = counted
        rows = [
            FairShareRow(
                tenant=name,
                accelerator_seconds={
                    kind: value
                    for kind, value in zip(KINDS, usage.accelerator_seconds, strict=True)
                    if value
                },
                as_of=usage.as_of,
            )
            for name, usage in sorted(self._usage.items())
        ]
        await store.put_fair_share_usage(rows)
