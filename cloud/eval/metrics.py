"""From a simulation's records to the numbers ``greenfed eval`` reports.

* ``kwh``, ``gco2``, ``cost``: all training (including the drain after the
  period, so every policy does the same work) plus inference within the period;
  energy attributed to work (accelerators used plus their host share), not idle
  nodes; intensity and price are the *recorded* series, not forecasts.
* ``wait_mean_s``, ``wait_p95_s``: training jobs that started, submission to
  first start, *including* deliberate deferral by temporal shifting. Work that
  never starts (a gang no node can hold, a deadline nothing can meet) has no wait:
  it is ``unfinished_jobs``, reported beside the waits, so a policy that gives up on
  work cannot look quicker for it. ``queue_wait_mean_s`` /
  ``queue_wait_p95_s`` leave out the time shifting held jobs back (waiting for
  capacity only); ``wait_mean_inflexible_s`` is the mean over jobs that cannot
  wait (no deadline, no maximum delay).
* ``deadline_misses``: jobs finishing after their deadline, or starting later
  than their ``max_delay_s`` allows (or never finishing / starting).
* ``slo_violations``: deployment-hours with fewer replicas running than asked
  for, or a running replica over the SLO at that hour's traffic and load.
* ``completion_mean_s``: training jobs that finished, submission to finish.
* ``utilisation``: GPU-seconds allocated within the period over all the fleet's
  GPUs (cloud and edge) times the period; ``busy_utilisation`` weights each
  allocation by how busy its work keeps it (a replica at 10 % load counts 10 %).
* ``deferred_temporal_jobs``, ``deferred_capacity_jobs``: jobs held back at least
  once by temporal shifting (a cleaner window within their slack), and jobs that
  waited for capacity (held for cleaner capacity that frees soon, or pending with no
  room); a job may be in both. ``deferred_jobs`` is the older, mixed count: started
  jobs held by either advisor. ``capped_jobs``: jobs that ran under a GPU power cap;
  ``migrated_jobs``: jobs moved while running (``migrations`` counts the moves);
  ``reshaped_jobs``: jobs that ran at least once in one of their alternative gang
  shapes instead of the declared one (flexible shapes).
* ``gco2_avoided``: Σ over jobs of (fifo-binpack's choice at submission −
  what actually ran), from ``cloud.green.accounting``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from cloud.green.accounting import (
    Totals,
    Usage,
    UsageAccount,
    account,
    by_work,
    counterfactual_usages,
    total,
)
from cloud.scheduler import Snapshot
from cloud.signals.grid import GridSignals, ZoneSeries
from cloud.signals.hourly import fill_forward, first_finite
from cloud.signals.trace import TraceProvider

from .simulation import HOUR_S, SimOutcome, pool_of, replica_usages
from .workload import training_job


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyResult:
    policy: str
    kwh: float
    gco2: float
    cost: float
    wait_mean_s: float
    wait_p95_s: float
    deadline_misses: int
    slo_violations: int
    utilisation: float
    # The same, each allocation weighted by how busy its work keeps it (training at the
    # energy model's utilisation, a replica at its load): what GPU telemetry averages.
    busy_utilisation: float = 0.0
    currency: str = "USD"
    jobs: int = 0
    unfinished_jobs: int = 0  # never finished (most never started), by the end of the drain
    never_started_jobs: int = 0
    flexible_jobs: int = 0
    deferred_jobs: int = 0  # started jobs held back by a start advisor (either cause)
    # Jobs (started or not) held back at least once, by why: temporal shifting kept
    # them for a cleaner window within their slack; or they waited for capacity (held
    # for cleaner capacity that frees soon, or pending because no node had room).
    deferred_temporal_jobs: int = 0
    deferred_capacity_jobs: int = 0
    capped_jobs: int = 0  # started at least once under a GPU power cap
    migrations: int = 0  # running jobs moved to cleaner capacity
    migrated_jobs: int = 0
    reshaped_jobs: int = 0  # ran at least once in an alternative gang shape
    # Training runs stopped to make room, by the scheduler's reason (priority, reclaim, quota).
    preemptions: dict[str, int] = field(default_factory=dict)
    deferral_wait_mean_s: float = 0.0  # mean wait of the jobs shifting deferred
    wait_mean_inflexible_s: float = 0.0
    # Waiting for capacity only: the waits less the time temporal shifting held jobs back.
    queue_wait_mean_s: float = 0.0
    queue_wait_p95_s: float = 0.0
    # Submission to finish, over the jobs that finished.
    completion_mean_s: float = 0.0
    training_kwh: float = 0.0
    training_gco2: float = 0.0
    inference_kwh: float = 0.0
    inference_gco2: float = 0.0
    counterfactual_gco2: float = 0.0
    gco2_avoided: float = 0.0
    slo_hours: int = 0
    fallback_records: int = 0
    gpu_hours_by_zone: Mapping[str, float] = field(default_factory=dict)
    passes: int = 0
    runtime_s: float = 0.0

    def as_json(self) -> dict[str, object]:
        return {
            name: (dict(value) if isinstance(value, Mapping) else value)
            for name in self.__slots__
            for value in (getattr(self, name),)
        }


def recorded_signals(provider: TraceProvider, zones: Iterable[str]) -> GridSignals:
    """The whole recorded series of each zone (gaps carried forward), for accounting."""
    series = {}
    for zone in sorted(set(zones)):
        if zone not in provider.zones:
            continue
        trace = provider.trace(zone)
        carbon = _filled(trace.carbon(provider.emission_factor))
        if carbon is None:
            continue
        price = _filled(trace.price_per_mwh)
        series[zone] = ZoneSeries(
            zone=zone,
            start_s=trace.start_s,
            carbon_g_per_kwh=carbon,
            price_per_mwh=price if price is not None else np.full(carbon.size, np.nan),
            currency=trace.currency,
            source=f"{provider.name} (recorded)",
        )
    return GridSignals(now_s=0.0, zones=series)


def _filled(values: np.ndarray) -> np.ndarray | None:
    start = first_finite(values)
    if start is None:
        return None
    filled = fill_forward(values)
    filled[:start] = filled[start]
    return filled


def _percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else 0.0


def _summed(counts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    result: dict[str, int] = {}
    for count in counts:
        for key, value in count.items():
            result[key] = result.get(key, 0) + value
    return dict(sorted(result.items()))


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if values else 0.0


def _clip(usage: Usage, start_s: float, end_s: float) -> float:
    return max(0.0, min(usage.end_s, end_s) - max(usage.start_s, start_s))


def evaluate(
    outcome: SimOutcome,
    recorded: GridSignals,
    *,
    runtime_s: float = 0.0,
    currency: str = "USD",
) -> PolicyResult:
    config = outcome.config
    start, end = config.start_s, config.end_s
    fleet = Snapshot.build(now=start, nodes=outcome.nodes)
    energy = config.energy
    accounts = account(outcome.usages, fleet, recorded, energy, currency=currency)
    training = [a for a in accounts if a.usage.work_id in outcome.jobs]
    inference = [a for a in accounts if a.usage.work_id not in outcome.jobs]
    actual = total(accounts)

    waits: list[float] = []
    queue_waits: list[float] = []
    inflexible: list[float] = []
    deferred_waits: list[float] = []
    for record in outcome.jobs.values():
        if record.first_start_s is None:
            continue  # never started: counted in unfinished_jobs, not in any wait
        wait = record.first_start_s - record.submitted_s
        waits.append(wait)
        queue_waits.append(max(0.0, wait - record.deferred_s))
        if record.deadline_s is None and record.latest_start_s is None:
            inflexible.append(wait)
        if record.deferred:
            deferred_waits.append(wait)

    counterfactual_total, avoided = _counterfactuals(
        outcome, fleet, recorded, accounts, currency=currency
    )

    gpus = sum(pool.count for node in outcome.nodes for pool in node.pools if pool.kind == "gpu")
    gpu_accounts = [a for a in accounts if a.usage.accelerator_kind == "gpu"]
    gpu_seconds = sum(_clip(a.usage, start, end) * a.usage.accelerators for a in gpu_accounts)
    busy_gpu_seconds = sum(
        _clip(a.usage, start, end) * a.usage.accelerators * a.usage.utilisation
        for a in gpu_accounts
    )
    fleet_gpu_seconds = gpus * (end - start)
    by_zone: dict[str, float] = {}
    for item in training:
        hours = (item.usage.end_s - item.usage.start_s) / HOUR_S * item.usage.accelerators
        by_zone[item.zone] = by_zone.get(item.zone, 0.0) + hours
    return PolicyResult(
        policy=config.policy.name,
        kwh=actual.kwh,
        gco2=actual.gco2,
        cost=actual.cost,
        currency=currency,
        wait_mean_s=_mean(waits),
        wait_p95_s=_percentile(waits, 95),
        deadline_misses=sum(record.missed for record in outcome.jobs.values()),
        slo_violations=outcome.slo_violations,
        utilisation=gpu_seconds / fleet_gpu_seconds if fleet_gpu_seconds > 0 else 0.0,
        busy_utilisation=busy_gpu_seconds / fleet_gpu_seconds if fleet_gpu_seconds > 0 else 0.0,
        jobs=len(outcome.jobs),
        unfinished_jobs=sum(r.finish_s is None for r in outcome.jobs.values()),
        never_started_jobs=sum(r.first_start_s is None for r in outcome.jobs.values()),
        flexible_jobs=sum(
            r.deadline_s is not None or r.latest_start_s is not None for r in outcome.jobs.values()
        ),
        deferred_jobs=len(deferred_waits),
        deferred_temporal_jobs=sum(r.deferred_temporal for r in outcome.jobs.values()),
        deferred_capacity_jobs=sum(
            r.deferred_capacity or r.waited_for_room for r in outcome.jobs.values()
        ),
        capped_jobs=sum(r.capped for r in outcome.jobs.values()),
        migrations=sum(r.migrations for r in outcome.jobs.values()),
        migrated_jobs=sum(r.migrations > 0 for r in outcome.jobs.values()),
        reshaped_jobs=sum(r.reshaped for r in outcome.jobs.values()),
        preemptions=_summed(r.preemptions for r in outcome.jobs.values()),
        deferral_wait_mean_s=_mean(deferred_waits),
        wait_mean_inflexible_s=_mean(inflexible),
        queue_wait_mean_s=_mean(queue_waits),
        queue_wait_p95_s=_percentile(queue_waits, 95),
        completion_mean_s=_mean(
            [r.finish_s - r.submitted_s for r in outcome.jobs.values() if r.finish_s is not None]
        ),
        training_kwh=total(training).kwh,
        training_gco2=total(training).gco2,
        inference_kwh=total(inference).kwh,
        inference_gco2=total(inference).gco2,
        counterfactual_gco2=counterfactual_total.gco2,
        gco2_avoided=avoided.gco2,
        slo_hours=outcome.slo_hours,
        fallback_records=sum(a.fallback for a in accounts),
        gpu_hours_by_zone=dict(sorted(by_zone.items())),
        passes=outcome.passes,
        runtime_s=runtime_s,
    )


def _counterfactuals(
    outcome: SimOutcome,
    fleet: Snapshot,
    recorded: GridSignals,
    accounts: Sequence[UsageAccount],
    *,
    currency: str,
) -> tuple[Totals, Totals]:
    """(the baseline's totals, baseline − actual) over the works that have both."""
    config = outcome.config
    energy = config.energy
    usages: list[Usage] = []
    covered: set[str] = set()
    for work_id, record in outcome.jobs.items():
        if record.counterfactual is None:
            continue
        covered.add(work_id)
        job = training_job(record.spec, record.submitted_s)
        usages.extend(counterfactual_usages(record.counterfactual, job, energy))
    nodes = {node.node_id: node for node in outcome.nodes}
    for work_id, deployment_record in outcome.deployments.items():
        choice = deployment_record.counterfactual
        if choice is None:
            continue
        covered.add(work_id)
        stop = min(
            deployment_record.retire_s if deployment_record.retire_s is not None else config.end_s,
            config.end_s,
        )
        for number, member in enumerate(choice.members):
            usages.extend(
                replica_usages(
                    deployment_record.spec,
                    f"{work_id}/counterfactual-{number}",
                    member.node_id,
                    pool_of(nodes[member.node_id], member.accelerator_kind),
                    member.accelerators,
                    max(choice.start_s, config.start_s),
                    stop,
                )
            )
    baseline = total(account(usages, fleet, recorded, energy, currency=currency))
    actual_by_work = by_work(accounts)
    actual = Totals()
    # In a fixed order: a float sum depends on it, and a set's order on the hash seed.
    for work_id in sorted(covered):
        actual = actual + actual_by_work.get(work_id, Totals())
    return baseline, baseline - actual


def hourly_gpu_load(
    outcome: SimOutcome, zones: Sequence[str]
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Busy GPUs per zone, hour by hour over the period (for the plot)."""
    config = outcome.config
    hours = round((config.end_s - config.start_s) / HOUR_S)
    times = config.start_s + HOUR_S * np.arange(hours)
    load = {zone: np.zeros(hours) for zone in zones}
    zone_of = {node.node_id: node.zone for node in outcome.nodes}
    for usage in outcome.usages:
        if usage.accelerator_kind != "gpu":
            continue
        first = max(0, int((usage.start_s - config.start_s) // HOUR_S))
        last = min(hours - 1, int((usage.end_s - config.start_s) // HOUR_S))
        series = load.setdefault(zone_of[usage.node_id], np.zeros(hours))
        for hour in range(first, last + 1):
            lo = config.start_s + hour * HOUR_S
            overlap = max(0.0, min(usage.end_s, lo + HOUR_S) - max(usage.start_s, lo))
            series[hour] += usage.accelerators * overlap / HOUR_S
    return times, load
