"""The immutable view of the world one scheduling pass works on.

Nodes are stored as numpy columns (one entry per node, nodes sorted by id) so that
every filter and score is one vectorised expression over the whole cluster.
Capacity and power are per *pool column*: each column holds, for every node, one
pool of one accelerator kind. Columns 0..2 are the first pool of each kind (the
order of ``KINDS``); a node with several pools of one kind (MIG slices beside whole
GPUs: one pool per profile) puts the others in extra columns of that kind, appended
after them. A cluster without such nodes has exactly one column per kind, so the
column index is the kind index.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from types import MappingProxyType
from typing import Final

import numpy as np

from shared.accelerators import capped_speed
from shared.clock import utc_from_epoch
from shared.messages import AcceleratorKind, IsolationLevel, Site

from .array_cap import ArrayCap
from .arrays import BoolArray, FloatArray, IntArray, read_only
from .fair_share import NO_PAST_USAGE, PastUsage
from .hierarchy import EMPTY_COHORTS, Cohort, cohort_map
from .model import ISOLATION_RANK, KIND_INDEX, KINDS, Allocation, Taint, Tenant, Work
from .windows import zone

SITES: tuple[Site, ...] = ("cloud", "edge")
SITE_INDEX: Mapping[Site, int] = MappingProxyType({site: i for i, site in enumerate(SITES)})
# Every node's CPU pool, its cores: what CPU work holds as accelerators and what a GPU or
# NPU job's cpus_per_worker takes beside its accelerators (one budget, never counted twice).
CPU_COLUMN: Final = KIND_INDEX["cpu"]


@dataclass(frozen=True, slots=True, kw_only=True)
class AcceleratorPool:
    """The ``count`` identical accelerators of one kind on a node.

    ``utilisation`` is the recent measured average (0..1) from telemetry;
    ``relative_speed`` is throughput relative to one A100 (1.0).
    """

    kind: AcceleratorKind
    count: int
    model: str = ""
    memory_bytes: int = 0  # per accelerator; for CPUs the host memory
    relative_speed: float = 1.0
    idle_power_w: float = 0.0
    max_power_w: float = 0.0
    onnx_providers: tuple[str, ...] = ()
    utilisation: float = 0.0

    def __post_init__(self) -> None:
        if self.count < 0 or self.memory_bytes < 0:
            raise ValueError(f"{self.kind} pool: count and memory must not be negative")
        if not 0 < self.relative_speed < math.inf:  # NaN too
            raise ValueError(f"{self.kind} pool: relative_speed must be positive and finite")
        if not 0.0 <= self.utilisation <= 1.0:
            raise ValueError(f"{self.kind} pool: utilisation must be within 0..1")


@dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    """One node as the registry sees it. Local time: ``timezone`` (IANA) wins over
    ``utc_offset_minutes``."""

    node_id: str
    site: Site
    zone: str = ""
    region: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    healthy: bool = True
    host_memory_bytes: int = 0
    utc_offset_minutes: int = 0
    timezone: str | None = None
    pools: tuple[AcceleratorPool, ...] = ()
    runs_training: bool = True  # False: the agent refuses training; only serving goes there
    # How it contains training workers (docs/isolation.md); "unavailable": it cannot.
    isolation: IsolationLevel = "none"
    runs_containers: bool = False  # it has a container runtime: work with an image may go there
    receives_secrets: bool = False  # it has a usable sealing key: work with secrets may go there
    # False: it announced more than it enrolled as, and waits for an admin's approval
    # (cloud/fleet/envelope.py): no new work goes there.
    approved: bool = True

    def __post_init__(self) -> None:
        profiles = [(pool.kind, pool.model) for pool in self.pools]
        if len(set(profiles)) != len(profiles):
            raise ValueError(
                f"node {self.node_id}: at most one pool per accelerator kind and model"
            )
        object.__setattr__(self, "labels", MappingProxyType(dict(self.labels)))

    def kind_pools(self, kind: AcceleratorKind) -> list[AcceleratorPool]:
        """This node's pools of ``kind`` in column order (the first is its main pool)."""
        return [pool for pool in self.pools if pool.kind == kind]


