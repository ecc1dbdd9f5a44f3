"""Where each policy ran its training: GPU-hours by zone × gang shape, beside the offline
optimum's GPU-hours by zone, and the training CO2 of each (issue 30).

    python benchmarks/gpu_hours_by_shape.py --workload trace.json --start 2023-06-01
    python benchmarks/gpu_hours_by_shape.py --workload trace.json \
        --fleet sim_devices/fleets/other-zones.toml

The workload is a file (`greenfed eval --generator trace --dump-workload trace.json`),
so the same jobs can be replayed by an older tree: run this script with that tree first
on PYTHONPATH (`git archive REV | tar -x -C /tmp/old_REV`, then
`PYTHONPATH=/tmp/old_REV python benchmarks/gpu_hours_by_shape.py ...` from /tmp/old_REV
with this file copied there). It reads only `cloud.eval.runner`, the simulation's
usages and the bound's totals, which older trees have too. A change that moves a share
of the optimum shows here as hours that moved between zones or shapes, or as a policy
whose emissions moved while the others' did not.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Sequence
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cloud.eval.runner import EvalOptions, run_eval
from cloud.eval.simulation import SimOutcome

HOUR_S = 3600.0


def gpu_hours_by_zone_and_shape(outcome: SimOutcome) -> dict[str, dict[str, float]]:
    """{zone: {"2x8": GPU-hours, ...}} of the training jobs' GPU usage."""
    zone_of = {node.node_id: node.zone for node in outcome.nodes}
    hours: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for usage in outcome.usages:
        job = outcome.jobs.get(usage.work_id)
        if job is None or usage.accelerator_kind != "gpu":
            continue
        shape = f"{job.spec.workers}x{job.spec.gpus_per_worker}"
        hours[zone_of[usage.node_id]][shape] += (
            usage.accelerators * (usage.end_s - usage.start_s) / HOUR_S
        )
    return {zone: dict(sorted(shapes.items())) for zone, shapes in sorted(hours.items())}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", type=Path, required=True, help="workload file (JSON)")
    parser.add_argument("--start", type=date.fromisoformat, default=date(2023, 6, 1))
    parser.add_argument("--days", type=float, default=14.0)
    parser.add_argument("--fleet", type=Path, help="fleet file (default: the built-in fleet)")
    parser.add_argument("--policies", default="fifo-binpack,green")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of text")
    args = parser.parse_args(argv)
    report = run_eval(
        EvalOptions(
            start=args.start,
            days=args.days,
            policies=tuple(args.policies.split(",")),
            fleet=args.fleet,
            workload=args.workload,
            bound=True,
        )
    )
    bound = report.bound
    assert bound is not None
    document: dict[str, object] = {
        "optimum": {
            "training_tco2": bound.gco2 / 1e6,
            "gpu_hours_by_zone": getattr(bound, "gpu_hours_by_zone", {}),
        }
    }
    for result, outcome in zip(report.results, report.outcomes, strict=True):
        document[result.policy] = {
            "training_tco2": result.training_gco2 / 1e6,
            "gpu_hours": gpu_hours_by_zone_and_shape(outcome),
        }
    if args.json:
        print(json.dumps(document, indent=2))
        return 0
    optimum_hours = ", ".join(
        f"{zone} {hours:,.0f}" for zone, hours in sorted(bound.gpu_hours_by_zone.items())
    )
    print(f"optimum: training {bound.gco2 / 1e6:.3f} tCO2eq; GPU-hours {optimum_hours}")
    for result, outcome in zip(report.results, report.outcomes, strict=True):
        print(f"{result.policy}: training {result.training_gco2 / 1e6:.3f} tCO2eq")
        for zone, shapes in gpu_hours_by_zone_and_shape(outcome).items():
            cells = ", ".join(f"{shape} {hours:,.0f}" for shape, hours in shapes.items())
            print(f"  {zone}: {cells} (total {sum(shapes.values()):,.0f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
