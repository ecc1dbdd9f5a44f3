"""The fleet as registered, as a submission's "could this ever run?" check sees it
(cloud/api/refusals.py), built once and kept while it holds.

Building it costs a pass over every node (their scheduler view, then the columns), and
a read of every tenant: per submission that was most of the API's CPU with a thousand
nodes. So the judge is kept, with what each member shape was found to need, and
rebuilt when it may have gone stale: the registry's membership or state moved
(`NodeRegistry.version`) and the last build is older than `_REBUILD_AFTER_S`, the
tenants were read longer than `_TENANTS_FOR_S` ago (another replica may have changed a
quota), or this process changed a tenant. A verdict of "never" is only ever given by a
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
from cloud.loop.nodes import scheduler_nodes
from cloud.scheduler import Snapshot
from cloud.scheduler.model import Work
from cloud.scheduler.plan import NeverFits
from cloud.scheduler.unschedulable import FleetFit
from cloud.store import Store
from cloud.work.convert import tenant_from_record

# A registry that keeps changing (nodes coming and going in a large fleet) rebuilds the
# judge at most this often for submissions that fit.
_REBUILD_AFTER_S: Final = 1.0
# How long tenants read from the store are trusted for a verdict of "fits".
_TENANTS_FOR_S: Final = 2.0


@dataclass(slots=True)
class _Built:
    fit: FleetFit
    registry_version: int
    tenant_changes: int  # the store's count when the tenants were read
    built_at: float  # monotonic


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
        self.builds = 0  # how many times the fleet was built (tests read it)

    async def never_fits(self, work: Work, now_s: float) -> NeverFits | None:
        built = self._built
        if built is None or self._worth_rebuilding(built):
            built = await self._build()
        never = built.fit.at(now_s).never_fits(work)
        if never is not None and not self._fresh(built):
            built = await self._build()
            never = built.fit.at(now_s).never_fits(work)
        return never

    def _fresh(self, built: _Built) -> bool:
        return (
            built.registry_version == self._registry.version
            and built.tenant_changes == self._store.tenant_changes
            and self._monotonic() - built.built_at < _TENANTS_FOR_S
        )

    def _worth_rebuilding(self, built: _Built) -> bool:
        age_s = self._monotonic() - built.built_at
        if age_s >= _TENANTS_FOR_S or built.tenant_changes != self._store.tenant_changes:
            return True
        return built.registry_version != self._registry.version and age_s >= _REBUILD_AFTER_S

    async def _build(self) -> _Built:
        # The version first: a change while the tenants are read makes the next call
        # look again rather than trust a fleet older than the version it is filed under.
        version, tenant_changes = self._registry.version, self._store.tenant_changes
        tenants = await self._store.list_tenants()
        snapshot = Snapshot.build(
            now=0.0,  # each verdict is given at its own time (FleetFit.at)
            nodes=scheduler_nodes(self._registry.nodes()),
            tenants=[t for t in map(tenant_from_record, tenants) if t is not None],
        )
        self._built = _Built(FleetFit(snapshot), version, tenant_changes, self._monotonic())
        self.builds += 1
        return self._built


_FLEETS: weakref.WeakKeyDictionary[NodeRegistry, RegisteredFleet] = weakref.WeakKeyDictionary()


def registered_fleet(registry: NodeRegistry, store: Store) -> RegisteredFleet:
    """The registry's judge (made on first use; one registry has one store)."""
    fleet = _FLEETS.get(registry)
    if fleet is None or fleet._store is not store:
        fleet = _FLEETS[registry] = RegisteredFleet(registry, store)
    return fleet
