"""The offline optimum ``greenfed eval`` measures policies against: the least
training CO2 a schedule with perfect knowledge could emit for the same scenario.

A linear program over job × node pool × hour, solved by HiGHS (``scipy.optimize.
linprog``). ``x[j, p, h]`` is the accelerator-hours job ``j`` runs on pool ``p`` (the
fleet's training nodes' GPU pools, every pool column of the snapshot, MIG slices
included, grouped by zone, model, speed, power, taints and labels) in hour ``h``:

    minimise   Σ x[j,p,m,h] · kW[p,m] · I[zone(p), h]                 (gCO2eq)
    such that  Σ_{p,m,h} x[j,p,m,h] · speed[p,m] = work[j]            every job is done
               Σ_{j,m} x[j,p,m,h] ≤ accelerators[p] − inference[p,h]  capacity
               Σ_{p,m} x[j,p,m,h] ≤ accelerators[j] · in_window[j,h]  a job's own width
               0 ≤ x[j,p,m,h]

``m`` is a power mode of the pool: its devices at their default power limit, or
held to any share of it on the power-capping curve the device allows (0.4 to 0.8,
``cloud.green.power_capping.ALL_POWER_SHARES``: more than the policies use), each
at its own pace ``speed[p, m]`` (the pool's speed × ``capped_throughput``) and draw
``kW[p, m]``: one accelerator's power at the energy model's training utilisation
under that cap, host share and PUE included, as the policies' usage is accounted;
``I`` is the *recorded* hourly intensity (the accounting's, fallbacks included);
``work[j]`` is the job's reference accelerator-hours (duration × workers × GPUs
per worker; the same in each of a job's alternative gang shapes, whose pools it may
use too);
``inference[p, h]`` is the least any evaluated policy's deployments held there.
A job some policy ran must have a pool here (``BoundUnavailable`` otherwise): left out,
its emissions would count against that policy and not against the optimum.

A job's window runs from its submission to the latest of: its own slack (its
deadline; its latest start plus its run on the slowest pool it may use) and the
latest finish of the job under any evaluated policy. Every evaluated policy's
schedule is therefore a feasible point, so no policy can emit less than the bound,
and the bound is the optimum *over the same service*, not an unreachable one that
would hold every job for the cleanest week.

A job never runs on more accelerators at once than it has (its width, the same in
each of its shapes): without that row a job could run at full width in every pool and
power mode of an hour together, finishing in a few clean hours what takes it a day.

Relaxed (each makes the bound lower, never higher): work is divisible (a job may run
on any number of its accelerators up to its width, split across pools and hours,
preempted and moved for free: no checkpoint loss, no restart time), gang members need
not share a pool or a speed or a power mode, a job's hours may mix power modes, and
jobs have no minimum run length. The bound speaks for training only; inference's optimum is
inference_bound.py, and optimum_share.py measures each against its own.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from cloud.green.energy import EnergyModel
from cloud.green.power_capping import ALL_POWER_SHARES
from cloud.green.window import window_means
from cloud.scheduler import Node, Snapshot
from cloud.scheduler.arrays import FloatArray
from cloud.scheduler.filters import PASS, static_filters
from cloud.scheduler.model import KIND_INDEX
from cloud.scheduler.policy import Policy
from cloud.scheduler.shape import make_shape
from cloud.signals.grid import GridSignals
from shared.accelerators import capped_throughput, lowest_power_share

from .simulation import HOUR_S, SimOutcome
from .workload import TrainingSpec, Workload, training_job

KWH_PER_WH = 1.0 / 1000.0


class BoundUnavailable(RuntimeError):
    """The program could not be solved (SciPy missing, or HiGHS gave up), or would leave
    out a job some policy ran."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Bound:
    gco2: float  # training emissions of the optimum
    kwh: float
    jobs: int
    variables: int
    constraints: int
    solve_s: float
    gpu_hours_by_zone: dict[str, float] = field(default_factory=dict)  # where it ran the work


