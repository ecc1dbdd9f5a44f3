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
under that cap, host share and PUE included, as the policies' usage is accounted
(a MIG slice's pool at the slice's own speed and power, as the simulation runs and
accounts work on slices). Modes that a mix of the pool's others beats (as much work
from no more accelerator-hours at no more power) are left out: the optimum is the
same, from a smaller program;
``I`` is the *recorded* hourly intensity (the accounting's, fallbacks included);
``work[j]`` is the job's reference accelerator-hours (duration × workers × GPUs
per worker; the same in each of a job's alternative gang shapes, whose pools it may
use too);
``inference[p, h]`` is the least any evaluated policy's deployments held there.
A job some policy ran must have a pool here (``BoundUnavailable`` otherwise): left out,
its emissions would count against that policy and not against the optimum. A job no
policy started (its deadline passed before any node could meet it) is left out, as it
is of every policy's emissions. One that some policy left unfinished (never started, or
still running when the run stopped draining) is done here in full: that policy did less
of the work, and ``Bound.unequal_work`` says why no share is measured against the bound.

A job's window on a pool runs from its submission to the latest of: the latest finish
of the job under any evaluated policy, its deadline, and its latest start (its
submission where it has none) plus its run on that pool at the pool's slowest power
mode. Every evaluated policy's schedule is therefore a feasible point (or, where it
capped power at a mode left out, beaten by one), so no policy can emit less than the
bound, and the bound is the optimum *over the same service*, not an unreachable one
that would hold every job for the cleanest week: a slow pool's long run (a MIG
1g.10gb slice's is seven times an A100's) opens no late hours on the fast pools, where
no run the job was promised would still be going.

A job never runs on more accelerators at once than it has (its width, the same in
each of its shapes): without that row a job could run at full width in every pool and
power mode of an hour together, finishing in a few clean hours what takes it a day.
Nor, in the hour its window on a pool ends, on more of that pool than the part of the
hour left, over all its power modes together.

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
from cloud.scheduler.arrays import FloatArray, IntArray
from cloud.scheduler.filters import PASS, static_filters
from cloud.scheduler.model import KIND_INDEX
from cloud.scheduler.policy import Policy
from cloud.scheduler.shape import make_shape
from cloud.signals.grid import GridSignals
from shared.accelerators import capped_throughput, lowest_power_share
from shared.mig_profiles import mig_profile_of

from .simulation import DAY_S, HOUR_S, SimOutcome
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
    # Why no policy's training compares with it ("" where every one does): a job it
    # does that some policy left unfinished, so that policy did less of the work.
    unequal_work: str = ""


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
    default power limit and held to each power-capping share its model allows. MIG
    slices run at their default only: no policy caps them (``cloud.green.power_capping``:
    NVML limits the whole GPU), so offering caps there would credit the optimum with
    savings no schedule can make."""
    gpus = snapshot.nodes.kinds[column]
    speed = float(gpus.relative_speed[row])
    max_power_w = float(gpus.max_power_w[row])
    model = snapshot.nodes.model_at(column, row)
    lowest = lowest_power_share(model)
    shares = [1.0]
    if max_power_w > 0 and mig_profile_of(model) is None:
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


def _efficient_modes(
    modes: Sequence[tuple[float, float]],
) -> tuple[tuple[float, float], ...]:
    """The power modes (speed, kW) no mix of the others beats: the vertices of the upper
    concave hull of the modes and (0, 0) in the (kW, speed) plane, kW ascending.

    A mode under that hull is beaten by a mix of its neighbours on it (or by one of
    them and idling): as much work or more from no more accelerator-hours at no more
    power, in every hour, so that an optimum never needs it. On the shipped curve an
    A100 (host share included) loses 0.8 of its limit (2 % less power for 2 % less
    speed, where a mix of 0.7 and the default does better) and 0.4 (less work per kWh
    than 0.5). Exact only where every mode of a job on a pool has the same window (no
    ``start_by``) and no more of an hour than the pool's window leaves (the partial
    hours' rows)."""
    hull: list[tuple[float, float]] = [(0.0, 0.0)]
    for speed, kw in sorted(modes, key=lambda mode: (mode[1], -mode[0])):
        if speed <= hull[-1][0]:
            continue  # no faster than a mode that draws no more
        while len(hull) >= 2:
            (speed_a, kw_a), (speed_b, kw_b) = hull[-2], hull[-1]
            # On or under the chord from the one before it to this one: a mix of those.
            if (speed_b - speed_a) * (kw - kw_a) <= (speed - speed_a) * (kw_b - kw_a):
                hull.pop()
            else:
                break
        hull.append((speed, kw))
    return tuple(hull[1:])


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