@dataclass(frozen=True, slots=True)
class KindColumns:
    """One pool column: a pool of one accelerator kind on every node, zero capacity
    where a node has none (in that slot)."""

    kind: AcceleratorKind
    slot: int  # 0: each node's first pool of the kind; 1, 2...: its further pools
    capacity: IntArray
    free: IntArray  # capacity minus the accelerators of running allocations
    memory_bytes: IntArray
    model_code: IntArray  # index into ``models``; -1 where the node has no such pool
    models: tuple[str, ...]
    relative_speed: FloatArray
    idle_power_w: FloatArray
    max_power_w: FloatArray
    providers: BoolArray  # shape (nodes, len(provider_names))
    provider_names: tuple[str, ...]
    utilisation: FloatArray
    max_speed: float  # fastest pool of this kind in the cluster, for normalising speed


@dataclass(frozen=True, slots=True)
class NodeTable:
    node_ids: tuple[str, ...]
    index: Mapping[str, int]
    site_code: IntArray
    runs_training: BoolArray
    isolation_rank: IntArray  # model.ISOLATION_RANK of each node's isolation
    runs_containers: BoolArray
    receives_secrets: BoolArray
    zone_code: IntArray
    zones: tuple[str, ...]
    region_code: IntArray
    regions: tuple[str, ...]
    label_codes: Mapping[str, IntArray]  # per key: index into label_values[key], -1 if absent
    label_values: Mapping[str, tuple[str, ...]]
    taint_matrix: BoolArray  # shape (nodes, len(taints))
    taints: tuple[Taint, ...]
    healthy: BoolArray
    approved: BoolArray
    utc_offset_s: IntArray  # at the snapshot's ``now``
    timezone_code: IntArray  # index into ``timezones``; -1 for a fixed UTC offset
    timezones: tuple[str, ...]  # IANA names, for offsets that change (windows.py)
    host_memory_total: IntArray
    host_memory_free: IntArray
    # Pool columns: the first len(KINDS) indexed by KIND_INDEX, then further pools.
    kinds: tuple[KindColumns, ...]
    column_kinds: tuple[int, ...]  # per column: its kind's KIND_INDEX
    kind_columns: tuple[tuple[int, ...], ...]  # per KIND_INDEX: its columns, first pool first

    def __len__(self) -> int:
        return len(self.node_ids)

    def kind(self, kind: AcceleratorKind) -> KindColumns:
        """The column of every node's first (main) pool of ``kind``."""
        return self.kinds[KIND_INDEX[kind]]

    def kind_capacity(self, kind: AcceleratorKind) -> IntArray:
        """Per node, its accelerators of ``kind`` in all its pools."""
        columns = self.kind_columns[KIND_INDEX[kind]]
        if len(columns) == 1:
            return self.kinds[columns[0]].capacity
        total: IntArray = np.sum([self.kinds[c].capacity for c in columns], axis=0)
        return total

    def column_of(self, node: int, kind: AcceleratorKind, model: str) -> int:
        """The column of the pool of ``kind`` and ``model`` on node index ``node``; its
        first pool of the kind when the model is empty or no longer there."""
        k = KIND_INDEX[kind]
        columns = self.kind_columns[k]
        if len(columns) == 1 or not model:
            return k
        for c in columns:
            column = self.kinds[c]
            code: int = column.model_code.item(node)
            if code >= 0 and column.models[code] == model:
                return c
        return k

    def model_at(self, column: int, node: int) -> str:
        """The model of ``column``'s pool on node index ``node`` ("" where it has none)."""
        pools = self.kinds[column]
        code: int = pools.model_code.item(node)
        return pools.models[code] if code >= 0 else ""


def _array_cap_map(caps: Sequence[ArrayCap]) -> Mapping[str, ArrayCap]:
    """Caps by array id, in id order, each with its placed indices and tasks in order."""
    ordered = sorted(caps, key=lambda cap: cap.array_id)
    _require_unique("job array", [cap.array_id for cap in ordered])
    return MappingProxyType(
        {
            cap.array_id: dataclasses.replace(
                cap,
                placed=tuple(sorted(cap.placed)),
                tasks=MappingProxyType(dict(sorted(cap.tasks.items()))),
            )
            for cap in ordered
        }
    )


