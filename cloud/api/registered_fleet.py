"""The fleet as registered, as a submission's "could this ever run?" check sees it
(cloud/api/refusals.py), built once and kept while it holds.

Building it costs a pass over every node (their scheduler view, then the columns), and
a read of every tenant: per submission that was most of the API's CPU with a thousand
nodes. So the judge is kept, with what each member shape was found to need, and
rebuilt when a node joined or left, or when the registry's state moved
(`NodeRegistry.version`: a node's inventory, state or settings) and the last build is
older than `_REBUILD_AFTER_S`; the tenants alone are read again when read
longer than `_TENANTS_FOR_S` ago (another replica may have changed a quota) or when this
process changed one. A verdict of "never" is only ever given by a
judge as fresh as the registry and the tenants: a job a stale judge refuses is judged
again by a fresh one first. A stale judge's "fits" lets the job wait instead, pending as
`unschedulable` with the scheduler's reason, as any job whose fleet shrank after it was
accepted does.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from cloud.fleet.registry import NodeRegistry
from cloud.loop.nodes import NodeViews
from cloud.scheduler import Snapshot
from cloud.scheduler.model import Tenant, Work
from cloud.scheduler.plan import NeverFits
from cloud.scheduler.unschedulable import FleetFit
from cloud.store import Store
from cloud.work.convert import tenant_from_record

# A registry that keeps changing (nodes coming and going in a large fleet) rebuilds the
# judge's nodes at most this often for submissions that fit.
_REBUILD_AFTER_S: Final = 5.0
# How long tenants read from the store are trusted for a verdict of "fits".
_TENANTS_FOR_S: Final = 2.0


@dataclass(slots=True)
class _Built:
    fit: FleetFit
    registry_version: int
    node_count: int
    built_at: float  # monotonic
    tenants: tuple[Tenant, ...]
    tenant_changes: int  # the store's count when the tenants were read
    tenants_read_at: float  # monotonic


class RegisteredFleet:
    """One per registry: the judge of whether work could ever run on it."""

    def __init__(
        self,
        registry: NodeRegistry,
        store: Store,
        *,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._registry = registry
        self._store = store
        self._monotonic = monotonic
        self._built: _Built | None = None
        self._node_views = NodeViews()
        self.builds = 0  # how many times the nodes were built (tests read it)

    async def never_fits(self, work: Work, now_s: float) -> NeverFits | None:
        built = self._built
        if (
            built is None
            or built.node_count != len(self._registry)
            or (
                built.registry_version != self._registry.version
                and self._monotonic() - built.built_at >= _REBUILD_AFTER_S
            )
        ):
            built = await self._build()
        elif not self._tenants_fresh(built):
            await self._read_tenants(built)
        never = built.fit.at(now_s).never_fits_in_any_shape(work)
        if never is not None and not (
            built.registry_version == self._registry.version and self._tenants_fresh(built)
        ):
            built = await self._build()
            never = built.fit.at(now_s).never_fits_in_any_shape(work)
        return never

    def _tenants_fresh(self, built: _Built) -> bool:
        return (
            built.tenant_changes == self._store.tenant_changes
            and self._monotonic() - built.tenants_read_at < _TENANTS_FOR_S
        )

    async def _tenants(self) -> tuple[tuple[Tenant, ...], int, float]:
        changes, read_at = self._store.tenant_changes, self._monotonic()
        records = await self._store.list_tenants()
        return tuple(t for t in map(tenant_from_record, records) if t is not None), changes, read_at

    async def _read_tenants(self, built: _Built) -> None:
        """Tenants read again; the nodes and what each shape was found to need are kept
        (where a member fits does not depend on quotas)."""
        tenants, built.tenant_changes, built.tenants_read_at = await self._tenants()
        if tenants != built.tenants:
            built.tenants = tenants
            built.fit = built.fit.with_tenants(tenants)

    async def _build(self) -> _Built:
        # The version first: a change while the tenants are read makes the next call
        # look again rather than trust a fleet older than the version it is filed under.
        version, built_at = self._registry.version, self._monotonic()
        records = self._registry.nodes()
        tenants, changes, read_at = await self._tenants()
        snapshot = Snapshot.build(
            now=0.0,  # each verdict is given at its own time (FleetFit.at)
            nodes=self._node_views.of(records),
            tenants=tenants,
        )
        self._built = _Built(
            FleetFit(snapshot), version, len(records), built_at, tenants, changes, read_at
        )
        self.builds += 1
        return self._built


_FLEETS: weakref.WeakKeyDictionary[NodeRegistry, RegisteredFleet] = weakref.WeakKeyDictionary()


def registered_fleet(registry: NodeRegistry, store: Store) -> RegisteredFleet:
    """The registry's judge (made on first use; one registry has one store)."""
    fleet = _FLEETS.get(registry)
    if fleet is None or fleet._store is not store:
        fleet = _FLEETS[registry] = RegisteredFleet(registry, store)
    return fleet