def jobs_that_cannot_finish_by(
    workload: Workload,
    nodes: Sequence[Node],
    energy: EnergyModel,
    origin_s: float,
    by_s: float,
) -> list[tuple[TrainingSpec, float]]:
    """The training jobs that cannot finish by ``by_s`` even if started at their
    submission (``origin_s`` + offset) on the fastest pool they may use (the optimum's
    pools and filters), at its default power: each with that run's seconds. A job no
    pool may hold is none of them: no policy runs any of it."""
    snapshot = Snapshot.build(now=origin_s, nodes=nodes)
    pools = _pools(snapshot, energy)
    if not pools:
        return []
    slowest = min(pool.speed for pool in pools)
    late = []
    for spec in workload.training:
        submitted_s = origin_s + spec.submit_offset_s
        if submitted_s + spec.duration_s / slowest <= by_s:
            continue  # done in time wherever it runs: no need to ask the filters
        speeds = [pools[p].speed for p in _eligible(snapshot, spec, pools)]
        if speeds and submitted_s + spec.duration_s / max(speeds) > by_s:
            late.append((spec, spec.duration_s / max(speeds)))
    return late


@dataclass(frozen=True, slots=True)
class _Window:
    """When a job may run (module docstring): from its submission to, on each pool,
    the latest of ``served_s`` and ``run_from_s`` plus its run on that pool."""

    start_s: float  # its submission
    served_s: float  # the latest any evaluated policy finished it; its deadline
    run_from_s: float  # its latest start; its submission where it has none

    def end_s(self, spec: TrainingSpec, pool: _Pool) -> float:
        """The end of its window on ``pool``: its run there at the pool's slowest power
        mode, from its latest start, may end later than any policy ended it."""
        slowest = min(speed for speed, _ in pool.modes)
        return max(self.served_s, self.run_from_s + spec.duration_s / slowest)