def _tenant_map(tenants: Sequence[Tenant]) -> Mapping[str, Tenant]:
    """Tenants by name, in name order (each name once)."""
    _require_unique("tenant", [t.name for t in tenants])
    return MappingProxyType({t.name: t for t in sorted(tenants, key=lambda t: t.name)})


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one pass may look at: nodes, running work, the queue, tenants, the time."""

    now: float
    nodes: NodeTable
    allocations: tuple[Allocation, ...]
    queue: tuple[Work, ...]
    tenants: Mapping[str, Tenant]
    # Tenant name -> at most this many of its work items hold placements at once; the
    # next waits (code ``quota``) and nothing is evicted for it. Apart from ``tenants``
    # (accelerator quotas): a tenant may have either, both or neither.
    running_limits: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    # The configured cohort tree above the tenants (hierarchy.py), by name.
    cohorts: Mapping[str, Cohort] = field(default_factory=lambda: EMPTY_COHORTS)
    # Tenant -> its decayed past usage per kind (fair_share.py), added to what it holds
    # now when the queue is ordered by fair share.
    past_usage: PastUsage = field(default_factory=lambda: NO_PAST_USAGE)
    # Job array id -> its throttle, for arrays with more tasks queued than the pass may
    # place (array_cap.py); arrays without a throttle, or with room for them all, are not
    # here.
    array_caps: Mapping[str, ArrayCap] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def build(
        cls,
        *,
        now: float,
        nodes: Sequence[Node],
        allocations: Sequence[Allocation] = (),
        queue: Sequence[Work] = (),
        tenants: Sequence[Tenant] = (),
        running_limits: Mapping[str, int] | None = None,
        tables: NodeTableCache | None = None,
        cohorts: Sequence[Cohort] = (),
        past_usage: PastUsage | None = None,
        utilisation: Mapping[str, Sequence[float]] | None = None,
        array_caps: Sequence[ArrayCap] = (),
    ) -> Snapshot:
        """Canonicalise (sort by id) and columnise the inputs.

        Input order never matters: two callers listing the same things in a different
        order get equal snapshots, and so equal plans. ``tables``: the node columns of
        the caller's previous snapshot, patched instead of built again where only
        nodes' utilisation moved (the same table either way). ``utilisation``:
        measured utilisation newer than some nodes' own, node id -> one share per pool
        in the node's pool order, taken over the pools' figure (the snapshot is that
        of the nodes with those figures): a telemetry sample moves nothing else, every
        few seconds on every node, and remaking ten thousand nodes for it cost more
        than the rest of the inputs.
        """
        ordered_nodes = sorted(nodes, key=lambda n: n.node_id)
        ordered_allocations = tuple(sorted(allocations, key=lambda a: a.allocation_id))
        ordered_queue = tuple(sorted(queue, key=lambda w: w.work_id))
        _require_unique("node", [n.node_id for n in ordered_nodes])
        _require_unique("allocation", [a.allocation_id for a in ordered_allocations])
        _require_unique("queued work", [w.work_id for w in ordered_queue])
        if tables is None:
            table = _node_columns(ordered_nodes, now)
            if utilisation:
                table = _with_measured(table, ordered_nodes, utilisation, utilisation)
        else:
            table = tables.table(ordered_nodes, now, utilisation)
        table = _with_usage(table, ordered_allocations)
        return cls(
            now=float(now),
            nodes=table,
            allocations=ordered_allocations,
            queue=ordered_queue,
            tenants=_tenant_map(tenants),
            running_limits=MappingProxyType(dict(sorted((running_limits or {}).items()))),
            cohorts=cohort_map(cohorts),
            past_usage=MappingProxyType(dict(sorted((past_usage or {}).items()))),
            array_caps=_array_cap_map(array_caps),
        )

    @property
    def node_count(self) -> int:
        return len(self.nodes)

    def with_tenants(self, tenants: Sequence[Tenant]) -> Snapshot:
        """The same nodes, work and time with other tenants (quotas)."""
        return dataclasses.replace(self, tenants=_tenant_map(tenants))

    def with_work(
        self, *, allocations: Sequence[Allocation], queue: Sequence[Work] = ()
    ) -> Snapshot:
        """The same nodes, tenants and time with other running work and queue: free
        capacity is recounted, telemetry (utilisation) is kept as it was. For
        what-if passes (the migrator asks where one job would go now)."""
        table = self.nodes
        used, host_used = _usage(table, allocations)
        kinds = tuple(
            dataclasses.replace(columns, free=read_only(columns.capacity - used[k]))
            for k, columns in enumerate(table.kinds)
        )
        nodes = dataclasses.replace(
            table,
            kinds=kinds,
            host_memory_free=read_only(table.host_memory_total - host_used),
        )
        ordered_allocations = tuple(sorted(allocations, key=lambda a: a.allocation_id))
        ordered_queue = tuple(sorted(queue, key=lambda w: w.work_id))
        _require_unique("allocation", [a.allocation_id for a in ordered_allocations])
        _require_unique("queued work", [w.work_id for w in ordered_queue])
        return Snapshot(
            now=self.now,
            nodes=nodes,
            allocations=ordered_allocations,
            queue=ordered_queue,
            tenants=self.tenants,
            running_limits=self.running_limits,
            cohorts=self.cohorts,
            past_usage=self.past_usage,
            array_caps=self.array_caps,
        )


def pool_speed(
    table: NodeTable,
    node_id: str,
    kind: AcceleratorKind,
    model: str,
    *,
    power_limit_w: float | None = None,
) -> float:
    """The relative speed of the pool of ``kind`` and ``model`` on node ``node_id`` (its
    first pool of the kind for an unknown model), its devices held to ``power_limit_w``
    (power capping: slower, ``shared.accelerators.capped_throughput``; None: default)."""
    node = table.index[node_id]
    pools = table.kinds[table.column_of(node, kind, model)]
    return capped_speed(
        pools.relative_speed.item(node), power_limit_w, pools.max_power_w.item(node)
    )


def _require_unique(what: str, ids: Sequence[str]) -> None:
    for previous, current in pairwise(ids):
        if previous == current:
            raise ValueError(f"duplicate {what} id {current!r}")


def _codes(values: Sequence[str]) -> tuple[IntArray, tuple[str, ...]]:
    vocabulary = tuple(sorted(set(values)))
    lookup = {value: i for i, value in enumerate(vocabulary)}
    return np.array([lookup[v] for v in values], dtype=np.int64), vocabulary


def _usage(table: NodeTable, allocations: Sequence[Allocation]) -> tuple[IntArray, IntArray]:
    """Accelerators in use per (column, node), CPU cores held beside accelerators
    included, and host memory in use per node."""
    index = table.index
    used = np.zeros((len(table.kinds), len(index)), dtype=np.int64)
    host_used = np.zeros(len(index), dtype=np.int64)
    for alloc in allocations:
        where = index.get(alloc.node_id)
        if where is None:
            raise ValueError(
                f"allocation {alloc.allocation_id} is on unknown node {alloc.node_id!r}"
            )
        column = table.column_of(where, alloc.accelerator_kind, alloc.accelerator_model)
        used[column, where] += alloc.accelerators
        used[CPU_COLUMN, where] += alloc.cpu_cores
        host_used[where] += alloc.host_memory_bytes
    return used, host_used


def _with_usage(table: NodeTable, allocations: Sequence[Allocation]) -> NodeTable:
    """``table`` (its free capacity equal to its capacity) with ``allocations`` running."""
    used, host_used = _usage(table, allocations)
    return dataclasses.replace(
        table,
        host_memory_free=read_only(table.host_memory_total - host_used),
        kinds=tuple(
            dataclasses.replace(columns, free=read_only(columns.capacity - used[c]))
            for c, columns in enumerate(table.kinds)
        ),
    )


def _utc_offsets_s(
    timezone_code: IntArray, timezones: Sequence[str], fixed_offset_s: IntArray, now: float
) -> IntArray:
    """Each node's UTC offset at ``now``: its timezone's, looked up once per timezone
    (a fleet has a handful of them and thousands of nodes), else its fixed offset."""
    instant = utc_from_epoch(now)
    by_timezone = np.zeros(len(timezones) + 1, dtype=np.int64)  # the last: no timezone
    for code, name in enumerate(timezones):
        offset = instant.astimezone(zone(name)).utcoffset()
        by_timezone[code] = int(offset.total_seconds()) if offset is not None else 0
    offsets: IntArray = np.where(timezone_code >= 0, by_timezone[timezone_code], fixed_offset_s)
    return offsets


def _node_columns(nodes: Sequence[Node], now: float) -> NodeTable:
    """The columns of ``nodes`` (sorted by id), with nothing running yet."""
    n = len(nodes)
    index = {node.node_id: i for i, node in enumerate(nodes)}
    zone_code, zones = _codes([node.zone for node in nodes])
    region_code, regions = _codes([node.region for node in nodes])

    label_keys = sorted({key for node in nodes for key in node.labels})
    label_codes: dict[str, IntArray] = {}
    label_values: dict[str, tuple[str, ...]] = {}
    for key in label_keys:
        vocabulary = tuple(sorted({node.labels[key] for node in nodes if key in node.labels}))
        lookup = {value: i for i, value in enumerate(vocabulary)}
        column = np.array(
            [
                lookup.get(node.labels.get(key, ""), -1) if key in node.labels else -1
                for node in nodes
            ],
            dtype=np.int64,
        )
        label_codes[key] = read_only(column)
        label_values[key] = vocabulary

    taints = tuple(
        sorted({t for node in nodes for t in node.taints}, key=lambda t: (t.key, t.value, t.effect))
    )
    taint_index = {t: i for i, t in enumerate(taints)}
    taint_matrix = np.zeros((n, len(taints)), dtype=np.bool_)
    for i, node in enumerate(nodes):
        for taint in node.taints:
            taint_matrix[i, taint_index[taint]] = True

    host_total = np.array([node.host_memory_bytes for node in nodes], dtype=np.int64)
    timezones = tuple(sorted({node.timezone for node in nodes if node.timezone is not None}))
    timezone_lookup = {name: i for i, name in enumerate(timezones)}
    timezone_code = np.array(
        [timezone_lookup[n.timezone] if n.timezone is not None else -1 for n in nodes],
        dtype=np.int64,
    )
    fixed_offset_s = np.array([node.utc_offset_minutes * 60 for node in nodes], dtype=np.int64)
    # Each node's pools of each kind, in column order, grouped once: the slots and every
    # column read them (grouping them again for each cost a tenth of a build).
    kind_pools: dict[AcceleratorKind, list[Sequence[AcceleratorPool]]] = {k: [] for k in KINDS}
    for node in nodes:
        by_kind: dict[AcceleratorKind, list[AcceleratorPool]] = {}
        for pool in node.pools:
            by_kind.setdefault(pool.kind, []).append(pool)
        for kind, per_node in kind_pools.items():
            per_node.append(by_kind.get(kind, ()))
    slots = [(kind, 0) for kind in KINDS] + [
        (kind, slot)
        for kind in KINDS
        for slot in range(1, max((len(pools) for pools in kind_pools[kind]), default=0))
    ]
    column_kinds = tuple(KIND_INDEX[kind] for kind, _ in slots)
    return NodeTable(
        node_ids=tuple(node.node_id for node in nodes),
        index=MappingProxyType(index),
        site_code=read_only(np.array([SITE_INDEX[node.site] for node in nodes], dtype=np.int64)),
        runs_training=read_only(np.array([node.runs_training for node in nodes], dtype=np.bool_)),
        isolation_rank=read_only(
            np.array([ISOLATION_RANK[node.isolation] for node in nodes], dtype=np.int64)
        ),
        runs_containers=read_only(
            np.array([node.runs_containers for node in nodes], dtype=np.bool_)
        ),
        receives_secrets=read_only(
            np.array([node.receives_secrets for node in nodes], dtype=np.bool_)
        ),
        zone_code=read_only(zone_code),
        zones=zones,
        region_code=read_only(region_code),
        regions=regions,
        label_codes=MappingProxyType(label_codes),
        label_values=MappingProxyType(label_values),
        taint_matrix=read_only(taint_matrix),
        taints=taints,
        healthy=read_only(np.array([node.healthy for node in nodes], dtype=np.bool_)),
        approved=read_only(np.array([node.approved for node in nodes], dtype=np.bool_)),
        utc_offset_s=read_only(_utc_offsets_s(timezone_code, timezones, fixed_offset_s, now)),
        timezone_code=read_only(timezone_code),
        timezones=timezones,
        host_memory_total=read_only(host_total),
        host_memory_free=read_only(host_total),
        kinds=tuple(_kind_columns(kind, slot, kind_pools[kind]) for kind, slot in slots),
        column_kinds=column_kinds,
        kind_columns=tuple(
            tuple(c for c, code in enumerate(column_kinds) if code == k) for k in range(len(KINDS))
        ),
    )


_POOL_BUT_UTILISATION = operator.attrgetter(
    *(f.name for f in dataclasses.fields(AcceleratorPool) if f.name != "utilisation")
)


def _pools_but_utilisation(node: Node) -> tuple[object, ...]:
    return tuple(_POOL_BUT_UTILISATION(pool) for pool in node.pools)


_ALL_BUT_LIVE = operator.attrgetter(
    *(f.name for f in dataclasses.fields(Node) if f.name not in ("pools", "healthy"))
)


def _same_but_live(old: Node, new: Node) -> bool:
    """Whether ``new`` differs from ``old`` at most in its pools' utilisation and in
    whether it is healthy: what a telemetry sample changes, every few seconds on every
    node, and a node going offline or coming back, somewhere in a large fleet most
    minutes."""
    return _ALL_BUT_LIVE(new) == _ALL_BUT_LIVE(old) and (
        _pools_but_utilisation(new) == _pools_but_utilisation(old)
    )


class NodeTableCache:
    """The node columns of the last snapshot built through it, kept for the next.

    A pass over ten thousand nodes rebuilt every column although, between two passes,
    most nodes are the same objects (cloud/loop/nodes.py keeps a node's view while
    what it is made from holds) and the others mostly sent a sample: only their
    utilisation moved, or whether they are healthy (online). Then only those columns
    are copied and patched at those nodes (and the UTC offsets read again for the new
    time); any other change (a node joining, leaving, relabelled, a device failing)
    builds the table afresh.
    A sample's utilisation may also come beside the nodes (``utilisation``, see
    ``Snapshot.build``), so that nothing is remade for it but the entries that moved.
    The result is the table a fresh build gives, value for value.
    """

    def __init__(self) -> None:
        self._nodes: tuple[Node, ...] = ()
        self._table: NodeTable | None = None
        self._utilisation: Mapping[str, Sequence[float]] = MappingProxyType({})

    def table(
        self,
        nodes: Sequence[Node],
        now: float,
        utilisation: Mapping[str, Sequence[float]] | None = None,
    ) -> NodeTable:
        """The columns of ``nodes`` (sorted by id) at ``now``, nothing running, with
        ``utilisation`` (node id -> one share per pool) over the pools' own."""
        measured = dict(utilisation or {})
        table = self._patched(nodes, now, measured)
        if table is None:
            table = _with_measured(_node_columns(nodes, now), nodes, measured, measured.keys())
        self._nodes = tuple(nodes)
        self._table = table
        self._utilisation = measured
        return table

    def _patched(
        self, nodes: Sequence[Node], now: float, measured: Mapping[str, Sequence[float]]
    ) -> NodeTable | None:
        table, kept = self._table, self._nodes
        if table is None or len(nodes) != len(kept):
            return None
        changed = [
            i for i, (old, new) in enumerate(zip(kept, nodes, strict=True)) if old is not new
        ]
        for i in changed:
            if not _same_but_live(kept[i], nodes[i]):
                return None
        if any(nodes[i].healthy != kept[i].healthy for i in changed):
            healthy = table.healthy.copy()
            healthy[changed] = [nodes[i].healthy for i in changed]
            table = dataclasses.replace(table, healthy=read_only(healthy))
        # Nodes whose figure may have moved: remade ones, and those whose measured
        # shares came, changed or went since the last table.
        ids = table.node_ids
        moved = {ids[i] for i in changed}
        previous = self._utilisation
        moved.update(
            node_id for node_id, shares in measured.items() if previous.get(node_id) != shares
        )
        moved.update(node_id for node_id in previous if node_id not in measured)
        # A node without a timezone keeps its fixed offset, which its column holds.
        offsets = _utc_offsets_s(table.timezone_code, table.timezones, table.utc_offset_s, now)
        table = dataclasses.replace(table, utc_offset_s=read_only(offsets))
        return _with_measured(table, nodes, measured, moved) if moved else table