@dataclass(frozen=True, slots=True)
class _Pool:
    nodes: tuple[int, ...]  # snapshot rows
    column: int  # the snapshot's pool column: a node's whole GPUs, or its slices of one profile
    accelerators: int
    speed: float
    kw: float  # one accelerator, host share and PUE included
    representative: int
    # (speed, kW) at the default power limit and at each power-capping share allowed
    modes: tuple[tuple[float, float], ...] = ()

    @property
    def accelerators_per_node(self) -> int:
        return self.accelerators // len(self.nodes)


def _pools(snapshot: Snapshot, energy: EnergyModel) -> list[_Pool]:
    """The training nodes' GPU pools grouped by everything placement and energy see.

    Every GPU pool column counts, not only each node's first: the scheduler places work
    on all of a node's pools of the kind (snapshot.py), so a node with MIG slices beside
    whole GPUs offers both, each with its own count, speed and power. Without the slices
    a policy that ran work on them could emit less than the optimum."""
    table = snapshot.nodes
    groups: dict[tuple[int, Hashable], list[tuple[int, float]]] = {}
    for column in table.kind_columns[KIND_INDEX["gpu"]]:
        gpus = table.kinds[column]
        rows = np.flatnonzero((gpus.capacity > 0) & table.runs_training)
        kw = (
            energy.member_power_w(
                snapshot, "gpu", rows, 1, energy.training_utilisation, column=column
            )
            / 1000.0
        )
        for row, power_kw in zip(rows.tolist(), kw.tolist(), strict=True):
            # What the static filters read (filters.static_filters), so that one node of
            # a pool passes for a job exactly when all of them do.
            traits = (
                int(table.site_code[row]),
                int(table.zone_code[row]),
                int(gpus.model_code[row]),
                int(gpus.capacity[row]),
                int(gpus.memory_bytes[row]),
                float(gpus.relative_speed[row]),
                round(power_kw, 9),
                bool(table.healthy[row]),
                bool(table.approved[row]),
                int(table.isolation_rank[row]),
                bool(table.runs_containers[row]),
                bool(table.receives_secrets[row]),
                tuple(table.taint_matrix[row].tolist()),
                tuple(int(codes[row]) for codes in table.label_codes.values()),
            )
            groups.setdefault((column, traits), []).append((row, power_kw))
    pools = []
    for (column, _), members in sorted(
        groups.items(), key=lambda item: (item[1][0][0], item[0][0])
    ):
        first = members[0][0]
        gpus = table.kinds[column]
        pools.append(
            _Pool(
                nodes=tuple(row for row, _ in members),
                column=column,
                accelerators=int(gpus.capacity[first]) * len(members),
                speed=float(gpus.relative_speed[first]),
                kw=members[0][1],
                representative=first,
                modes=_power_modes(snapshot, energy, column, first),
            )
        )
    return pools


def _power_modes(
    snapshot: Snapshot, energy: EnergyModel, column: int, row: int
) -> tuple[tuple[float, float], ...]:
    """(speed, kW of one accelerator) of node ``row``'s GPUs in pool ``column`` at their
    default power limit and held to each power-capping share its model allows."""
    gpus = snapshot.nodes.kinds[column]
    speed = float(gpus.relative_speed[row])
    max_power_w = float(gpus.max_power_w[row])
    lowest = lowest_power_share(snapshot.nodes.model_at(column, row))
    shares = [1.0]
    if max_power_w > 0:
        shares += [share for share in ALL_POWER_SHARES if share >= lowest]
    modes = []
    for share in shares:
        power_w = energy.member_power_w(
            snapshot,
            "gpu",
            np.array([row]),
            1,
            energy.training_utilisation,
            column=column,
            power_limit_w=None if share == 1.0 else share * max_power_w,
        )
        modes.append((speed * capped_throughput(share), float(power_w[0]) / 1000.0))
    return tuple(modes)


