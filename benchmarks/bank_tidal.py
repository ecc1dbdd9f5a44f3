"""The design article's bank, in `greenfed eval`'s simulation: static node groups against
tidal sharing with autoscaling.

    python benchmarks/bank_tidal.py --days 7

The fleet (`benchmarks/bank_fleet.toml`), one-GPU servers as the article counts them:
8 H100 for inference (tainted `dedicated=inference`), 12 V100 for training
(`dedicated=training`) and 2 hybrid H100, in one grid zone (DE, its recorded 2023
signals).

The work, the same in both cases:
- risk-control inference: 500 requests/s at night rising to 2,000 by day (peak at
  16:00 local), a 20 ms latency SLO, 250 requests/s per replica (2 to 8 replicas);
- customer-profile training every night at 20:00 local: three tenants' gangs of 8,
  12 and 8 GPUs (4 h each on an A100, longer on a V100), p2, preemptible,
  checkpointing every 30 min.

*Static* (the article's "before"): inference provisioned for its peak (8 replicas all
day) on the inference group and the hybrid servers, training on the training group
and the hybrid servers only. *Tidal* (greenfed): inference autoscaled (2..8 replicas,
the live autoscaler's rule) on any GPU that meets its SLO, training on any GPU,
preempted when inference needs the capacity back and resumed from its checkpoint.

The three teams' GPU quotas, the same in both cases: risk 8, retail 6, marketing 4,
in one cohort that lends idle quota (borrowing unlimited). The four GPUs their quotas
leave over are the cohort's shared pool, a lend-only tenant with no work of its own
(Kueue's pattern), so the cohort's nominal total is the fleet's 22 GPUs. The risk team
owns the inference: its peak of 8 replicas is exactly its quota, so growing back to it
in the morning reclaims what the others borrowed.

Reported per case: GPU utilisation (allocated, and busy: weighted by how hard the work
drives each allocation), SLO violations (deployment-hours), the nightly gangs' completion
time (submission to finish, mean), experiments finished within the period, training
preemptions by reason, migrations, kWh and CO2.

`--backlog N` adds N best-effort 1-GPU experiments (2 h on an A100, p2, checkpointing)
per team per hour, more than the fleet can absorb: the training that fills the valleys.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cloud.eval.fleet import load_fleet_nodes
from cloud.eval.metrics import PolicyResult, recorded_signals
from cloud.eval.runner import EvalOptions, Scenario, run_eval
from cloud.eval.simulation import SimOutcome
from cloud.eval.workload import (
    InferenceSpec,
    TenantSpec,
    TrafficSource,
    TrainingSpec,
    Workload,
)
from cloud.signals.trace import TraceProvider
from cloud.work.specs import AutoscaleSpec

FLEET = Path(__file__).resolve().parent / "bank_fleet.toml"
DAY_S = 86_400.0
PEAK_RPS = 2000.0
PER_REPLICA_RPS = 250.0
PEAK_REPLICAS = 8  # ceil(2000 / 250): the article's max
NIGHT_REPLICAS = 2  # ceil(500 / 250): its min
NIGHTLY = (("retail", 8), ("risk", 12), ("marketing", 8))  # tenant, GPUs
QUOTAS = (("risk", 8), ("retail", 6), ("marketing", 4), ("shared-pool", 4))  # GPUs


def workload(days: int, *, tidal: bool, backlog_per_hour: int = 0) -> Workload:
    both = ("dedicated",)  # dedicated=inference and dedicated=training alike
    inference = InferenceSpec(
        id="risk-control",
        tenant="risk",
        reference_ms_per_request=5.0,
        peak_requests_per_s=PEAK_RPS,
        replicas=NIGHT_REPLICAS if tidal else PEAK_REPLICAS,
        accepted_kinds=("gpu",),
        latency_slo_ms=20.0,
        traffic=(TrafficSource(region="europe-west3", share=1.0, utc_offset_hours=1.0),),
        sites=("cloud",),
        tolerations=both if tidal else ("dedicated=inference",),
        autoscale=AutoscaleSpec(
            min_replicas=NIGHT_REPLICAS,
            max_replicas=PEAK_REPLICAS,
            target_requests_per_s=PER_REPLICA_RPS,
            max_step=PEAK_REPLICAS,
        )
        if tidal
        else None,
    )
    training = [
        TrainingSpec(
            id=f"night{day}-{number}-{tenant}",
            tenant=tenant,
            submit_offset_s=day * DAY_S + 19 * 3600.0,  # 20:00 local
            duration_s=4 * 3600.0,
            workers=gpus,
            gpus_per_worker=1,
            priority="p2",
            preemptible=True,
            checkpoint_interval_s=1800.0,
            tolerations=both if tidal else ("dedicated=training",),
        )
        for day in range(days)
        for number, (tenant, gpus) in enumerate(NIGHTLY)
    ]
    # Best-effort experiments around the clock, more than the fleet can absorb: what
    # fills the valleys once the nightly gangs and the inference have what they need.
    training += [
        TrainingSpec(
            id=f"experiment{hour}-{number}-{tenant}",
            tenant=tenant,
            submit_offset_s=hour * 3600.0 + number * 60.0,
            duration_s=2 * 3600.0,
            priority="p2",
            preemptible=True,
            checkpoint_interval_s=1800.0,
            tolerations=both if tidal else ("dedicated=training",),
        )
        for hour in range(days * 24)
        for tenant, _ in NIGHTLY
        for number in range(backlog_per_hour)
    ]
    tenants = tuple(
        TenantSpec(name=name, quotas={"gpu": gpus}, cohort="bank") for name, gpus in QUOTAS
    )
    return Workload(training=tuple(training), inference=(inference,), tenants=tenants)


def case(
    days: int, tidal: bool, start: date, backlog_per_hour: int
) -> tuple[PolicyResult, SimOutcome]:
    options = EvalOptions(start=start, days=float(days), policies=("green",), fleet=FLEET)
    nodes = tuple(load_fleet_nodes(FLEET))
    provider = TraceProvider(None)
    scenario = Scenario(
        nodes,
        workload(days, tidal=tidal, backlog_per_hour=backlog_per_hour),
        provider,
        recorded_signals(provider, ("DE",)),
    )
    report = run_eval(options, scenario=scenario)
    return report.results[0], report.outcomes[0]


def nightly_completion_mean_s(outcome: SimOutcome) -> float:
    """Submission to finish of the nightly gangs (the experiments left out)."""
    spans = [
        record.finish_s - record.submitted_s
        for work_id, record in outcome.jobs.items()
        if work_id.startswith("night") and record.finish_s is not None
    ]
    return sum(spans) / len(spans) if spans else 0.0


def experiments_done(outcome: SimOutcome) -> int:
    """Experiments that finished within the period."""
    stop_s = outcome.config.end_s
    return sum(
        work_id.startswith("experiment")
        and record.finish_s is not None
        and record.finish_s <= stop_s
        for work_id, record in outcome.jobs.items()
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--start", type=date.fromisoformat, default=date(2023, 6, 5))
    parser.add_argument(
        "--backlog",
        type=int,
        default=0,
        metavar="N",
        help="also N best-effort 1-GPU experiments (2 h on an A100) per team per hour",
    )
    args = parser.parse_args()
    rows: dict[str, object] = {}
    completion: dict[str, float] = {}
    for name, tidal in (("static", False), ("tidal", True)):
        result, outcome = case(args.days, tidal, args.start, args.backlog)
        completion[name] = nightly_completion_mean_s(outcome)
        rows[name] = {
            "gpu_utilisation": round(result.utilisation, 3),
            "gpu_busy": round(result.busy_utilisation, 3),
            "slo_violations": result.slo_violations,
            "slo_hours": result.slo_hours,
            "nightly_completion_mean_h": round(completion[name] / 3600.0, 2),
            "unfinished_jobs": result.unfinished_jobs,
            "experiments_done_in_period": experiments_done(outcome),
            "training_preemptions": result.preemptions,
            "migrations": result.migrations,
            "training_kwh": round(result.training_kwh, 1),
            "inference_kwh": round(result.inference_kwh, 1),
            "gco2_kg": round(result.gco2 / 1000.0, 1),
        }
    if completion["static"]:
        rows["completion_ratio_tidal_over_static"] = round(
            completion["tidal"] / completion["static"], 3
        )
    json.dump(rows, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
