"""Reproduce the green-scheduling evaluation tables (benchmarks/RESULTS.md, docs/green.md).

    python benchmarks/green_eval.py                 # everything, about 10 min on 2 cores
    python benchmarks/green_eval.py --only default  # one table
    python benchmarks/green_eval.py --jobs 2 --json results.json

Every row is one ``greenfed eval`` simulation; the equivalent command is printed
above each table. Tables:

* ``default``: the default scenario, 14 days from 2023-06-01, all policies;
* ``split``: how green's saving splits between placement, migration, temporal
  shifting and power capping, on the default fleet and on the other zones
  (``green-spatial`` without migration: placement; ``green-spatial``: + migration;
  ``green`` without power capping: + shifting; ``green``: + power capping);
* ``periods``: four other two-week periods of 2023;
* ``load``: the default period at a lighter and a heavier training load;
* ``min-saving``: how eagerly temporal shifting defers, saving against waiting;
* ``seeds``: the default period with other generated workloads (seeds 1-6).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cloud.eval.bound import Bound
from cloud.eval.inference_bound import InferenceBound
from cloud.eval.metrics import PolicyResult
from cloud.eval.optimum_share import OptimumShares, optimum_shares
from cloud.eval.runner import EvalOptions, run_eval

ALL_POLICIES = ("fifo-binpack", "spread", "green", "balanced", "cost", "latency")
SPLIT = ("fifo-binpack", "green-spatial", "green-temporal", "green")
PERIOD_POLICIES = ("fifo-binpack", "spread", "green", "balanced", "green-spatial", "green-temporal")
PERIODS = (date(2023, 1, 9), date(2023, 4, 10), date(2023, 7, 10), date(2023, 10, 9))
LOADS = (0.3, 0.5, 0.7)
MIN_SAVINGS = (0.1, 0.25, 0.4, 0.6)
SEEDS = (1, 2, 3, 4, 5, 6)
DEFAULT_SEED = EvalOptions().seed
ROOT = Path(__file__).resolve().parent.parent
OTHER_ZONES = "sim_devices/fleets/other-zones.toml"
DEFAULT_MIN_SAVING = EvalOptions().min_saving  # None: no temporal shifting


@dataclass(frozen=True, slots=True)
class Run:
    table: str
    label: str
    start: date
    policies: tuple[str, ...]
    load: float = 0.5
    migration: bool = True
    min_saving: float | None = DEFAULT_MIN_SAVING
    seed: int = DEFAULT_SEED
    power_capping: bool = True
    fleet: str | None = None  # a fleet file under the repository; None: the default fleet

    @property
    def command(self) -> str:
        load = f" --load {self.load:g}" if self.load != 0.5 else ""
        migration = "" if self.migration else " --no-migration"
        saving = (
            f" --min-saving {self.min_saving:g}"
            if self.min_saving is not None and self.min_saving != DEFAULT_MIN_SAVING
            else ""
        )
        seed = f" --seed {self.seed}" if self.seed != DEFAULT_SEED else ""
        capping = "" if self.power_capping else " --no-power-capping"
        fleet = f" --fleet {self.fleet}" if self.fleet is not None else ""
        return (
            f"greenfed eval --days 14 --start {self.start.isoformat()} "
            f"--policies {','.join(self.policies)}{load}{migration}{saving}{seed}{capping}{fleet}"
        )


def plan(only: str | None) -> list[Run]:
    runs = [
        Run("default", "2023-06-01", date(2023, 6, 1), ALL_POLICIES),
        *(
            Run(
                "split",
                f"{label}2023-06-01{variant}",
                date(2023, 6, 1),
                SPLIT,
                fleet=fleet,
                migration=migration,
                power_capping=capping,
            )
            for label, fleet in (("", None), ("other zones, ", OTHER_ZONES))
            for variant, migration, capping in (
                ("", True, True),
                (", no migration", False, True),
                (", no power capping", True, False),
            )
        ),
        *(Run("periods", start.isoformat(), start, PERIOD_POLICIES) for start in PERIODS),
        *(
            Run("load", f"load {load:g}", date(2023, 6, 1), ("fifo-binpack", "green"), load)
            for load in LOADS
        ),
        *(
            Run(
                "min-saving",
                f"min-saving {saving:g}",
                date(2023, 6, 1),
                ("fifo-binpack", "green"),
                min_saving=saving,
            )
            for saving in MIN_SAVINGS
        ),
        *(
            Run("seeds", f"seed {seed}", date(2023, 6, 1), ("fifo-binpack", "green"), seed=seed)
            for seed in SEEDS
        ),
    ]
    return [run for run in runs if only is None or run.table == only]


def execute(run: Run) -> tuple[list[PolicyResult], Bound | None, InferenceBound | None]:
    options = EvalOptions(
        start=run.start,
        days=14,
        policies=run.policies,
        target_load=run.load,
        migration=run.migration,
        min_saving=run.min_saving,
        seed=run.seed,
        power_capping=run.power_capping,
        fleet=ROOT / run.fleet if run.fleet is not None else None,
        bound=True,
    )
    report = run_eval(options)
    return report.results, report.bound, report.inference_bound


def of_optimum(
    results: Sequence[PolicyResult],
    result: PolicyResult,
    bound: Bound | None,
    inference_bound: InferenceBound | None,
) -> OptimumShares:
    """The shares of the optimum's saving over the first policy (the baseline) that
    ``result`` achieved: training, inference and total (cloud/eval/optimum_share.py)."""
    if bound is None or inference_bound is None:
        return OptimumShares(training=None, inference=None, total=None)
    return optimum_shares(results, result, bound, inference_bound)


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.2f} h"


def markdown(
    run: Run,
    results: Sequence[PolicyResult],
    bound: Bound | None,
    inference_bound: InferenceBound | None,
) -> str:
    baseline = next((r for r in results if r.policy == "fifo-binpack"), results[0])
    lines = [
        f"`{run.command}`",
        "",
        "| policy | kWh | tCO2eq | CO2 vs fifo-binpack | of optimum (training) "
        "| of optimum (inference) | of optimum (total) | cost (USD) | wait mean | "
        "queue wait mean | wait p95 | deadline misses | SLO violations | GPU util | "
        "deferred | moved | run time |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        change = (r.gco2 - baseline.gco2) / baseline.gco2 if baseline.gco2 else 0.0
        shares = of_optimum(results, r, bound, inference_bound)
        lines.append(
            f"| {r.policy} | {r.kwh:,.0f} | {r.gco2 / 1e6:.3f} | {change:+.1%} | "
            f"{_share(shares.training)} | {_share(shares.inference)} | "
            f"{_share(shares.total)} | {r.cost:,.0f} | "
            f"{_duration(r.wait_mean_s)} | {_duration(r.queue_wait_mean_s)} | "
            f"{_duration(r.wait_p95_s)} | {r.deadline_misses} | {r.slo_violations} | "
            f"{r.utilisation:.1%} | {r.deferred_jobs} | {r.migrations} | {r.runtime_s:.0f} s |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--only", choices=["default", "split", "periods", "load", "min-saving", "seeds"]
    )
    parser.add_argument("--jobs", type=int, default=1, help="simulations in parallel")
    parser.add_argument("--json", type=Path, help="write every result here as JSON")
    args = parser.parse_args(argv)
    runs = plan(args.only)
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        outcomes = list(pool.map(execute, runs))
    table = None
    collected: list[dict[str, object]] = []
    for run, (results, bound, inference_bound) in zip(runs, outcomes, strict=True):
        if run.table != table:
            table = run.table
            print(f"\n## {table}\n")
        print(f"### {run.label}\n")
        print(markdown(run, results, bound, inference_bound))
        if bound is not None and inference_bound is not None:
            print(
                f"\noffline optimum: training {bound.gco2 / 1e6:.3f} tCO2eq, {bound.kwh:,.0f} kWh; "
                f"inference {inference_bound.gco2 / 1e6:.3f} tCO2eq, "
                f"{inference_bound.kwh:,.0f} kWh"
            )
        print()
        for r in results:
            shares = of_optimum(results, r, bound, inference_bound)
            collected.append(
                {
                    "table": run.table,
                    "label": run.label,
                    "command": run.command,
                    **r.as_json(),
                    # "of_optimum" stays the training share, as in report.as_json
                    "of_optimum": shares.training,
                    "of_optimum_training": shares.training,
                    "of_optimum_inference": shares.inference,
                    "of_optimum_total": shares.total,
                }
            )
    if args.json is not None:
        args.json.write_text(json.dumps(collected, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