def _eligible(snapshot: Snapshot, spec: TrainingSpec, pools: Sequence[_Pool]) -> list[int]:
    """The pools the job may use: the scheduler's own static filters, without the
    deadline and windows (which only say when, and a late run is still a run), on each
    pool's own column, as the scheduler asks them (a job without a ``mig_profile`` may
    take MIG slices, one with one only that profile's: scheduler/mig.py). A job
    with alternative gang shapes (flexible shapes) may use the pools of any of them: a
    1×8 job that may run as 2×4 also fits 4-GPU servers, so every policy's schedule
    stays a feasible point. Its work is the same in every shape (the same total).
    No tenant's slice quota keeps it off a profile here: that only makes the bound
    lower, never higher."""
    job = dataclasses.replace(training_job(spec, snapshot.now), deadline=None, max_delay_s=None)
    columns = sorted({pool.column for pool in pools})
    usable: set[int] = set()
    for shaped in (job, *(job.reshaped(shape) for shape in job.alternative_shapes)):
        shape = make_shape(shaped, Policy())
        for column in columns:
            codes = static_filters(snapshot, shape, column, None).codes
            usable.update(
                i
                for i, pool in enumerate(pools)
                if pool.column == column and codes[pool.representative] == PASS
            )
    return sorted(usable)


def _windows(
    workload: Workload,
    outcomes: Sequence[SimOutcome],
    pools: Sequence[_Pool],
    eligible: Mapping[str, list[int]],
) -> dict[str, tuple[float, float]]:
    """Per job: (submission, latest end), as the module docstring says."""
    windows: dict[str, tuple[float, float]] = {}
    first = outcomes[0]
    for spec in workload.training:
        record = first.jobs[spec.id]
        start = record.submitted_s
        end = start
        for outcome in outcomes:
            done = outcome.jobs[spec.id].finish_s
            end = max(end, done if done is not None else outcome.stopped_s)
        slowest = min(
            (speed for i in eligible[spec.id] for speed, _ in pools[i].modes), default=1.0
        )
        run_s = spec.duration_s / slowest
        if record.deadline_s is not None:
            end = max(end, record.deadline_s)
        if record.latest_start_s is not None:
            end = max(end, record.latest_start_s + run_s)
        windows[spec.id] = (start, max(end, start + run_s))
    return windows


def _inference_load(
    outcomes: Sequence[SimOutcome],
    snapshot: Snapshot,
    pools: Sequence[_Pool],
    origin_s: float,
    hours: int,
) -> FloatArray:
    """Per pool and hour: the accelerator-hours the evaluated policies' deployments
    held there, the least over the policies (what training could have had at most).

    A usage names its node, not which of the node's GPU pools it held: on a node with
    several (MIG slices beside whole GPUs) it counts in the one pool that could hold
    it, and in none where more than one could (less held: the bound only lower)."""
    pools_of_row: dict[int, list[int]] = {}
    for i, pool in enumerate(pools):
        for row in pool.nodes:
            pools_of_row.setdefault(row, []).append(i)
    least = np.full((len(pools), hours), np.inf)
    for outcome in outcomes:
        held = np.zeros((len(pools), hours))
        for usage in outcome.usages:
            if usage.work_id in outcome.jobs or usage.accelerator_kind != "gpu":
                continue
            could_hold = [
                i
                for i in pools_of_row.get(snapshot.nodes.index.get(usage.node_id, -1), [])
                if pools[i].accelerators_per_node >= usage.accelerators
            ]
            if len(could_hold) != 1:
                continue
            held_in = could_hold[0]
            first = max(0, math.floor((usage.start_s - origin_s) / HOUR_S))
            last = min(hours, math.ceil((usage.end_s - origin_s) / HOUR_S))
            for hour in range(first, last):
                begin = origin_s + hour * HOUR_S
                overlap = min(usage.end_s, begin + HOUR_S) - max(usage.start_s, begin)
                held[held_in, hour] += max(0.0, overlap) / HOUR_S * usage.accelerators
        least = np.minimum(least, held)
    return np.where(np.isfinite(least), least, 0.0)


