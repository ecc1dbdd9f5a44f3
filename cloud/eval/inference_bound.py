"""The offline optimum for inference: the least inference CO2 a placement with perfect
knowledge could emit for the same scenario and the same service.

Training's optimum is bound.py; this is its counterpart for the deployments, so that
``greenfed eval --optimum`` can say "of optimum" for inference and in total against a
proven lower bound, not against the best schedule seen. A linear program over
deployment × node group × accelerator kind × hour, solved by HiGHS
(``scipy.optimize.linprog``); ``x[d, g, k, h]`` is the replica-hours deployment ``d``
runs on the kind-``k`` pools of group ``g`` in hour ``h`` (a group: nodes alike in
everything the placement and the accounting see: zone, and per kind speed, power,
capacity and which deployments may use it):

    minimise   Σ x[d,g,k,h] · kW[d,g,k,h] · I[zone(g), h]                 (gCO2eq)
    such that  Σ_{g,k} x[d,g,k,h] = replica_hours[d, h]                  the same service
               Σ_d x[d,g,k,h] · accelerators[d] ≤ accelerators[g, k]     capacity
               Σ_k x[d,g,k,h] ≤ nodes[g] · max_replicas_per_node[d]      per node, all kinds
               x[d,g,k,h] ≥ 0, and 0 where not eligible[d, g, k]

It is accounted as the simulation accounts a replica (``simulation.replica_usages``,
``cloud.green.accounting``): one replica on a node draws the energy model's
``member_power_w`` for its accelerators of the kind at its busy share
``u = min(1, rate / serving_replicas(rate) · reference_ms_per_request / speed / 1000)``,
host share and PUE included, at the node's main pool of the kind (as the accounting
reads it), times the *recorded* hourly intensity of its zone (fallbacks included);
inference is counted within the evaluated period only.

``replica_hours[d, h]`` is the least replica-time any evaluated policy ran ``d`` in hour
``h``: where every policy runs what the deployment asks for (its replicas, or what its
autoscaler keeps), that is the service; where one ran fewer (an SLO violation), the
bound serves no more than that policy did, so it stays below it.

``eligible[d, g, k]``: the scheduler's own static filters for the deployment (site,
accelerator kind, providers, selectors, taints and the latency SLO at its worst hour of
the day, judged by the same estimator the simulation's policies use), plus every node an
evaluated policy actually ran it on.

Relaxed (each makes the bound lower, never higher): replicas are divisible and move
every hour for free (no start-up, no minimum run); within an hour a replica draws the
least power of the request rates any policy's replica of the deployment saw in that
hour (the rate sets a replica's load and so its power); ``max_replicas_per_node`` and
capacity hold per group and hour, not per node and instant; training's use of the same
accelerators and tenants' quotas are ignored; the SLO is the placement filter's
(static), not the hourly check at that hour's traffic. Every evaluated policy's
placement is therefore a feasible point, and no policy can emit less inference CO2
than the bound.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from cloud.green.energy import EnergyModel
from cloud.green.latency import ServingLatency
from cloud.scheduler import Node, Policy, Snapshot
from cloud.scheduler.arrays import FloatArray, IntArray
from cloud.scheduler.filters import PASS, static_filters
from cloud.scheduler.model import KIND_INDEX
from cloud.scheduler.shape import make_shape
from cloud.signals.grid import GridSignals
from shared.messages import AcceleratorKind

from .bound import BoundUnavailable, hourly_carbon
from .simulation import HOUR_S, SimOutcome, serving_replicas
from .workload import InferenceSpec, Workload, deployment, requests_per_s

_KINDS: tuple[AcceleratorKind, ...] = ("gpu", "npu", "cpu")


@dataclass(frozen=True, slots=True, kw_only=True)
class InferenceBound:
    gco2: float  # inference emissions of the optimum, within the evaluated period
    kwh: float
    deployments: int
    replica_hours: float  # the service it gives: Σ replica_hours[d, h]
    variables: int
    constraints: int
    solve_s: float
    replica_hours_by_zone: dict[str, float] = field(default_factory=dict)


# A node's pool of one kind as grouping sees it: kind, accelerators, speed, one
# accelerator's power idle and busy, and which deployments may use it.
_PoolKey = tuple[AcceleratorKind, int, float, float, float, tuple[bool, ...]]


@dataclass(frozen=True, slots=True)
class _Pool:
    """One accelerator kind of every node of a group."""

    kind: AcceleratorKind
    accelerators: int  # of the kind, all its pools, all the group's nodes
    eligible: tuple[bool, ...]  # per deployment


@dataclass(frozen=True, slots=True)
class _Group:
    """Nodes alike for inference: zone, and per kind speed, power, capacity and which
    deployments may use it."""

    rows: tuple[int, ...]  # snapshot rows
    representative: int
    pools: tuple[_Pool, ...]


def eligible_rows(
    snapshot: Snapshot,
    spec: InferenceSpec,
    kind: str,
    latency: ServingLatency,
    origin_s: float,
) -> set[int]:
    """The rows whose pools of ``kind`` the scheduler's static filters (the latency SLO
    among them) let one of the deployment's replicas use."""
    if kind not in spec.accepted_kinds:
        return set()
    shape = make_shape(deployment(spec, origin_s), Policy())
    rows: set[int] = set()
    for column in snapshot.nodes.kind_columns[KIND_INDEX[kind]]:
        static = static_filters(snapshot, shape, column, latency)
        rows.update(np.flatnonzero(static.codes == PASS).tolist())
    return rows