def _with_measured(
    table: NodeTable,
    nodes: Sequence[Node],
    measured: Mapping[str, Sequence[float]],
    node_ids: Iterable[str],
) -> NodeTable:
    """``table`` with the utilisation of ``node_ids`` set again: their ``measured``
    shares (one per pool, in pool order) where given, else their pools' own."""
    column_of = {(columns.kind, columns.slot): c for c, columns in enumerate(table.kinds)}
    rows: list[list[int]] = [[] for _ in table.kinds]
    values: list[list[float]] = [[] for _ in table.kinds]
    for node_id in node_ids:
        i = table.index.get(node_id)
        if i is None:
            raise ValueError(f"utilisation measured on unknown node {node_id!r}")
        node = nodes[i]
        shares = measured.get(node_id)
        if shares is None:
            shares = [pool.utilisation for pool in node.pools]
        elif len(shares) != len(node.pools):
            raise ValueError(f"node {node_id}: one measured utilisation per pool")
        slots: dict[str, int] = {}
        for pool, share in zip(node.pools, shares, strict=True):
            slot = slots.get(pool.kind, 0)
            slots[pool.kind] = slot + 1
            c = column_of[pool.kind, slot]
            rows[c].append(i)
            values[c].append(share)
    kinds = list(table.kinds)
    for c, columns in enumerate(table.kinds):
        if rows[c]:
            shares_now = np.array(values[c], dtype=np.float64)
            if not bool(np.all((shares_now >= 0.0) & (shares_now <= 1.0))):
                raise ValueError(f"{columns.kind} pool: utilisation must be within 0..1")
            utilisation = columns.utilisation.copy()
            utilisation[rows[c]] = shares_now
            kinds[c] = dataclasses.replace(columns, utilisation=read_only(utilisation))
    return dataclasses.replace(table, kinds=tuple(kinds))


