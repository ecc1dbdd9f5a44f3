"""The mutable working copy of the cluster during one pass.

Built once from the snapshot, then updated incrementally: placing or evicting one
allocation touches one node's entries, never a whole column. Every change appends
the node to ``change_log`` so cached scores (``candidates.py``) refresh only the
nodes that changed. ``allocate`` and ``evict`` are exact inverses (integers only),
which is what lets a ``Statement`` undo a tentative gang or preemption.
"""

from __future__ import annotations

from typing import Final, NamedTuple

import numpy as np

from shared.mig_profiles import mig_profile_of

from .arrays import FloatArray, IntArray
from .model import KIND_INDEX, KINDS, PRIORITY_LEVELS, PRIORITY_RANK, Held
from .snapshot import CPU_COLUMN, Snapshot

NO_RESERVATION: Final = float("inf")
CPU_KIND: Final = KIND_INDEX["cpu"]  # quota usage is per kind, indexed like KINDS
UNLIMITED_SLACK: Final = 1 << 60


class ReservedSpan(NamedTuple):
    """What one reservation holds on one node until its job would end."""

    node: int
    end_s: float
    accelerators: int
    host_memory_bytes: int


class ClusterState:
    def __init__(self, snapshot: Snapshot) -> None:
        nodes = snapshot.nodes
        n = len(nodes)
        columns = range(len(nodes.kinds))  # pool columns (snapshot.py); per kind in clusters
        # without MIG slices beside whole GPUs. Quota usage is counted per kind.
        self.column_kinds = nodes.column_kinds
        self.snapshot = snapshot
        self.now = snapshot.now
        self.free: list[IntArray] = [kind.free.copy() for kind in nodes.kinds]
        self.inv_capacity: list[FloatArray] = [
            np.divide(1.0, kind.capacity, out=np.zeros(n), where=kind.capacity > 0)
            for kind in nodes.kinds
        ]
        # Accelerators added (+) or released (-) in this pass, on top of measured utilisation.
        self.util_delta: list[IntArray] = [np.zeros(n, dtype=np.int64) for _ in columns]
        self.host_free: IntArray = nodes.host_memory_free.copy()
        # Accelerators held by preemptible work, per kind, per priority rank, per node.
        self.evictable_accelerators: list[IntArray] = [
            np.zeros((PRIORITY_LEVELS, n), dtype=np.int64) for _ in columns
        ]
        self.evictable_accelerators_total: list[list[int]] = [
            [0] * PRIORITY_LEVELS for _ in columns
        ]
        # Host memory held by preemptible work of any kind, per priority rank, per node.
        self.evictable_host_memory_bytes: IntArray = np.zeros((PRIORITY_LEVELS, n), dtype=np.int64)
        self.evictable_host_memory_total_bytes: list[int] = [0] * PRIORITY_LEVELS
        # CPU cores preemptible GPU/NPU work holds beside its accelerators, per priority
        # rank, per node (CPU work's cores are in evictable_accelerators[CPU_COLUMN]).
        self.evictable_cpu_cores: IntArray = np.zeros((PRIORITY_LEVELS, n), dtype=np.int64)
        self.evictable_cpu_cores_total: list[int] = [0] * PRIORITY_LEVELS
        self.allocations: dict[str, Held] = {}
        self.node_of: dict[str, int] = {}
        self.node_allocs: dict[int, dict[str, Held]] = {}
        self.work_allocs: dict[str, dict[str, Held]] = {}
        self.work_node_count: dict[str, dict[int, int]] = {}
        self.tenant_allocs: dict[str, dict[str, Held]] = {}
        self.tenant_usage: dict[str, list[int]] = {}
        # Per tenant, its work items holding allocations (and how many): ``max_running``.
        self.tenant_work: dict[str, dict[str, int]] = {}
        self.cohort_of: dict[str, str] = {
            t.name: t.cohort for t in snapshot.tenants.values() if t.cohort is not None
        }
        self.cohort_usage: dict[str, list[int]] = {}
        # Tenants whose quota lists ``cpu``: the cores their GPU/NPU work holds beside
        # its accelerators count as their (and their cohort's) CPU usage. Without a
        # ``cpu`` quota such cores are capacity only, as for an unmanaged tenant.
        self.cores_charged: frozenset[str] = frozenset(
            t.name for t in snapshot.tenants.values() if "cpu" in t.nominal
        )
        # Tenants whose quotas name MIG profiles: their slices of those count per profile
        # (mig_usage), not as GPUs (mig_quota.py).
        self.mig_quota_profiles: dict[str, frozenset[str]] = {
            t.name: frozenset(t.mig_nominal) for t in snapshot.tenants.values() if t.mig_nominal
        }
        self.mig_usage: dict[tuple[str, str], int] = {}
        self.group_nodes: dict[str, dict[int, int]] = {}
        self.avoid_nodes: dict[str, dict[int, int]] = {}
        self.new_ids: set[str] = set()
        self.change_log: list[int] = []
        # The same, per accelerator kind: scores of one kind only need that kind's changes.
        self.kind_log: list[list[int]] = [[] for _ in columns]
        # Evictions per kind: the only way capacity of a kind comes back in a pass.
        self.evictions_by_kind: list[int] = [0] * len(columns)
        # Preemptible work not placed in this pass, per (tenant, kind, rank, is p0
        # inference): node -> accelerators, and node -> host memory bytes. Lets reclaim
        # size borrowers per node.
        self.evictable_by_tenant: dict[tuple[str, int, int, bool], dict[int, int]] = {}
        self.evictable_host_by_tenant: dict[tuple[str, int, int, bool], dict[int, int]] = {}
        self.evictable_cores_by_tenant: dict[tuple[str, int, int, bool], dict[int, int]] = {}
        # Reservations (backfill.py), per kind and node: the earliest reserved start, how
        # many accelerators may still go to work that runs past that start without
        # delaying it, and how many the reservations hold. The CPU column's entries also
        # hold the cores a GPU/NPU job reserves beside its accelerators (one pool).
        self.reservation_start_s: list[FloatArray] = [np.full(n, NO_RESERVATION) for _ in columns]
        self.reservation_slack_accelerators: list[IntArray] = [
            np.full(n, UNLIMITED_SLACK, dtype=np.int64) for _ in columns
        ]
        self.reserved_accelerators: list[IntArray] = [np.zeros(n, dtype=np.int64) for _ in columns]
        # Host memory is shared by all kinds: one earliest start, slack and amount per node.
        self.reservation_host_start_s: FloatArray = np.full(n, NO_RESERVATION)
        self.reservation_slack_host_memory_bytes: IntArray = np.full(
            n, UNLIMITED_SLACK, dtype=np.int64
        )
        self.reserved_host_memory_bytes: IntArray = np.zeros(n, dtype=np.int64)
        self.reserved_spans: list[list[ReservedSpan]] = [[] for _ in columns]
        # Allocations with an expected end, per kind and node: where capacity will free up.
        self.ending_allocation_count: list[IntArray] = [
            np.zeros(n, dtype=np.int64) for _ in columns
        ]
        self.has_reservations = False
        for alloc in snapshot.allocations:
            self._index(alloc, nodes.index[alloc.node_id], +1, evictable=alloc.preemptible)

    # -- mutation -----------------------------------------------------------------

    def allocate(self, alloc: Held, node: int, *, new: bool = True) -> None:
        """Place ``alloc``; ``new=False`` re-adds a snapshot allocation (undo of an eviction).

        Work placed in this pass is never a preemption victim, so it is not indexed
        as evictable.
        """
        k = self.column_of(alloc, node)
        self.free[k][node] -= alloc.accelerators
        self.host_free[node] -= alloc.host_memory_bytes
        self.util_delta[k][node] += alloc.accelerators
        if alloc.cpu_cores:
            self._hold_cpu_cores(alloc.cpu_cores, node)
        self._reservation_effect(alloc, k, node, -1)
        self._index(alloc, node, +1, evictable=alloc.preemptible and not new)
        if new:
            self.new_ids.add(alloc.allocation_id)
        self.change_log.append(node)
        self.kind_log[k].append(node)

    def evict(self, allocation_id: str) -> tuple[Held, int]:
        alloc = self.allocations[allocation_id]
        node = self.node_of[allocation_id]
        k = self.column_of(alloc, node)
        self.free[k][node] += alloc.accelerators
        self.host_free[node] += alloc.host_memory_bytes
        self.util_delta[k][node] -= alloc.accelerators
        if alloc.cpu_cores:
            self._hold_cpu_cores(-alloc.cpu_cores, node)
            self.evictions_by_kind[CPU_COLUMN] += 1
        self._reservation_effect(alloc, k, node, +1)
        new = allocation_id in self.new_ids
        self._index(alloc, node, -1, evictable=alloc.preemptible and not new)
        self.new_ids.discard(allocation_id)
        self.change_log.append(node)
        self.kind_log[k].append(node)
        self.evictions_by_kind[k] += 1
        return alloc, node

    def _hold_cpu_cores(self, cores: int, node: int) -> None:
        """A GPU/NPU member takes (or, negative, gives back) cores of the node's CPU pool:
        CPU work and other members' cores see them gone."""
        self.free[CPU_COLUMN][node] -= cores
        self.util_delta[CPU_COLUMN][node] += cores
        self.kind_log[CPU_COLUMN].append(node)

    def _reservation_effect(self, alloc: Held, k: int, node: int, sign: int) -> None:
        """Work that runs past a reserved start uses up (or gives back) the slack."""
        if not self.has_reservations:
            return
        end = alloc.expected_end
        start: float = self.reservation_start_s[k].item(node)
        if start != NO_RESERVATION and (end is None or end > start):
            self.reservation_slack_accelerators[k][node] += sign * alloc.accelerators
        if alloc.host_memory_bytes:
            host_start: float = self.reservation_host_start_s.item(node)
            if host_start != NO_RESERVATION and (end is None or end > host_start):
                self.reservation_slack_host_memory_bytes[node] += sign * alloc.host_memory_bytes
        if alloc.cpu_cores:
            cpu_start: float = self.reservation_start_s[CPU_COLUMN].item(node)
            if cpu_start != NO_RESERVATION and (end is None or end > cpu_start):
                self.reservation_slack_accelerators[CPU_COLUMN][node] += sign * alloc.cpu_cores

    def column_of(self, alloc: Held, node: int) -> int:
        """The pool column ``alloc`` holds on node index ``node``."""
        return self.snapshot.nodes.column_of(node, alloc.accelerator_kind, alloc.accelerator_model)

    def slice_quota_profile(self, alloc: Held) -> str | None:
        """The MIG profile whose slice quota ``alloc`` counts against instead of its
        kind's (mig_quota.py), or None: not slices, or none its tenant has a quota of."""
        profiles = self.mig_quota_profiles.get(alloc.tenant)
        if not profiles:
            return None
        profile = mig_profile_of(alloc.accelerator_model)
        return profile if profile is not None and profile in profiles else None

    def charge(self, alloc: Held, kind_code: int) -> int:
        """What ``alloc`` counts toward its tenant's usage of kind ``kind_code``, as
        `_index` counts it: its accelerators where they are of the kind (not slices under
        a slice quota), and, for the ``cpu`` kind, the cores beside its devices where the
        tenant's quota is charged for them."""
        node = self.snapshot.nodes.index[alloc.node_id]
        charged = 0
        of_the_kind = self.column_kinds[self.column_of(alloc, node)] == kind_code
        if of_the_kind and self.slice_quota_profile(alloc) is None:
            charged = alloc.accelerators
        if kind_code == CPU_KIND and alloc.tenant in self.cores_charged:
            charged += alloc.cpu_cores
        return charged

    def _index(self, alloc: Held, node: int, sign: int, *, evictable: bool) -> None:
        k = self.column_of(alloc, node)
        aid = alloc.allocation_id
        amount = sign * alloc.accelerators
        if evictable:
            level = PRIORITY_RANK[alloc.priority]
            self.evictable_accelerators[k][level, node] += amount
            self.evictable_accelerators_total[k][level] += amount
            key = (alloc.tenant, k, level, alloc.work_kind == "inference")
            _bump(self.evictable_by_tenant.setdefault(key, {}), node, amount)
            if alloc.host_memory_bytes:
                host = sign * alloc.host_memory_bytes
                self.evictable_host_memory_bytes[level, node] += host
                self.evictable_host_memory_total_bytes[level] += host
                _bump(self.evictable_host_by_tenant.setdefault(key, {}), node, host)
            if alloc.cpu_cores:
                cores = sign * alloc.cpu_cores
                self.evictable_cpu_cores[level, node] += cores
                self.evictable_cpu_cores_total[level] += cores
                _bump(self.evictable_cores_by_tenant.setdefault(key, {}), node, cores)
        if alloc.expected_end is not None:
            self.ending_allocation_count[k][node] += sign
        kind_code = self.column_kinds[k]
        kind_amount = amount
        if self.mig_quota_profiles and alloc.tenant in self.mig_quota_profiles:
            profile = self.slice_quota_profile(alloc)
            if profile is not None:
                slices = (alloc.tenant, profile)
                self.mig_usage[slices] = self.mig_usage.get(slices, 0) + amount
                kind_amount = 0  # counted against its profile's quota, not as GPUs
        usage = self.tenant_usage.setdefault(alloc.tenant, [0] * len(KINDS))
        usage[kind_code] += kind_amount
        charged = sign * alloc.cpu_cores if alloc.tenant in self.cores_charged else 0
        usage[CPU_KIND] += charged
        cohort = self.cohort_of.get(alloc.tenant)
        if cohort is not None:
            cohort_usage = self.cohort_usage.setdefault(cohort, [0] * len(KINDS))
            cohort_usage[kind_code] += kind_amount
            cohort_usage[CPU_KIND] += charged
        if sign > 0:
            self.allocations[aid] = alloc
            self.node_of[aid] = node
            self.node_allocs.setdefault(node, {})[aid] = alloc
            self.work_allocs.setdefault(alloc.work_id, {})[aid] = alloc
            self.tenant_allocs.setdefault(alloc.tenant, {})[aid] = alloc
        else:
            del self.allocations[aid]
            del self.node_of[aid]
            del self.node_allocs[node][aid]
            del self.work_allocs[alloc.work_id][aid]
            del self.tenant_allocs[alloc.tenant][aid]
        _bump(self.work_node_count.setdefault(alloc.work_id, {}), node, sign)
        held = self.tenant_work.setdefault(alloc.tenant, {})
        held[alloc.work_id] = held.get(alloc.work_id, 0) + sign
        if not held[alloc.work_id]:
            del held[alloc.work_id]
        if alloc.group is not None:
            _bump(self.group_nodes.setdefault(alloc.group, {}), node, sign)
        for avoided in alloc.anti_affinity_groups:
            _bump(self.avoid_nodes.setdefault(avoided, {}), node, sign)

    # -- queries ----------------------------------------------------------------

    def running_work(self, tenant: str) -> int:
        """The tenant's work items (jobs, deployments) that hold allocations."""
        return len(self.tenant_work.get(tenant, ()))

    def holds(self, tenant: str, work_id: str) -> bool:
        return work_id in self.tenant_work.get(tenant, ())

    def usage(self, tenant: str, k: int) -> int:
        """Accelerators of column ``k``'s kind (all its pools) the tenant holds."""
        usage = self.tenant_usage.get(tenant)
        return usage[self.column_kinds[k]] if usage is not None else 0

    def cohort_used(self, cohort: str, k: int) -> int:
        usage = self.cohort_usage.get(cohort)
        return usage[self.column_kinds[k]] if usage is not None else 0

    def anti_affinity_conflict(self, node: int, group: str | None, avoids: tuple[str, ...]) -> bool:
        """Symmetric: neither side may share a node with a group it avoids."""
        for avoided in avoids:
            if self.group_nodes.get(avoided, {}).get(node, 0) > 0:
                return True
        return group is not None and self.avoid_nodes.get(group, {}).get(node, 0) > 0

    def members_on(self, work_id: str, node: int) -> int:
        return self.work_node_count.get(work_id, {}).get(node, 0)

    def siblings(self, alloc: Held) -> list[Held]:
        """What evicting ``alloc`` takes down: a training gang dies whole."""
        if alloc.work_kind != "training":
            return [alloc]
        gang = self.work_allocs.get(alloc.work_id, {})
        return [gang[aid] for aid in sorted(gang)]


def _bump(counts: dict[int, int], node: int, delta: int) -> None:
    value = counts.get(node, 0) + delta
    if value:
        counts[node] = value
    else:
        counts.pop(node, None)