def _groups(
    snapshot: Snapshot,
    specs: Sequence[InferenceSpec],
    eligible: dict[tuple[str, str], set[int]],
    energy: EnergyModel,
) -> list[_Group]:
    table = snapshot.nodes
    every_row = np.arange(len(table))
    per_kind = []
    for kind in _KINDS:
        per_kind.append(
            (
                kind,
                table.kind_capacity(kind),
                table.kind(kind).relative_speed,
                energy.member_power_w(snapshot, kind, every_row, 1, 0.0),
                energy.member_power_w(snapshot, kind, every_row, 1, 1.0),
            )
        )
    groups: dict[tuple[int, tuple[_PoolKey, ...]], list[int]] = {}
    for row in range(len(table)):
        pools: list[_PoolKey] = []
        for kind, capacity, speed, idle_w, busy_w in per_kind:
            allowed = tuple(row in eligible[(spec.id, kind)] for spec in specs)
            if capacity[row] > 0 and any(allowed):
                pools.append(
                    (
                        kind,
                        int(capacity[row]),
                        float(speed[row]),
                        round(float(idle_w[row]), 9),
                        round(float(busy_w[row]), 9),
                        allowed,
                    )
                )
        if pools:
            groups.setdefault((int(table.zone_code[row]), tuple(pools)), []).append(row)
    return [
        _Group(
            rows=tuple(rows),
            representative=rows[0],
            pools=tuple(
                _Pool(kind=kind, accelerators=capacity * len(rows), eligible=allowed)
                for kind, capacity, _, _, _, allowed in pools
            ),
        )
        for (_, pools), rows in groups.items()
    ]


