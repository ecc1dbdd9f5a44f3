"""How ``greenfed eval`` shows its results: a table, JSON, and an optional plot."""

from __future__ import annotations

import importlib
import json
import math
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import numpy as np

from shared.settings import ConfigError

from .bound import Bound
from .inference_bound import InferenceBound
from .metrics import PolicyResult, hourly_gpu_load
from .optimum_share import optimum_shares, total_reference_gco2
from .runner import EvalReport, zones_of

REQUIRED_KEYS = (
    "policy",
    "kwh",
    "gco2",
    "cost",
    "wait_mean_s",
    "wait_p95_s",
    "deadline_misses",
    "slo_violations",
    "utilisation",
)

_COLUMNS = (
    ("policy", "policy", "{}"),
    ("kWh", "kwh", "{:,.0f}"),
    ("tCO2eq", "gco2", "{:.3f}"),
    ("cost", "cost", "{:,.0f}"),
    ("wait mean", "wait_mean_s", "{}"),
    ("wait p95", "wait_p95_s", "{}"),
    ("unfinished", "unfinished_jobs", "{}"),
    ("deadline misses", "deadline_misses", "{}"),
    ("SLO violations", "slo_violations", "{}"),
    ("GPU util", "utilisation", "{:.1%}"),
    ("CO2 vs first", "gco2", "{}"),
    # Jobs held back, by why (metrics.py): temporal shifting, or waiting for capacity.
    ("temporal", "deferred_temporal_jobs", "{}"),
    ("capacity", "deferred_capacity_jobs", "{}"),
    ("migrated", "migrated_jobs", "{}"),
    ("capped", "capped_jobs", "{}"),
    ("reshaped", "reshaped_jobs", "{}"),
    ("runtime", "runtime_s", "{:.1f} s"),
)


# Usage records accounted with the conservative stand-in for a zone without a series.
_FALLBACK = ("fallback", "fallback_records", "{}")
# Shares of the optimum's saving (optimum_share.py), against each bound.
_OF_OPTIMUM_TRAINING = ("of optimum (training)", "training_gco2", "{}")
_OF_OPTIMUM_INFERENCE = ("of optimum (inference)", "inference_gco2", "{}")
_OF_OPTIMUM_TOTAL = ("of optimum (total)", "gco2", "{}")


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def _change(gco2: float, first_gco2: float) -> str:
    """The "CO2 vs first" cell: the change from the first policy's CO2; "-" where that
    emitted none, "n/a" where either is unknown (NaN)."""
    if not (math.isfinite(gco2) and math.isfinite(first_gco2)):
        return "n/a"
    return f"{(gco2 - first_gco2) / first_gco2:+.1%}" if first_gco2 else "-"


