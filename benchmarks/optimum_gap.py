"""Where the offline optimum's saving comes from: is it waiting, or packing?

    python benchmarks/optimum_gap.py --jobs 2                       # June 2023, both fleets
    python benchmarks/optimum_gap.py --start 2023-01-09 --seed 2 --jobs 2

For each fleet (the default one and `sim_devices/fleets/other-zones.toml`), one
`greenfed eval --policies fifo-binpack,green` scenario, then the training CO2 of the
optimum (`cloud/eval/bound.py`) three ways:

* **free**: the bound `greenfed eval --optimum` reports (each job may run any time
  until its own slack, or until the latest any evaluated policy finished it);
* **baseline starts for work that cannot wait**: every job without a deadline or a
  maximum delay runs no later than from when `fifo-binpack` started it, at the pace
  of where it runs (`optimum(start_by=baseline_start_by(...))`);
* **no waits at all**: every job runs from its submission at that pace.

The last two are references, not bounds: a policy that holds work longer than the
baseline may emit less. If the optimum saves nearly as much without waiting, the
gap between green and the optimum is not waiting but what the optimum relaxes:
divisible gangs on aggregated pools (an 8-GPU worker on two half-free nodes) and
free reshuffling of running work.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cloud.eval.bound import baseline_start_by, optimum
from cloud.eval.inference_bound import inference_optimum
from cloud.eval.optimum_share import optimum_shares
from cloud.eval.runner import EvalOptions, run_eval, serving_latency

ROOT = Path(__file__).resolve().parent.parent
FLEETS = {"default": None, "other-zones": ROOT / "sim_devices/fleets/other-zones.toml"}


def decompose(fleet: str, start: date, seed: int) -> str:
    report = run_eval(
        EvalOptions(
            start=start,
            days=14.0,
            seed=seed,
            fleet=FLEETS[fleet],
            policies=("fifo-binpack", "green"),
        )
    )
    scenario, energy = report.scenario, report.options.energy
    baseline, green = report.results
    submitted = {job_id: record.submitted_s for job_id, record in report.outcomes[0].jobs.items()}
    inference = inference_optimum(
        scenario.workload,
        scenario.nodes,
        report.outcomes,
        scenario.recorded,
        energy,
        serving_latency(scenario, report.options.start_s),
    )
    bounds = {
        "free": optimum(
            scenario.workload, scenario.nodes, report.outcomes, scenario.recorded, energy
        ),
        "baseline starts for work that cannot wait": optimum(
            scenario.workload,
            scenario.nodes,
            report.outcomes,
            scenario.recorded,
            energy,
            start_by=baseline_start_by(report.outcomes[0]),
        ),
        "no waits at all": optimum(
            scenario.workload,
            scenario.nodes,
            report.outcomes,
            scenario.recorded,
            energy,
            start_by=submitted,
        ),
    }
    lines = [
        f"{fleet}, {start.isoformat()}, seed {seed}: green cuts training CO2 "
        f"{1 - green.training_gco2 / baseline.training_gco2:.1%} "
        f"(GPU-hours by zone: {_hours(green.gpu_hours_by_zone)})"
    ]
    for name, bound in bounds.items():
        shares = optimum_shares(report.results, green, bound, inference)
        lines.append(
            f"  optimum, {name}: cuts training {1 - bound.gco2 / baseline.training_gco2:.1%}; "
            f"green has {_percent(shares.training)} of its training saving "
            f"({_percent(shares.total)} of the total) "
            f"(GPU-hours by zone: {_hours(bound.gpu_hours_by_zone)})"
        )
    return "\n".join(lines)


def _percent(share: float | None) -> str:
    return "-" if share is None else f"{share:.1%}"


def _hours(by_zone: Mapping[str, float]) -> str:
    return ", ".join(f"{zone} {hours:,.0f}" for zone, hours in sorted(by_zone.items()))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--start", type=date.fromisoformat, default=date(2023, 6, 1))
    parser.add_argument("--seed", type=int, default=2023)
    parser.add_argument("--jobs", type=int, default=1, help="fleets run in parallel")
    args = parser.parse_args(argv)
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [pool.submit(decompose, fleet, args.start, args.seed) for fleet in FLEETS]
        for future in futures:
            print(future.result())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