def _windows(workload: Workload, outcomes: Sequence[SimOutcome]) -> dict[str, _Window]:
    """Per job the simulations submitted (none after the period): its window, as the
    module docstring says."""
    windows: dict[str, _Window] = {}
    first = outcomes[0]
    for spec in workload.training:
        if spec.id not in first.jobs:
            continue
        record = first.jobs[spec.id]
        start = record.submitted_s
        served = start
        for outcome in outcomes:
            done = outcome.jobs[spec.id].finish_s
            served = max(served, done if done is not None else outcome.stopped_s)
        if record.deadline_s is not None:
            served = max(served, record.deadline_s)
        run_from = record.latest_start_s if record.latest_start_s is not None else start
        windows[spec.id] = _Window(start, served, max(start, run_from))
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
    A usage counts in the pool it names (its node's pool of its model: MIG slices or
    whole GPUs)."""
    table = snapshot.nodes
    pool_at: dict[tuple[int, int], int] = {}  # (snapshot row, pool column) -> pool
    for i, pool in enumerate(pools):
        for row in pool.nodes:
            pool_at[(row, pool.column)] = i
    least = np.full((len(pools), hours), np.inf)
    for outcome in outcomes:
        held = np.zeros((len(pools), hours))
        for usage in outcome.usages:
            if usage.work_id in outcome.jobs or usage.accelerator_kind != "gpu":
                continue
            node_row = table.index.get(usage.node_id)
            if node_row is None:
                continue
            column = table.column_of(node_row, "gpu", usage.accelerator_model)
            held_in = pool_at.get((node_row, column))
            if held_in is None:
                continue  # a node that trains nothing
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
    # The jobs the simulations submitted: none after the period (simulation.py).
    submitted = [spec for spec in workload.training if spec.id in outcomes[0].jobs]
    eligible = {spec.id: _eligible(snapshot, spec, pools) for spec in submitted}
    _check_every_run_job_has_a_pool(submitted, outcomes, eligible)
    # A job with no pool, or one no policy started (its deadline passed before any node
    # could meet it): in no policy's emissions, nor here.
    solvable = [
        spec
        for spec in submitted
        if eligible[spec.id]
        and any(outcome.jobs[spec.id].first_start_s is not None for outcome in outcomes)
    ]
    windows = _windows(workload, outcomes)
    latest = max(  # no training: none
        (windows[spec.id].end_s(spec, pools[p]) for spec in solvable for p in eligible[spec.id]),
        default=origin_s,
    )
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
    for j, spec in enumerate(solvable):
        window = windows[spec.id]
        start = window.start_s
        accelerators = spec.workers * spec.gpus_per_worker
        work.append(spec.duration_s / HOUR_S * accelerators)
        latest_start = start_by.get(spec.id) if start_by is not None else None
        first = math.floor((start - origin_s) / HOUR_S)
        for p in eligible[spec.id]:
            pool = pools[p]
            # With ``start_by`` a slower mode has a longer window than the faster ones
            # that beat it elsewhere: all of them stay.
            modes = pool.modes if start_by is not None else _efficient_modes(pool.modes)
            window_end = window.end_s(spec, pool)
            for mode_speed, mode_kw in modes:
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
    unequal = _unequal_work(solvable, outcomes)
    if not cost:
        return Bound(
            gco2=0.0,
            kwh=0.0,
            jobs=0,
            variables=0,
            constraints=0,
            solve_s=0.0,
            unequal_work=unequal,
        )
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
    jobs_of = np.concatenate(job_of)
    pool_hours = np.concatenate(pool_hour)
    # A job's own width: one row per job and hour of its window, over every pool and
    # power mode (the hour's share of the window, as each variable's own bound).
    job_hours, job_hour_row = np.unique(jobs_of * hours + pool_hours % hours, return_inverse=True)
    width = np.zeros(job_hours.size)
    np.maximum.at(width, job_hour_row, widths)
    a_width = coo_matrix((np.ones(n), (job_hour_row, columns)), shape=(job_hours.size, n))
    partial_row, partial_member, partial_width = _partial_hours(
        jobs_of * len(pools) * hours + pool_hours, widths, width[job_hour_row]
    )
    a_partial = coo_matrix(
        (np.ones(partial_member.size), (partial_row, partial_member)),
        shape=(partial_width.size, n),
    )
    result = linprog(
        c,
        A_ub=vstack([a_ub, a_width, a_partial]).tocsr(),
        b_ub=np.concatenate([np.maximum(capacity, 0.0).ravel(), width, partial_width]),
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
        constraints=len(solvable) + len(pools) * hours + job_hours.size + partial_width.size,
        solve_s=time.perf_counter() - began,
        gpu_hours_by_zone=by_zone,
        unequal_work=unequal,
    )


def _partial_hours(
    job_pool_hour: IntArray, widths: FloatArray, job_width: FloatArray
) -> tuple[IntArray, IntArray, FloatArray]:
    """Rows ``Σ_m x[j,p,m,h] ≤ accelerators[j] · in_window[j,p,h]`` for each job, pool
    and hour where the job's window on that pool covers less of the hour than its width
    row allows (its window ends there, on another pool later): without them, each of
    the pool's power modes would bring its own share of that hour.

    ``job_pool_hour``: each variable's (job, pool, hour) as one number; ``widths``: its
    own bound; ``job_width``: its job and hour's width row's bound. Returns each member
    variable's row, the member variables, and each row's bound."""
    keys, key_row = np.unique(job_pool_hour, return_inverse=True)
    key_width = np.zeros(keys.size)
    np.maximum.at(key_width, key_row, widths)
    modes = np.bincount(key_row, minlength=keys.size)
    job_key_width = np.zeros(keys.size)
    job_key_width[key_row] = job_width
    needed = (key_width < job_key_width) & (modes > 1)
    row_of_key = np.cumsum(needed) - 1
    members = np.flatnonzero(needed[key_row])
    return row_of_key[key_row[members]], members, key_width[needed]


def _unequal_work(specs: Sequence[TrainingSpec], outcomes: Sequence[SimOutcome]) -> str:
    """Why the policies' training does not compare with the optimum's, which does every
    one of ``specs`` in full: the first job some policy left unfinished, naming it and
    the policy ("" where every policy finished every one). Such a policy emitted for
    less work, and could come out below the optimum (its share over 100 %, or below 0)."""
    for spec in specs:
        for outcome in outcomes:
            record = outcome.jobs[spec.id]
            if record.finish_s is not None:
                continue
            config = outcome.config
            what = (
                "never started"
                if record.first_start_s is None
                else (
                    "had not finished when the run stopped draining, "
                    f"{config.max_drain_s / DAY_S:g} days after the period"
                )
            )
            return (
                f"job {spec.id} {what} under {config.policy.name}: that policy did less of "
                "the work than the optimum"
            )
    return ""


def _check_every_run_job_has_a_pool(
    specs: Sequence[TrainingSpec],
    outcomes: Sequence[SimOutcome],
    eligible: Mapping[str, list[int]],
) -> None:
    """Refuse an optimum that would leave out a job some policy ran: its emissions would
    count against that policy and not against the optimum, which could then come out
    above the policy. The optimum's pools allow what placement allows, so this is a
    fleet the outcomes were not simulated on, or a placement rule the bound lacks."""
    for spec in specs:
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
    (1.0: all of it); None when the optimum saves nothing, or when some policy did less
    of the work than the optimum (``Bound.unequal_work``)."""
    possible = baseline_gco2 - bound.gco2
    if possible <= 0 or bound.unequal_work:
        return None
    return (baseline_gco2 - policy_gco2) / possible