def _served(
    outcomes: Sequence[SimOutcome],
    specs: Sequence[InferenceSpec],
    origin_s: float,
    hours: int,
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Per deployment and hour: the least replica-hours any policy ran it, and the lowest
    and highest busy share per reference-speed replica any of their replicas' usage
    records saw (``simulation.replica_usages``: the rate at each record's midpoint)."""
    index = {spec.id: d for d, spec in enumerate(specs)}
    end_s = origin_s + hours * HOUR_S
    least = np.full((len(specs), hours), np.inf)
    low = np.full((len(specs), hours), np.inf)
    high = np.full((len(specs), hours), -np.inf)
    for outcome in outcomes:
        held = np.zeros((len(specs), hours))
        for run in outcome.replicas:
            d = index[run.spec.id]
            start = max(run.start_s, origin_s)
            stop = min(run.end_s if run.end_s is not None else end_s, end_s)
            at = start
            while at < stop:
                hour = math.floor((at - origin_s) / HOUR_S)
                piece_end = min(stop, origin_s + (hour + 1) * HOUR_S)
                held[d, hour] += (piece_end - at) / HOUR_S
                rate = requests_per_s(run.spec, (at + piece_end) / 2)
                load = rate / serving_replicas(run.spec, rate)
                low[d, hour] = min(low[d, hour], load)
                high[d, hour] = max(high[d, hour], load)
                at = piece_end
        least = np.minimum(least, held)
    least = np.where(np.isfinite(least), least, 0.0)
    return least, np.where(np.isfinite(low), low, 0.0), np.where(np.isfinite(high), high, 0.0)


def inference_optimum(
    workload: Workload,
    nodes: Sequence[Node],
    outcomes: Sequence[SimOutcome],
    recorded: GridSignals,
    energy: EnergyModel,
    latency: ServingLatency,
) -> InferenceBound:
    """The least inference CO2 over the evaluated policies' service (module docstring).
    ``latency`` is the estimator the simulations placed with (``runner.serving_latency``)."""
    try:
        from scipy.optimize import linprog
        from scipy.sparse import coo_matrix
    except ImportError as error:  # pragma: no cover - scipy is in the cloud extra
        raise BoundUnavailable(f"the optimum needs SciPy: {error}") from None
    began = time.perf_counter()
    config = outcomes[0].config
    origin_s = config.start_s
    hours = max(1, math.ceil((config.end_s - origin_s) / HOUR_S - 1e-9))
    snapshot = Snapshot.build(now=origin_s, nodes=nodes)
    table = snapshot.nodes
    # The deployments the simulations submitted: none after the period (simulation.py).
    specs = [spec for spec in workload.inference if spec.id in outcomes[0].deployments]
    eligible: dict[tuple[str, str], set[int]] = {
        (spec.id, kind): eligible_rows(snapshot, spec, kind, latency, origin_s)
        for spec in specs
        for kind in _KINDS
    }
    for outcome in outcomes:  # every policy's placement is a feasible point
        for run in outcome.replicas:
            eligible[(run.spec.id, run.accelerator_kind)].add(table.index[run.node_id])
    groups = _groups(snapshot, specs, eligible, energy)
    served, low, high = _served(outcomes, specs, origin_s, hours)
    hour_starts = origin_s + HOUR_S * np.arange(hours, dtype=np.float64)
    intensity = hourly_carbon(
        recorded, snapshot, [group.representative for group in groups], hour_starts
    )

    cost: list[FloatArray] = []
    kw_of: list[FloatArray] = []
    upper: list[FloatArray] = []
    equality_row: list[IntArray] = []  # per variable: its (deployment, hour)
    zone_of: list[IntArray] = []
    # Inequalities, as (row, column, coefficient) triples: first each pool's capacity
    # per hour, then, per hour, each (deployment, group) that more than one of the
    # group's kinds may serve: the nodes hold at most the replica limit, all kinds
    # together (the scheduler counts a deployment's replicas per node).
    ub_row: list[IntArray] = []
    ub_column: list[IntArray] = []
    ub_value: list[FloatArray] = []
    capacity = [float(pool.accelerators) for group in groups for pool in group.pools]
    first_pool = np.cumsum([0] + [len(group.pools) for group in groups])
    limits: list[float] = []
    rows_needed = [(d, h) for d in range(len(specs)) for h in range(hours) if served[d, h] > 0]
    row_index = {key: i for i, key in enumerate(rows_needed)}
    n = 0
    for d, spec in enumerate(specs):
        span = np.flatnonzero(served[d] > 0)
        if span.size == 0:
            continue
        accelerators = deployment(spec, origin_s).accelerators_per_replica
        rows_of_d = np.array([row_index[(d, int(h))] for h in span], dtype=np.int64)
        for g, group in enumerate(groups):
            usable = [i for i, pool in enumerate(group.pools) if pool.eligible[d]]
            if not usable:
                continue
            per_node = float(len(group.rows) * spec.max_replicas_per_node)
            limit = None
            if len(usable) > 1:
                limit = len(limits)
                limits.append(per_node)
            for i in usable:
                pool = group.pools[i]
                speed = float(table.kind(pool.kind).relative_speed[group.representative])
                service_s = spec.reference_ms_per_request / speed / 1000.0
                # Power is linear in the busy share, so its least over the hour's loads
                # is at the lowest or the highest of them.
                kw = (
                    np.minimum(
                        *(
                            energy.member_power_w(
                                snapshot,
                                pool.kind,
                                np.full(span.size, group.representative),
                                accelerators,
                                np.minimum(1.0, load[d, span] * service_s),
                            )
                            for load in (low, high)
                        )
                    )
                    / 1000.0
                )
                columns = n + np.arange(span.size)
                n += span.size
                cost.append(kw * intensity[g][span])
                kw_of.append(kw)
                upper.append(np.full(span.size, per_node))
                equality_row.append(rows_of_d)
                zone_of.append(np.full(span.size, int(table.zone_code[group.representative])))
                ub_row.append((first_pool[g] + i) * hours + span)
                ub_column.append(columns)
                ub_value.append(np.full(span.size, float(accelerators)))
                if limit is not None:
                    ub_row.append((len(capacity) + limit) * hours + span)
                    ub_column.append(columns)
                    ub_value.append(np.ones(span.size))
    total_hours = float(served.sum())
    if n == 0:
        return InferenceBound(
            gco2=0.0,
            kwh=0.0,
            deployments=len(specs),
            replica_hours=total_hours,
            variables=0,
            constraints=0,
            solve_s=time.perf_counter() - began,
        )
    a_eq = coo_matrix(
        (np.ones(n), (np.concatenate(equality_row), np.arange(n))), shape=(len(rows_needed), n)
    )
    bounds_ub = np.repeat(np.array(capacity + limits), hours)
    a_ub = coo_matrix(
        (np.concatenate(ub_value), (np.concatenate(ub_row), np.concatenate(ub_column))),
        shape=(bounds_ub.size, n),
    )
    result = linprog(
        np.concatenate(cost),
        A_ub=a_ub.tocsr(),
        b_ub=bounds_ub,
        A_eq=a_eq.tocsr(),
        b_eq=np.array([served[d, h] for d, h in rows_needed]),
        bounds=np.column_stack([np.zeros(n), np.concatenate(upper)]),
        method="highs",
    )
    if result.status != 0:
        raise BoundUnavailable(f"HiGHS found no inference optimum: {result.message}")
    x = result.x
    zones = np.concatenate(zone_of)
    return InferenceBound(
        gco2=float(result.fun),
        kwh=float(np.concatenate(kw_of) @ x),
        deployments=len(specs),
        replica_hours=total_hours,
        variables=n,
        constraints=len(rows_needed) + bounds_ub.size,
        solve_s=time.perf_counter() - began,
        replica_hours_by_zone={
            table.zones[code]: float(x[zones == code].sum()) for code in np.unique(zones)
        },
    )