def _kind_columns(
    kind: AcceleratorKind, slot: int, node_pools: Sequence[Sequence[AcceleratorPool]]
) -> KindColumns:
    """Column ``slot`` of ``kind`` from each node's pools of the kind (``Node.kind_pools``);
    ``free`` is the capacity until usage is counted."""
    n = len(node_pools)
    pools = [_nth(own, slot) for own in node_pools]
    capacity = np.array([p.count if p else 0 for p in pools], dtype=np.int64)
    models = tuple(sorted({p.model for p in pools if p}))
    model_lookup = {m: i for i, m in enumerate(models)}
    provider_names = tuple(sorted({name for p in pools if p for name in p.onnx_providers}))
    provider_lookup = {name: i for i, name in enumerate(provider_names)}
    providers = np.zeros((n, len(provider_names)), dtype=np.bool_)
    for i, pool in enumerate(pools):
        if pool:
            for name in pool.onnx_providers:
                providers[i, provider_lookup[name]] = True
    speed = np.array([p.relative_speed if p else 1.0 for p in pools], dtype=np.float64)
    present = capacity > 0
    return KindColumns(
        kind=kind,
        slot=slot,
        capacity=read_only(capacity),
        free=read_only(capacity),
        memory_bytes=read_only(
            np.array([p.memory_bytes if p else 0 for p in pools], dtype=np.int64)
        ),
        model_code=read_only(
            np.array([model_lookup[p.model] if p else -1 for p in pools], dtype=np.int64)
        ),
        models=models,
        relative_speed=read_only(speed),
        idle_power_w=read_only(np.array([p.idle_power_w if p else 0.0 for p in pools])),
        max_power_w=read_only(np.array([p.max_power_w if p else 0.0 for p in pools])),
        providers=read_only(providers),
        provider_names=provider_names,
        utilisation=read_only(np.array([p.utilisation if p else 0.0 for p in pools])),
        max_speed=float(speed[present].max()) if present.any() else 1.0,
    )


def _nth(pools: Sequence[AcceleratorPool], slot: int) -> AcceleratorPool | None:
    return pools[slot] if slot < len(pools) else None