def optimum(
    workload: Workload,
    nodes: Sequence[Node],
    outcomes: Sequence[SimOutcome],
    recorded: GridSignals,
    energy: EnergyModel,
    *,
    start_by: Mapping[str, float] | None = None,
) -> Bound:
    """The least training CO2 over the evaluated policies' service (module docstring).

    ``start_by`` (job id -> a time) makes it a reference, not a bound: each job named
    runs no later than from that time at the pace of the pool and power mode it runs
    on (``start_by + work / pace``), so it is not held back beyond it. With the
    baseline's start of each job that cannot wait, it says what the least CO2 is
    without making any such job wait longer than the baseline did (see
    ``baseline_start_by``). A policy that waits longer can emit less than it."""
    try:
        from scipy.optimize import linprog
        from scipy.sparse import coo_matrix, vstack
    except ImportError as error:  # pragma: no cover - scipy is in the cloud extra
        raise BoundUnavailable(f"the optimum needs SciPy: {error}") from None
    began = time.perf_counter()
    origin_s = outcomes[0].config.start_s
    snapshot = Snapshot.build(now=origin_s, nodes=nodes)
    pools = _pools(snapshot, energy)
    eligible = {spec.id: _eligible(snapshot, spec, pools) for spec in workload.training}
    _check_every_run_job_has_a_pool(workload, outcomes, eligible)
    windows = _windows(workload, outcomes, pools, eligible)
    latest = max((end for _, end in windows.values()), default=origin_s)  # no training: none
    hours = max(1, math.ceil((latest - origin_s) / HOUR_S))
    hour_starts = origin_s + HOUR_S * np.arange(hours, dtype=np.float64)
    intensity = hourly_carbon(
        recorded, snapshot, [pool.representative for pool in pools], hour_starts
    )
    capacity = np.array([[pool.accelerators] for pool in pools], dtype=np.float64) - (
        _inference_load(outcomes, snapshot, pools, origin_s, hours)
    )

    cost: list[np.ndarray] = []
    upper: list[np.ndarray] = []
    speed: list[np.ndarray] = []
    job_of: list[np.ndarray] = []
    pool_hour: list[np.ndarray] = []
    kw: list[np.ndarray] = []
    zone_of: list[np.ndarray] = []
    work: list[float] = []
    # A job with no pool that no policy ran either: in no policy's emissions, nor here.
    solvable = [spec for spec in workload.training if eligible[spec.id]]
    for j, spec in enumerate(solvable):
        start, window_end = windows[spec.id]
        accelerators = spec.workers * spec.gpus_per_worker
        work.append(spec.duration_s / HOUR_S * accelerators)
        latest_start = start_by.get(spec.id) if start_by is not None else None
        first = math.floor((start - origin_s) / HOUR_S)
        for p in eligible[spec.id]:
            pool = pools[p]
            for mode_speed, mode_kw in pool.modes:
                end = window_end
                if latest_start is not None:
                    end = max(start, latest_start) + spec.duration_s / mode_speed
                last = min(hours, math.ceil((end - origin_s) / HOUR_S))
                span = np.arange(first, last)
                begin = origin_s + span * HOUR_S
                share = (np.minimum(end, begin + HOUR_S) - np.maximum(start, begin)) / HOUR_S
                cost.append(mode_kw * intensity[p, span])
                upper.append(accelerators * np.clip(share, 0.0, 1.0))
                speed.append(np.full(span.size, mode_speed))
                job_of.append(np.full(span.size, j))
                pool_hour.append(p * hours + span)
                kw.append(np.full(span.size, mode_kw))
                zone_of.append(
                    np.full(span.size, int(snapshot.nodes.zone_code[pool.representative]))
                )
    if not cost:
        return Bound(gco2=0.0, kwh=0.0, jobs=0, variables=0, constraints=0, solve_s=0.0)
    c = np.concatenate(cost)
    n = c.size
    columns = np.arange(n)
    a_eq = coo_matrix(
        (np.concatenate(speed), (np.concatenate(job_of), columns)), shape=(len(solvable), n)
    )
    a_ub = coo_matrix(
        (np.ones(n), (np.concatenate(pool_hour), columns)), shape=(len(pools) * hours, n)
    )
    widths = np.concatenate(upper)
    # A job's own width: one row per job and hour of its window, over every pool and
    # power mode (the hour's share of the window, as each variable's own bound).
    job_hours, job_hour_row = np.unique(
        np.concatenate(job_of) * hours + np.concatenate(pool_hour) % hours, return_inverse=True
    )
    width = np.zeros(job_hours.size)
    np.maximum.at(width, job_hour_row, widths)
    a_width = coo_matrix((np.ones(n), (job_hour_row, columns)), shape=(job_hours.size, n))
    result = linprog(
        c,
        A_ub=vstack([a_ub, a_width]).tocsr(),
        b_ub=np.concatenate([np.maximum(capacity, 0.0).ravel(), width]),
        A_eq=a_eq.tocsr(),
        b_eq=np.array(work),
        bounds=np.column_stack([np.zeros(n), widths]),
        method="highs",
    )
    if result.status != 0:
        raise BoundUnavailable(f"HiGHS found no optimum: {result.message}")
    x = result.x
    zones = np.concatenate(zone_of)
    by_zone = {
        snapshot.nodes.zones[code]: float(x[zones == code].sum()) for code in np.unique(zones)
    }
    return Bound(
        gco2=float(result.fun),
        kwh=float(np.concatenate(kw) @ x),
        jobs=len(solvable),
        variables=n,
        constraints=len(solvable) + len(pools) * hours + job_hours.size,
        solve_s=time.perf_counter() - began,
        gpu_hours_by_zone=by_zone,
    )


