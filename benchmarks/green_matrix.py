"""The green robustness matrix (issue 16): `green` against `fifo-binpack` on grids,
periods and workloads it was not tuned on, each against the offline optimum.

    python benchmarks/green_matrix.py --jobs 2                 # the whole matrix
    python benchmarks/green_matrix.py --jobs 2 --short         # the CI form: 4 scenarios, 3 days
    python benchmarks/green_matrix.py --json matrix.json
    python benchmarks/green_matrix.py --jobs 2 --generator trace   # the trace-shaped workload

Scenarios: the default fleet on its four zones and `sim_devices/fleets/other-zones.toml`
(the same groups on JP-TK, SG, US-NY-NYIS, US-MIDA-PJM) × five two-week periods of
2023 × five workload seeds at load 0.5, plus loads 0.3 and 0.7 on both fleets (first
period, first seed). Each scenario is one `greenfed eval --policies fifo-binpack,green
--optimum` (the command is printed per row). The summary gives the median and worst CO2
cut, deadline misses where the baseline has none, SLO violations, the mean wait of
started work and the mean turnaround (submission to finish) as ratios, and the share
of the optimum's saving for training, for inference and in total
(cloud/eval/optimum_share.py); each row also splits its cut
between training and inference (carbon-aware replica placement within each
deployment's SLO) and counts green's jobs held back by temporal shifting and those
that waited for capacity.
`--generator trace` runs the same scenarios on the trace-shaped workload
(cloud/eval/trace_shaped.py: long jobs, many 8-GPU gangs) instead of the default mix.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cloud.eval.bound import share_of_optimum
from cloud.eval.optimum_share import optimum_shares
from cloud.eval.runner import WORKLOAD_GENERATORS, EvalOptions, run_eval

ROOT = Path(__file__).resolve().parent.parent
FLEETS = {"default": None, "other-zones": ROOT / "sim_devices/fleets/other-zones.toml"}
PERIODS = (
    date(2023, 1, 9),
    date(2023, 3, 20),
    date(2023, 6, 1),
    date(2023, 8, 14),
    date(2023, 10, 23),
)
SEEDS = (2023, 1, 2, 3, 4)
EXTRA_LOADS = (0.3, 0.7)
POLICIES = ("fifo-binpack", "green")


@dataclass(frozen=True, slots=True)
class Scenario:
    fleet: str
    start: date
    seed: int
    load: float = 0.5
    days: float = 14.0
    generator: str = "default"  # runner.WORKLOAD_GENERATORS

    @property
    def command(self) -> str:
        path = FLEETS[self.fleet]
        fleet = f" --fleet {path.relative_to(ROOT)}" if path is not None else ""
        generator = f" --generator {self.generator}" if self.generator != "default" else ""
        return (
            f"greenfed eval --start {self.start.isoformat()} --days {self.days:g} "
            f"--seed {self.seed} --load {self.load:g}{fleet}{generator} "
            f"--policies {','.join(POLICIES)} --optimum"
        )


@dataclass(frozen=True, slots=True)
class Row:
    scenario: Scenario
    co2_cut: float  # green against fifo-binpack, all emissions (training and inference)
    training_cut: float  # the same, training only
    inference_cut: float | None  # the same, inference only (None: no inference emissions)
    of_optimum: float | None  # share of the optimum's training saving green achieved
    # The same for all emissions, against both bounds together (cloud/eval/optimum_share.py).
    of_optimum_total: float | None
    # The same for inference, against its bound (cloud/eval/inference_bound.py).
    of_optimum_inference: float | None
    baseline_misses: int
    green_misses: int
    slo_violations: int
    wait_ratio: float | None  # green's mean wait of started work / the baseline's
    unfinished: int
    runtime_s: float
    # Green's jobs held back by temporal shifting / that waited for capacity (metrics.py).
    deferred_temporal: int = 0
    deferred_capacity: int = 0
    reshaped: int = 0  # green's jobs run in an alternative gang shape (flexible shapes)
    # Mean turnaround (submission to finish) of the jobs that finished, per policy: what a
    # lever that delays completion costs, which the wait to first start does not show.
    baseline_turnaround_s: float = 0.0
    green_turnaround_s: float = 0.0


def scenarios(short: bool, generator: str = "default") -> list[Scenario]:
    if short:
        return [
            Scenario(fleet, start, 2023, days=3.0, generator=generator)
            for fleet in FLEETS
            for start in (PERIODS[0], PERIODS[2])
        ]
    grid = [
        Scenario(fleet, start, seed, generator=generator)
        for fleet in FLEETS
        for start in PERIODS
        for seed in SEEDS
    ]
    loads = [
        Scenario(fleet, PERIODS[0], SEEDS[0], load, generator=generator)
        for fleet in FLEETS
        for load in EXTRA_LOADS
    ]
    return grid + loads


def run(scenario: Scenario) -> Row:
    began = time.perf_counter()
    report = run_eval(
        EvalOptions(
            start=scenario.start,
            days=scenario.days,
            seed=scenario.seed,
            target_load=scenario.load,
            generator=scenario.generator,
            fleet=FLEETS[scenario.fleet],
            policies=POLICIES,
            bound=True,
        )
    )
    baseline, green = report.results
    assert report.bound is not None
    assert report.inference_bound is not None
    shares = optimum_shares(report.results, green, report.bound, report.inference_bound)
    return Row(
        scenario=scenario,
        co2_cut=1.0 - green.gco2 / baseline.gco2,
        training_cut=1.0 - green.training_gco2 / baseline.training_gco2,
        inference_cut=(
            1.0 - green.inference_gco2 / baseline.inference_gco2
            if baseline.inference_gco2 > 0
            else None
        ),
        of_optimum=share_of_optimum(baseline.training_gco2, green.training_gco2, report.bound),
        of_optimum_total=shares.total,
        of_optimum_inference=shares.inference,
        baseline_misses=baseline.deadline_misses,
        green_misses=green.deadline_misses,
        slo_violations=green.slo_violations,
        wait_ratio=green.wait_mean_s / baseline.wait_mean_s if baseline.wait_mean_s else None,
        unfinished=green.unfinished_jobs,
        runtime_s=time.perf_counter() - began,
        deferred_temporal=green.deferred_temporal_jobs,
        deferred_capacity=green.deferred_capacity_jobs,
        reshaped=green.reshaped_jobs,
        baseline_turnaround_s=baseline.completion_mean_s,
        green_turnaround_s=green.completion_mean_s,
    )


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def print_rows(rows: Sequence[Row]) -> None:
    print(
        "| fleet | start | seed | load | CO2 cut | training | inference "
        "| of optimum (training) | of optimum (inference) | of optimum (total) "
        "| misses (base/green) | SLO | wait × | unfinished | temporal | capacity | reshaped |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        s = row.scenario
        wait = "-" if row.wait_ratio is None else f"{row.wait_ratio:.2f}"
        print(
            f"| {s.fleet} | {s.start.isoformat()} | {s.seed} | {s.load:g} | {row.co2_cut:.1%} "
            f"| {row.training_cut:.1%} | {_percent(row.inference_cut)} "
            f"| {_percent(row.of_optimum)} | {_percent(row.of_optimum_inference)} "
            f"| {_percent(row.of_optimum_total)} "
            f"| {row.baseline_misses}/{row.green_misses} "
            f"| {row.slo_violations} | {wait} | {row.unfinished} "
            f"| {row.deferred_temporal} | {row.deferred_capacity} | {row.reshaped} |"
        )


def summary(rows: Sequence[Row]) -> dict[str, object]:
    cuts = [row.co2_cut for row in rows]
    shares = [row.of_optimum for row in rows if row.of_optimum is not None]
    totals = [row.of_optimum_total for row in rows if row.of_optimum_total is not None]
    inference_shares = [
        row.of_optimum_inference for row in rows if row.of_optimum_inference is not None
    ]
    waits = [row.wait_ratio for row in rows if row.wait_ratio is not None]
    turnarounds = [
        row.green_turnaround_s / row.baseline_turnaround_s
        for row in rows
        if row.baseline_turnaround_s > 0
    ]
    inference = [row.inference_cut for row in rows if row.inference_cut is not None]
    return {
        "scenarios": len(rows),
        "median_co2_cut": statistics.median(cuts),
        "worst_co2_cut": min(cuts),
        "median_training_cut": statistics.median(row.training_cut for row in rows),
        "median_inference_cut": statistics.median(inference) if inference else None,
        "worst_inference_cut": min(inference) if inference else None,
        "new_deadline_misses": sum(row.green_misses for row in rows if row.baseline_misses == 0),
        "slo_violations": sum(row.slo_violations for row in rows),
        "median_wait_ratio": statistics.median(waits) if waits else None,
        "worst_wait_ratio": max(waits) if waits else None,
        "median_turnaround_ratio": statistics.median(turnarounds) if turnarounds else None,
        "worst_turnaround_ratio": max(turnarounds) if turnarounds else None,
        "median_of_optimum": statistics.median(shares) if shares else None,
        "worst_of_optimum": min(shares) if shares else None,
        "median_of_optimum_inference": (
            statistics.median(inference_shares) if inference_shares else None
        ),
        "worst_of_optimum_inference": min(inference_shares) if inference_shares else None,
        "median_of_optimum_total": statistics.median(totals) if totals else None,
        "worst_of_optimum_total": min(totals) if totals else None,
        "deferred_temporal": sum(row.deferred_temporal for row in rows),
        "deferred_capacity": sum(row.deferred_capacity for row in rows),
        "reshaped": sum(row.reshaped for row in rows),
        "unfinished": sum(row.unfinished for row in rows),
    }


def _unwritable(path: Path) -> str | None:
    """Why a file could not be written at `path` (None: it could, as far as can be told
    without writing it: an existing file is left as it is until the run ends)."""
    if path.is_dir():
        return "is a directory"
    parent = path.parent
    if not parent.is_dir():
        return f"{parent} is not a directory" if parent.exists() else f"{parent} does not exist"
    if path.exists() and not os.access(path, os.W_OK):
        return "is not writable"
    if not path.exists() and not os.access(parent, os.W_OK | os.X_OK):
        return f"{parent} is not writable"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1, help="scenarios run in parallel")
    parser.add_argument("--short", action="store_true", help="4 scenarios of 3 days (CI)")
    parser.add_argument("--json", type=Path, help="write every row and the summary here")
    parser.add_argument(
        "--generator",
        choices=WORKLOAD_GENERATORS,
        default="default",
        help="the generated workload: default, or trace (cloud/eval/trace_shaped.py)",
    )
    args = parser.parse_args(argv)
    if args.json is not None:
        # The document is written when every scenario has run: a path it cannot be
        # written to must stop the run now, not throw away minutes (or hours) of it.
        problem = _unwritable(args.json)
        if problem is not None:
            parser.error(f"--json {args.json}: {problem}")
    todo = scenarios(args.short, args.generator)
    began = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        rows = list(pool.map(run, todo))
    wall_s = time.perf_counter() - began
    for scenario in todo[:1]:
        print(f"each row: {scenario.command} (with that row's values)")
    print_rows(rows)
    result = summary(rows)
    print()
    for key, value in result.items():
        shown = (
            _percent(value)
            if isinstance(value, float) and ("cut" in key or "optimum" in key)
            else value
        )
        print(f"{key}: {shown}")
    print(f"wall time: {wall_s / 60:.1f} min with {args.jobs} job(s)")
    if args.json is not None:
        document = {
            "rows": [
                {**asdict(row), "scenario": {**asdict(row.scenario), "start": str(s.start)}}
                for row in rows
                for s in (row.scenario,)
            ],
            "summary": result,
            "wall_s": wall_s,
        }
        args.json.write_text(json.dumps(document, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