def table(
    results: Sequence[PolicyResult],
    bound: Bound | None = None,
    inference_bound: InferenceBound | None = None,
) -> str:
    """One row per policy; "CO2 vs first" compares with the first policy listed. Waits
    are over started work (never-started work is in "unfinished"); a "fallback"
    column appears when any usage was accounted without a recorded series; with the
    optimum (both bounds), "of optimum (training)", "(inference)" and "(total)" are
    the shares of its CO2 saving over the first policy that each policy achieved
    (optimum_share.py; "-" where there is none: the training and total ones where some
    policy left a job unfinished, which ``optimum_line`` says). "temporal" and
    "capacity" count the jobs held back by temporal shifting and those that waited for
    capacity; "migrated", "capped" and "reshaped" the jobs moved while running, run
    under a power cap and run in one of their alternative gang shapes."""
    first = results[0].gco2 if results else 0.0
    columns = list(_COLUMNS)
    if any(result.fallback_records for result in results):
        columns.insert(columns.index(("GPU util", "utilisation", "{:.1%}")), _FALLBACK)
    if bound is not None and inference_bound is not None:
        at = columns.index(("temporal", "deferred_temporal_jobs", "{}"))
        columns[at:at] = [_OF_OPTIMUM_TRAINING, _OF_OPTIMUM_INFERENCE, _OF_OPTIMUM_TOTAL]
    rows = []
    for result in results:
        row = []
        shares = (
            optimum_shares(results, result, bound, inference_bound)
            if bound is not None and inference_bound is not None
            else None
        )
        for header, attribute, pattern in columns:
            value = getattr(result, attribute)
            if header.startswith("of optimum"):
                assert shares is not None
                share = {
                    "training_gco2": shares.training,
                    "inference_gco2": shares.inference,
                    "gco2": shares.total,
                }[attribute]
                text = "-" if share is None else f"{share:.0%}"
            elif header == "tCO2eq":
                # NaN: no carbon intensity was known for a zone (the runner refuses
                # that; never printed as a figure should it get through).
                text = pattern.format(value / 1e6) if math.isfinite(value) else "n/a"
            elif header == "cost":
                # NaN: no price was known for the zones the work ran in (accounting.py).
                text = (
                    f"{pattern.format(value)} {result.currency}" if math.isfinite(value) else "n/a"
                )
            elif attribute in ("wait_mean_s", "wait_p95_s"):
                text = _duration(value)
            elif header == "CO2 vs first":
                text = _change(value, first)
            else:
                text = pattern.format(value)
            row.append(text)
        rows.append(row)
    headers = [header for header, _, _ in columns]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    lines = [
        "  ".join(
            h.ljust(w) if i == 0 else h.rjust(w)
            for i, (h, w) in enumerate(zip(headers, widths, strict=True))
        ),
        "  ".join("-" * w for w in widths),
    ]
    for row in rows:
        lines.append(
            "  ".join(
                cell.ljust(w) if i == 0 else cell.rjust(w)
                for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            )
        )
    return "\n".join(lines)


def describe(report: EvalReport) -> str:
    options = report.options
    scenario = report.scenario
    workload = scenario.workload
    flexible = sum(
        spec.deadline_offset_s is not None or spec.max_delay_s is not None
        for spec in workload.training
    )
    source = (
        str(options.workload)
        if options.workload
        else (
            f"generated{' (trace-shaped)' if options.generator == 'trace' else ''}, "
            f"seed {options.seed}, load {options.target_load:g}"
        )
    )
    return (
        f"{options.days:g} days from {options.start.isoformat()} UTC; "
        f"{len(scenario.nodes)} nodes ({options.fleet or 'default fleet'}); "
        f"workload {source}: {len(workload.training)} training jobs "
        f"({flexible} flexible), {len(workload.inference)} inference deployments"
        f"{_after_period(scenario.training_after_period, scenario.inference_after_period)}; "
        f"carbon {options.carbon_dir or 'shipped 2023 traces'} "
        f"({_forecasts(options.perfect_forecast, options.forecaster)})"
    )


def _after_period(training: int, inference: int) -> str:
    """The words for the work a workload file submits after the period (left out)."""
    if not training and not inference:
        return ""
    return (
        f" (left out, submitted after the period: {training} training jobs, "
        f"{inference} inference deployments)"
    )


def _forecasts(perfect: bool, forecaster: str) -> str:
    # The recorded future as the forecast: an oracle input, not an upper bound on what
    # a policy saves (a policy tuned for forecast error can do worse with it).
    return "oracle forecasts: the recorded future" if perfect else f"{forecaster} forecasts"


def optimum_line(
    results: Sequence[PolicyResult], bound: Bound, inference_bound: InferenceBound
) -> str:
    baseline = results[0]
    return (
        f"offline optimum (a relaxation; cloud/eval/bound.py, inference_bound.py): training "
        f"{bound.gco2 / 1e6:.3f} tCO2eq, {bound.kwh:,.0f} kWh, against "
        f"{baseline.training_gco2 / 1e6:.3f} tCO2eq for {baseline.policy}'s training "
        f"({bound.jobs} jobs, {bound.variables:,} variables, solved in {bound.solve_s:.1f} s); "
        f"inference {inference_bound.gco2 / 1e6:.3f} tCO2eq, {inference_bound.kwh:,.0f} kWh, "
        f"against {baseline.inference_gco2 / 1e6:.3f} tCO2eq "
        f"({inference_bound.deployments} deployments, "
        f"{inference_bound.replica_hours:,.0f} replica-hours, "
        f"{inference_bound.variables:,} variables, solved in {inference_bound.solve_s:.1f} s); "
        f"total {total_reference_gco2(bound, inference_bound) / 1e6:.3f} tCO2eq against "
        f"{baseline.gco2 / 1e6:.3f} tCO2eq"
        + (f"; no training or total share: {bound.unequal_work}" if bound.unequal_work else "")
    )