def _check_every_run_job_has_a_pool(
    workload: Workload, outcomes: Sequence[SimOutcome], eligible: Mapping[str, list[int]]
) -> None:
    """Refuse an optimum that would leave out a job some policy ran: its emissions would
    count against that policy and not against the optimum, which could then come out
    above the policy. The optimum's pools allow what placement allows, so this is a
    fleet the outcomes were not simulated on, or a placement rule the bound lacks."""
    for spec in workload.training:
        if eligible[spec.id]:
            continue
        for outcome in outcomes:
            record = outcome.jobs.get(spec.id)
            if record is not None and record.first_start_s is not None:
                raise BoundUnavailable(
                    f"job {spec.id} ({spec.workers}×{spec.gpus_per_worker} GPUs) ran under "
                    f"{outcome.config.policy.name} on {', '.join(record.nodes) or 'a node'}, "
                    "but the optimum has no GPU pool it may use"
                )


def hourly_carbon(
    recorded: GridSignals, snapshot: Snapshot, rows: Sequence[int], hour_starts: FloatArray
) -> FloatArray:
    """The recorded mean intensity (gCO2eq/kWh) of each node row's zone in each hour
    from ``hour_starts``: one row per node row, one column per hour (the optima's
    ``I``: the accounting's figures, fallbacks included)."""
    if not rows:
        return np.zeros((0, hour_starts.size))
    return np.vstack(
        [
            window_means(
                recorded,
                snapshot,
                np.full(hour_starts.size, row),
                hour_starts,
                hour_starts + HOUR_S,
                "carbon",
            ).values
            for row in rows
        ]
    )


def baseline_start_by(outcome: SimOutcome) -> dict[str, float]:
    """Each job that cannot wait (no deadline, no maximum delay): when ``outcome`` (the
    baseline) started it. For ``optimum(start_by=...)``."""
    return {
        job_id: record.first_start_s
        for job_id, record in outcome.jobs.items()
        if record.first_start_s is not None
        and record.deadline_s is None
        and record.latest_start_s is None
    }


def share_of_optimum(baseline_gco2: float, policy_gco2: float, bound: Bound) -> float | None:
    """How much of the optimum's training saving over the baseline a policy achieved
    (1.0: all of it); None when the optimum saves nothing."""
    possible = baseline_gco2 - bound.gco2
    if possible <= 0:
        return None
    return (baseline_gco2 - policy_gco2) / possible
