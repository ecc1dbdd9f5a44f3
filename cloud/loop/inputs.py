"""One scheduling pass's inputs: the registry's nodes and the store's snapshot, as the
scheduler core's `Snapshot`.

What is queued:
- pending work, as submitted;
- a deployment that is placed but short of replicas (some could not be placed, or a
  replica was lost or preempted), for the missing replicas only, accepting any number
  of them (`min_replicas=1`): the replicas it has keep serving.

Work whose stored spec the scheduler can no longer read (written by a newer greenfed,
or refused by a stricter scheduler) is set aside in `unschedulable` with the reason;
the loop fails it instead of failing every pass.

Pending work a person holds or suspended (`WorkRecord.hold`) is not queued until
released or resumed; its reason stays the one the hold gave ("held by alice").

Pending work with dependencies (`depends_on`) is queued only once every one holds; work
still waiting for its jobs, or whose dependency can no longer hold (the loop cancels
it), is held back (`dependencies`, decided by cloud/work/dependencies.py); so are the
tasks of a job array at its throttle (cloud/work/array_throttle.py). An array with room
for fewer tasks than it has ready is queued whole, with its cap (`Snapshot.array_caps`):
the core places no more than the room, of the tasks it can place.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import msgspec

from cloud.fleet.registry import NodeRecord
from cloud.loop.allocations import by_work
from cloud.loop.nodes import NodeViews, pool_model
from cloud.scheduler import Allocation, InferenceDeployment, Snapshot, Tenant, Work
from cloud.store import AllocationRecord, StoreSnapshot, WorkRecord
from cloud.store.states import PLACED_STATES
from cloud.work.array_throttle import ArrayTaskCache, array_throttles, with_throttled
from cloud.work.convert import (
    allocation_from_record,
    running_limits,
    tenant_from_record,
    work_from_record,
)
from cloud.work.dependencies import NOTHING_WAITS, Resolution, resolve
from shared.work_literals import IsolationRequirement


@dataclass(frozen=True, slots=True)
class PassInputs:
    snapshot: Snapshot
    store: StoreSnapshot
    records: Mapping[str, WorkRecord]  # every non-terminal work item, by id
    works: Mapping[str, Work]  # the scheduler's view of each readable item, by id
    allocations: Mapping[str, tuple[AllocationRecord, ...]]  # by work id, member order
    unschedulable: Mapping[str, str]  # work id -> why its spec cannot be scheduled
    nodes: Mapping[str, NodeRecord]  # the registry's records, by node id
    # Pending work held back by its dependencies: still waiting, or to be cancelled.
    dependencies: Resolution = NOTHING_WAITS


def _tenant_names(store: StoreSnapshot) -> dict[str, str]:
    return {tenant.tenant_id: tenant.name for tenant in store.tenants}


class ConversionCache:
    """Converted work by (work id, version): a record's version changes whenever the
    record does, so an entry is valid for as long as its version is current.
    `min_isolation`: the cluster's least isolation for training (`scheduling.min_isolation`)."""

    def __init__(self, min_isolation: IsolationRequirement = "none") -> None:
        self._min_isolation: IsolationRequirement = min_isolation
        self._entries: dict[str, tuple[int, Work | str]] = {}
        self.array_tasks = ArrayTaskCache()  # each job array task's array and throttle

    def convert(self, record: WorkRecord, tenant: str) -> Work | str:
        """The scheduler's view of the record, or why it has none."""
        cached = self._entries.get(record.work_id)
        if cached is not None and cached[0] == record.version:
            return cached[1]
        result: Work | str
        try:
            result = work_from_record(record, tenant=tenant, min_isolation=self._min_isolation)
        except (msgspec.DecodeError, ValueError) as error:  # ValidationError is a DecodeError
            result = f"its stored spec cannot be scheduled: {error}"
        self._entries[record.work_id] = (record.version, result)
        return result

    def retain(self, work_ids: set[str]) -> None:
        for work_id in set(self._entries) - work_ids:
            del self._entries[work_id]
        self.array_tasks.retain(work_ids)