def as_json(
    results: Sequence[PolicyResult],
    bound: Bound | None = None,
    inference_bound: InferenceBound | None = None,
) -> str:
    """A list, one object per policy (a figure that could not be computed, such as the
    cost where no price was known, is null); with the optimum (both bounds), each also
    carries it and the shares of its saving the policy achieved: `of_optimum_training` (also,
    as before, `of_optimum`) against `optimum_training_gco2`, `of_optimum_inference`
    against `optimum_inference_gco2` and `of_optimum_total` against
    `optimum_total_gco2` (their sum); a share is null where the first policy leaves no
    room to save, and the training and total ones where some policy left a job
    unfinished: `optimum_unequal_work` then says which (otherwise null)."""
    items = []
    for result in results:
        item = result.as_json()
        if bound is not None and inference_bound is not None:
            shares = optimum_shares(results, result, bound, inference_bound)
            item["optimum_training_gco2"] = bound.gco2
            item["optimum_inference_gco2"] = inference_bound.gco2
            item["optimum_total_gco2"] = total_reference_gco2(bound, inference_bound)
            item["of_optimum"] = shares.training
            item["of_optimum_training"] = shares.training
            item["of_optimum_inference"] = shares.inference
            item["of_optimum_total"] = shares.total
            item["optimum_unequal_work"] = bound.unequal_work or None
        items.append({key: _json_value(value) for key, value in item.items()})
    # NaN and Infinity are no JSON (RFC 8259): a strict reader refuses the whole document.
    return json.dumps(items, indent=2, allow_nan=False)


def _json_value(value: object) -> object:
    """A figure nobody could compute (a cost without any price: NaN) is null in JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _json_value(inner) for key, inner in value.items()}
    return value


def pyplot() -> ModuleType:
    """matplotlib's pyplot (headless), or a clear error when the extra is missing."""
    try:
        matplotlib = importlib.import_module("matplotlib")
    except ImportError:
        raise ConfigError(
            "--plot needs matplotlib, which is not installed: pip install 'greenfed[plot]'"
        ) from None
    matplotlib.use("Agg")
    return importlib.import_module("matplotlib.pyplot")


def plot(report: EvalReport, path: Path) -> None:
    """Intensity per zone, and where the GPU load ran under each policy."""
    plt = pyplot()
    zones = zones_of(report.scenario.nodes)
    outcomes = report.outcomes
    figure, axes = plt.subplots(
        1 + len(outcomes), 1, figsize=(12, 2.6 * (1 + len(outcomes))), sharex=True
    )
    axes = np.atleast_1d(axes)
    start = report.options.start_s
    recorded = report.scenario.recorded
    hours = round(report.options.days * 24)
    times = start + 3600.0 * np.arange(hours, dtype=np.float64)
    days = (times - start) / 86400.0
    for zone in zones:
        series = recorded.series(zone)
        if series is not None:
            axes[0].plot(days, series.mean_carbon_g_per_kwh(times, times + 3600.0), label=zone)
    axes[0].set_ylabel("gCO2eq/kWh")
    axes[0].set_title("Grid carbon intensity (recorded)")
    axes[0].legend(loc="upper right", ncol=len(zones), fontsize="small")
    for axis, outcome, result in zip(axes[1:], outcomes, report.results, strict=True):
        _, load = hourly_gpu_load(outcome, zones)
        axis.stackplot(days, *[load[zone] for zone in zones], labels=zones)
        axis.set_ylabel("busy GPUs (cloud + edge)")
        axis.set_title(f"{result.policy}: {result.gco2 / 1e6:.3f} tCO2eq")
    axes[-1].set_xlabel(f"days from {report.options.start.isoformat()}")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
