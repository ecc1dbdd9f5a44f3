"""``greenfed eval``: the same scenario under each policy, one simulation per policy.

The scenario is the fleet (default: ``sim_devices/fleets/default.toml``), the
workload (default: ``generate.generate_workload`` with the seed; ``generator="trace"``:
``trace_shaped.generate_trace_shaped``, long jobs and many 8-GPU gangs) and the carbon
and price traces (default: the shipped 2023 data). Each policy replays exactly
the same workload on the same fleet and traces.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Literal

import numpy as np

from cloud.green.energy import EnergyModel
from cloud.green.latency import ServingLatency, default_latency_estimator
from cloud.green.policies import policy_spec
from cloud.green.waiting import DEFAULT_PATIENCE_S
from cloud.green.window import static_carbon_g_per_kwh
from cloud.scheduler import Node
from cloud.signals.datasets import HourlyTrace, load_traces
from cloud.signals.forecast import DEFAULT_FORECASTER, forecaster_named
from cloud.signals.grid import FloatArray, GridSignals
from cloud.signals.trace import TraceProvider

from .bound import Bound, jobs_that_cannot_finish_by, optimum
from .fleet import load_fleet_nodes
from .generate import NoTrainingCapacity, WorkloadParams, generate_workload
from .inference_bound import InferenceBound, inference_optimum
from .metrics import PolicyResult, evaluate, hourly_gpu_load, recorded_signals
from .simulation import DAY_S, HOUR_S, SimConfig, SimOutcome, Simulation
from .trace_shaped import generate_trace_shaped
from .workload import Workload, load_workload, traffic_weights, within_period

DEFAULT_POLICIES = ("fifo-binpack", "spread", "green", "balanced")
# The generated workload's shape: generate.py's mix, or trace_shaped.py's.
WORKLOAD_GENERATORS = ("default", "trace")


@dataclass(frozen=True, slots=True, kw_only=True)
class EvalOptions:
    start: date = date(2023, 6, 1)
    days: float = 14.0
    policies: tuple[str, ...] = DEFAULT_POLICIES
    seed: int = 2023
    fleet: Path | None = None
    workload: Path | None = None
    carbon_dir: Path | None = None
    forecaster: str = DEFAULT_FORECASTER
    perfect_forecast: bool = False
    energy: EnergyModel = field(default_factory=EnergyModel)
    min_saving: float | None = None  # temporal shifting's; None: the policy's default
    migration: bool = True  # False: no policy moves running work (an ablation)
    power_capping: bool = True  # False: no policy caps GPU power (an ablation)
    room_making: bool = True  # False: no policy moves work to make room (an ablation)
    target_load: float = WorkloadParams().target_load  # of the generated workload
    generator: str = "default"  # one of WORKLOAD_GENERATORS
    # A fleet zone without a series in the carbon directory is an error unless this
    # is set; then its work is accounted with the conservative fallback, and counted.
    allow_missing_zones: bool = False
    # Also solve the offline optimum (cloud/eval/bound.py) and report each policy's
    # saving as a share of the optimum's.
    bound: bool = False
    patience_s: float = DEFAULT_PATIENCE_S  # shifting policies' wait for cleaner capacity

    def __post_init__(self) -> None:
        if not self.days > 0:
            raise ValueError("days must be > 0")
        if not 0 < self.target_load <= 2:
            raise ValueError("the target load must be within (0, 2]")
        if not self.policies:
            raise ValueError("name at least one policy")
        if self.generator not in WORKLOAD_GENERATORS:
            raise ValueError(f"the workload generator is one of {', '.join(WORKLOAD_GENERATORS)}")
        if not 0 <= self.patience_s < float("inf"):
            raise ValueError("--patience must be finite and >= 0")
        if self.min_saving is not None and not 0 <= self.min_saving < 1:
            raise ValueError("--min-saving must be within [0, 1)")
        for name in self.policies:
            policy_spec(name)
        forecaster_named(self.forecaster)

    @property
    def start_s(self) -> float:
        return datetime(self.start.year, self.start.month, self.start.day, tzinfo=UTC).timestamp()


@dataclass(frozen=True, slots=True)
class Scenario:
    nodes: tuple[Node, ...]
    workload: Workload  # the work submitted within the evaluated period
    provider: TraceProvider
    recorded: GridSignals
    # A workload file's work submitted after the period, left out (the header says so).
    training_after_period: int = 0
    inference_after_period: int = 0


@dataclass(slots=True)
class EvalReport:
    options: EvalOptions
    scenario: Scenario
    results: list[PolicyResult]
    outcomes: list[SimOutcome]
    bound: Bound | None = None  # training's offline optimum (bound.py)
    inference_bound: InferenceBound | None = None  # inference's (inference_bound.py)


def build_scenario(options: EvalOptions) -> Scenario:
    nodes = tuple(load_fleet_nodes(options.fleet))
    provider = TraceProvider(options.carbon_dir, perfect_forecast=options.perfect_forecast)
    # Before the workload: a period the traces do not cover is refused at once, not
    # after generating its work (`--days 100000` is centuries of it).
    check_traces(provider, zones_of(nodes), options)
    if options.workload is not None:
        given = load_workload(options.workload)
    else:
        try:
            given = _generated_workload(options, nodes)
        except NoTrainingCapacity as error:
            raise ValueError(
                f"{options.fleet or 'the default fleet'}: {error}; give the evaluation a "
                "workload of its own with --workload"
            ) from None
    # The simulation submits nothing after the period: left out here, the optimum, the
    # header and a dumped workload count the same work as the policies do.
    workload = within_period(given, options.days * DAY_S)
    check_jobs_can_finish(nodes, workload, options)
    recorded = recorded_signals(provider, (node.zone for node in nodes))
    return Scenario(
        nodes,
        workload,
        provider,
        recorded,
        training_after_period=len(given.training) - len(workload.training),
        inference_after_period=len(given.inference) - len(workload.inference),
    )


def _generated_workload(options: EvalOptions, nodes: Sequence[Node]) -> Workload:
    if options.generator == "trace":
        return generate_trace_shaped(
            nodes,
            start_s=options.start_s,
            days=options.days,
            seed=options.seed,
            target_load=options.target_load,
        )
    return generate_workload(
        nodes,
        start_s=options.start_s,
        days=options.days,
        seed=options.seed,
        params=WorkloadParams(target_load=options.target_load),
    )


def check_traces(provider: TraceProvider, zones: Sequence[str], options: EvalOptions) -> None:
    """Refuse a scenario the traces cannot account: a fleet zone without a series
    (unless `allow_missing_zones`; a file with no value at all is none; even then, one
    that no fallback can account), an evaluated period the series do not cover, a
    series that ends before the drain after the period may, or an hour in the period
    or the drain at which the simulator would find no carbon intensity to plan with, or
    the accounting no price (where the zone has prices: a zone without any is accounted
    with the conservative fallback, and flagged)."""
    where = options.carbon_dir or "the shipped traces"
    missing = [zone for zone in zones if zone not in provider.zones]
    if missing and not options.allow_missing_zones:
        raise ValueError(
            f"fleet zone {missing[0]} has no carbon series in {where}"
            f"{_empty_file(missing[0], options)} "
            f"(have {', '.join(provider.zones)}); add one, or allow missing zones to "
            "account their work with the conservative fallback"
        )
    _check_fallback_exists(missing, [zone for zone in zones if zone not in missing], where)
    start_s = options.start_s
    end_s = start_s + options.days * 86400.0
    # The hours the simulator looks back: its history, or the forecaster's when longer.
    config = sim_config(options, options.policies[0])
    lookback_hours = max(config.history_hours, forecaster_named(config.forecaster).lookback_hours)
    reach = _Reach(config.start_s, config.end_s, config.max_drain_s, lookback_hours)
    for zone in zones:
        if zone in missing:
            continue
        trace = provider.trace(zone)
        if start_s < trace.start_s or start_s >= trace.end_s:
            raise ValueError(
                f"the evaluated period {options.start.isoformat()} + {options.days:g} days "
                f"is outside the {zone} series ({_day(trace.start_s)} to {_day(trace.end_s)})"
            )
        if end_s > trace.end_s:
            raise ValueError(
                f"the evaluated period runs past the end of the {zone} series "
                f"({_day(trace.end_s)}): shorten --days or start earlier"
            )
        _check_series_outlasts_drain(trace, reach)
        _check_values_in_reach(
            trace, trace.carbon(provider.emission_factor), "carbon intensity", reach
        )
        if np.isfinite(trace.price_per_mwh).any():
            _check_values_in_reach(trace, trace.price_per_mwh, "price", reach)


def _check_fallback_exists(
    missing: Sequence[str], with_series: Sequence[str], where: Path | str
) -> None:
    """Refuse an allowed missing zone that the conservative fallback cannot account
    either: the fallback is the highest of the fleet's recorded series over the hour and
    the zone's entry in the static table, so a zone with no entry in a fleet where no
    zone has a series has no carbon intensity at all, and the optimum's program and
    every CO2 figure would be NaN."""
    if with_series:
        return
    static = static_carbon_g_per_kwh()
    unaccountable = [zone for zone in missing if zone not in static]
    if unaccountable:
        raise ValueError(
            f"fleet zone {unaccountable[0]} has no carbon series in {where} and no entry in "
            "the static table, and no other fleet zone has a series: no fallback can account "
            "its CO2; add a series for it"
        )


def _check_series_outlasts_drain(trace: HourlyTrace, reach: _Reach) -> None:
    """Refuse a series that ends before the run may stop draining: the accounting and the
    optimum would hold its last hour's values for every hour after it (up to
    `max_drain_s`), silently, as figures they never recorded. The whole drain is asked
    for, as with a gap in it, since how long a policy drains is known only once it ran."""
    drain_end_s = reach.end_s + reach.max_drain_s
    if drain_end_s <= trace.end_s:
        return
    latest_end_s = trace.end_s - reach.max_drain_s
    remedy = (
        f", or evaluate a period that ends by {_hour(latest_end_s)}"
        if latest_end_s > trace.start_s
        else " (the series is shorter than the drain)"
    )
    raise ValueError(
        f"the {trace.zone} series ({trace.source}) ends with the hour from "
        f"{_hour(trace.end_s - HOUR_S)}, and after the evaluated period the run may still be "
        f"draining, up to {reach.max_drain_s / DAY_S:g} days after it, until "
        f"{_hour(drain_end_s)}: extend the file up to then{remedy}"
    )


def check_jobs_can_finish(nodes: Sequence[Node], workload: Workload, options: EvalOptions) -> None:
    """Refuse a training job that cannot finish before the run stops draining, even
    started at its submission on the fastest pool it may use: every policy would leave
    it unfinished, each having done a different part of its work, which no figure
    could then compare (the optimum does all of it)."""
    config = sim_config(options, options.policies[0])
    drain_end_s = config.end_s + config.max_drain_s
    late = jobs_that_cannot_finish_by(workload, nodes, options.energy, config.start_s, drain_end_s)
    if not late:
        return
    spec, run_s = late[0]
    others = f" (and {len(late) - 1} more)" if len(late) > 1 else ""
    raise ValueError(
        f"training job {spec.id}{others} cannot finish before the evaluation stops draining at "
        f"{_hour(drain_end_s)}, {config.max_drain_s / DAY_S:g} days after the period: "
        f"submitted at {_hour(config.start_s + spec.submit_offset_s)}, it runs "
        f"{run_s / DAY_S:.1f} days even on the fastest pool it may use; shorten it, or "
        "evaluate a longer period"
    )


def _empty_file(zone: str, options: EvalOptions) -> str:
    """Where the zone has a file after all (with no value in it), the words that say so."""
    trace = load_traces(options.carbon_dir).get(zone)
    return "" if trace is None else f" ({trace.source} has no carbon intensity in it)"


@dataclass(frozen=True, slots=True)
class _Reach:
    """The hours the simulator and the accounting read a zone's values at, and how far
    back the simulator looks for one."""

    start_s: float  # the evaluated period's
    end_s: float
    max_drain_s: float  # the run drains at most this long after it
    lookback_hours: int


def _check_values_in_reach(
    trace: HourlyTrace,
    values: FloatArray,
    quantity: Literal["carbon intensity", "price"],
    reach: _Reach,
) -> None:
    """Every evaluated hour, and every hour of the series in the drain after them, needs
    a recorded value (of `quantity`: "carbon intensity" or "price") within the
    `lookback_hours` the simulator looks back; without one the simulator has no grid
    for the zone there and would stop in the middle with a traceback, and the
    accounting would carry a value over a gap longer than anything that looks back."""
    hour_numbers = np.arange(values.size)
    last_value = np.maximum.accumulate(np.where(np.isfinite(values), hour_numbers, -1))
    first = trace.hour_index(reach.start_s)
    last = min(trace.hour_index(reach.end_s + reach.max_drain_s), values.size - 1)
    hours, known = hour_numbers[first : last + 1], last_value[first : last + 1]
    blind = hours[(known < 0) | (hours - known >= reach.lookback_hours)]
    if blind.size == 0:
        return
    hour = int(blind[0])
    hour_s = trace.start_s + hour * HOUR_S
    at = _hour(hour_s)
    where = (
        "within the evaluated period"
        if hour_s < reach.end_s
        else (
            "after the evaluated period, while the run may still be draining, up to "
            f"{reach.max_drain_s / DAY_S:g} days after it"
        )
    )
    if quantity == "price":
        series = f"the {trace.zone} price file (the one beside {trace.source})"
        remedy = ", or remove the price file to account the zone's cost with the fallback"
    else:
        series = f"the {trace.zone} series ({trace.source})"
        remedy = ""
    if last_value[hour] < 0:
        first_value = int(np.argmax(np.isfinite(values)))
        raise ValueError(
            f"{series} has no {quantity} at or before {at} ({where}; its first value is at "
            f"{_hour(trace.start_s + first_value * HOUR_S)}): start later, or fill the file"
            f"{remedy}"
        )
    raise ValueError(
        f"{series} has no {quantity} in the {reach.lookback_hours} hours up to {at} "
        f"({where}; the simulator looks back that far for a value, and the last is at "
        f"{_hour(trace.start_s + int(last_value[hour]) * HOUR_S)}): evaluate another "
        f"period, or fill the gap in the file{remedy}"
    )


def _hour(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, tz=UTC).strftime("%Y-%m-%d %H:%M")


def _day(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, tz=UTC).date().isoformat()


def serving_latency(scenario: Scenario, start_s: float) -> ServingLatency:
    """The latency estimator every policy places with (and the inference optimum
    filters by)."""
    # Placement meets each SLO at every hour's traffic mix (regions' traffic peaks at
    # different UTC hours), not only at the shares: a deployment's day is known here.
    day = start_s + HOUR_S * np.arange(24)
    return default_latency_estimator(
        {node.region for node in scenario.nodes}
        | {
            source.region
            for inference in scenario.workload.inference
            for source in inference.traffic
        },
        daily_mixes={
            spec.id: tuple(traffic_weights(spec, float(at_s)) for at_s in day)
            for spec in scenario.workload.inference
            if len(spec.traffic) > 1
        },
    )


def sim_config(options: EvalOptions, policy: str) -> SimConfig:
    return SimConfig(
        start_s=options.start_s,
        days=options.days,
        policy=policy_spec(policy),
        energy=options.energy,
        forecaster=options.forecaster,
        min_saving=options.min_saving,
        migration=options.migration,
        power_capping=options.power_capping,
        room_making=options.room_making,
        patience_s=options.patience_s,
    )


def run_eval(
    options: EvalOptions,
    *,
    scenario: Scenario | None = None,
    progress: Callable[[PolicyResult], None] | None = None,
) -> EvalReport:
    scenario = scenario or build_scenario(options)
    latency = serving_latency(scenario, options.start_s)
    results: list[PolicyResult] = []
    outcomes: list[SimOutcome] = []
    for name in options.policies:
        config = sim_config(options, name)
        began = time.perf_counter()
        outcome = Simulation(
            config, scenario.nodes, scenario.workload, scenario.provider, latency
        ).run()
        result = evaluate(outcome, scenario.recorded, runtime_s=time.perf_counter() - began)
        results.append(result)
        outcomes.append(outcome)
        if progress is not None:
            progress(result)
    if not options.bound:
        return EvalReport(options, scenario, results, outcomes)
    bound = optimum(scenario.workload, scenario.nodes, outcomes, scenario.recorded, options.energy)
    inference_bound = inference_optimum(
        scenario.workload, scenario.nodes, outcomes, scenario.recorded, options.energy, latency
    )
    return EvalReport(options, scenario, results, outcomes, bound, inference_bound)


def zones_of(nodes: Sequence[Node]) -> list[str]:
    return sorted({node.zone for node in nodes})


__all__ = [
    "DEFAULT_POLICIES",
    "WORKLOAD_GENERATORS",
    "EvalOptions",
    "EvalReport",
    "Scenario",
    "build_scenario",
    "hourly_gpu_load",
    "run_eval",
    "serving_latency",
    "zones_of",
]