def _convert(
    store: StoreSnapshot, names: Mapping[str, str], cache: ConversionCache
) -> tuple[dict[str, Work], dict[str, str]]:
    works: dict[str, Work] = {}
    unschedulable: dict[str, str] = {}
    for record in store.work:
        converted = cache.convert(record, names.get(record.tenant_id, record.tenant_id))
        if isinstance(converted, str):
            unschedulable[record.work_id] = converted
        else:
            works[record.work_id] = converted
    cache.retain({record.work_id for record in store.work})
    return works, unschedulable


def _queued(
    record: WorkRecord,
    work: Work,
    allocations: tuple[AllocationRecord, ...],
    now: float,
    surge: int = 0,
) -> Work | None:
    """`surge`: replicas a deployment may hold beyond its count while some of them are
    on draining nodes (their replacements, cloud/loop/drain.py). A job waiting out its
    retry backoff (cloud/work/retries.py) is not queued until then."""
    if record.state == "pending":
        # Held or suspended by a person (cloud/store/job_control.py): out until lifted.
        return None if backing_off(record, now) or record.hold is not None else work
    if record.state in PLACED_STATES and isinstance(work, InferenceDeployment):
        missing = work.replicas + surge - len(allocations)
        if missing > 0:
            # Each missing replica takes its share of the load, not all of it.
            share = work.requests_per_s * missing / work.replicas
            return dataclasses.replace(work, replicas=missing, min_replicas=1, requests_per_s=share)
    return None


def backing_off(record: WorkRecord, now: float) -> bool:
    """Pending after a failure, before its retry may be placed."""
    return record.state == "pending" and record.not_before is not None and record.not_before > now


def build_inputs(
    now: float,
    node_records: Iterable[NodeRecord],
    store: StoreSnapshot,
    cache: ConversionCache | None = None,
    surge: Mapping[str, int] | None = None,
    node_views: NodeViews | None = None,
) -> PassInputs:
    nodes = {record.node_id: record for record in node_records}
    names = _tenant_names(store)
    cache = cache or ConversionCache()
    works, unschedulable = _convert(store, names, cache)
    allocations = by_work(store.allocations)
    running: list[Allocation] = [
        allocation_from_record(
            allocation,
            works[allocation.work_id],
            accelerator_model=pool_model(nodes[allocation.node_id], allocation.accelerator_ids),
        )
        for allocation in store.allocations
        # On a node the registry does not know (yet, after a restart; or any more) it
        # takes nothing the scheduler could give away; the loop decides when it is lost.
        if allocation.node_id in nodes and allocation.work_id in works
    ]
    # Tasks of a job array at its throttle wait like work waiting for its jobs; an array
    # with room for some of its ready tasks is queued whole, with its cap for the core.
    throttles = array_throttles(store.work, now, cache.array_tasks)
    dependencies = with_throttled(resolve(store.dependencies), throttles.waiting)
    queue = []
    for record in store.work:
        work = works.get(record.work_id)
        if work is None or (record.state == "pending" and dependencies.holds_back(record.work_id)):
            continue
        queued = _queued(
            record,
            work,
            allocations.get(record.work_id, ()),
            now,
            (surge or {}).get(record.work_id, 0),
        )
        if queued is not None:
            queue.append(queued)
    tenants: list[Tenant] = [
        tenant
        for tenant in (tenant_from_record(record) for record in store.tenants)
        if tenant is not None
    ]
    views = node_views or NodeViews()
    node_list = views.of(nodes.values())  # first: `measured` answers for this call
    snapshot = Snapshot.build(
        now=now,
        nodes=node_list,
        utilisation=views.measured(),
        allocations=running,
        queue=queue,
        tenants=tenants,
        running_limits=running_limits(store.tenants),
        tables=views.tables,
        array_caps=throttles.caps,
    )
    return PassInputs(
        snapshot=snapshot,
        store=store,
        records=MappingProxyType({record.work_id: record for record in store.work}),
        works=MappingProxyType(works),
        allocations=MappingProxyType(allocations),
        unschedulable=MappingProxyType(unschedulable),
        nodes=MappingProxyType(nodes),
        dependencies=dependencies,
    )
