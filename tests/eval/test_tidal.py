"""Autoscaled deployments and node groups in the simulation: replicas follow the
diurnal load within their bounds, and training fills the capacity inference leaves."""

from __future__ import annotations

from datetime import date
from functools import partial
from pathlib import Path

from cloud.eval.fleet import load_fleet_nodes
from cloud.eval.metrics import recorded_signals
from cloud.eval.runner import EvalOptions, Scenario, run_eval
from cloud.eval.workload import (
    InferenceSpec,
    TenantSpec,
    TrafficSource,
    TrainingSpec,
    Workload,
)
from cloud.signals.trace import TraceProvider
from cloud.work.specs import AutoscaleSpec

FLEET = """
seed = 1
[[group]]
name = "h100"
profile = "h100-1x"
count = 6
site = "cloud"
zone = "DE"
region = "europe-west3"
taints = ["dedicated=inference:NoSchedule"]
"""


def run(
    tmp_path: Path,
    *,
    autoscale: bool,
    tenants: tuple[TenantSpec, ...] = (),
    team: str = "bank",
    days: float = 1.0,
    duration_s: float = 3600.0,
) -> tuple[object, object]:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(FLEET)
    inference = InferenceSpec(
        id="risk",
        tenant="bank",
        reference_ms_per_request=5.0,
        peak_requests_per_s=1000.0,
        replicas=1 if autoscale else 4,
        accepted_kinds=("gpu",),
        latency_slo_ms=20.0,
        traffic=(TrafficSource(region="europe-west3", share=1.0, utc_offset_hours=1.0),),
        sites=("cloud",),
        tolerations=("dedicated=inference",),
        autoscale=AutoscaleSpec(min_replicas=1, max_replicas=4, target_requests_per_s=250.0)
        if autoscale
        else None,
    )
    nightly = TrainingSpec(
        id="nightly", tenant=team, submit_offset_s=19 * 3600.0, duration_s=duration_s,
        workers=4, gpus_per_worker=1, priority="p2", checkpoint_interval_s=600.0,
        tolerations=("dedicated",),
    )  # fmt: skip
    options = EvalOptions(start=date(2023, 6, 5), days=days, policies=("green",), fleet=fleet)
    provider = TraceProvider(None)
    scenario = Scenario(
        tuple(load_fleet_nodes(fleet)),
        Workload(training=(nightly,), inference=(inference,), tenants=tenants),
        provider,
        recorded_signals(provider, ("DE",)),
    )
    report = run_eval(options, scenario=scenario)
    return report.results[0], report.outcomes[0]


def test_replicas_follow_the_load_and_training_runs_at_night_beside_them(tmp_path: Path) -> None:
    result, outcome = run(tmp_path, autoscale=True)
    assert result.slo_violations == 0  # type: ignore[attr-defined]
    replicas = outcome.replicas  # type: ignore[attr-defined]
    start = outcome.config.start_s  # type: ignore[attr-defined]

    def serving_at(hour: int) -> int:
        at = start + hour * 3600.0 + 1800.0
        return sum(1 for r in replicas if r.start_s <= at and (r.end_s is None or r.end_s > at))

    counts = [serving_at(hour) for hour in range(24)]
    # 250 requests/s at night, 1,000 by day (local 16:00): from 1 replica up to 4 and back.
    assert min(counts) == 1
    assert max(counts) == 4
    assert counts[15] == 4
    assert counts[3] <= 2  # sized for the coming hour: a little above 250 rounds up
    job = outcome.jobs["nightly"]  # type: ignore[attr-defined]
    assert job.finish_s is not None  # 4 GPUs at night, beside the night's one replica


def test_peak_provisioning_leaves_no_room_for_the_nightly_job(tmp_path: Path) -> None:
    static, outcome = run(tmp_path, autoscale=False)
    tidal, _ = run(tmp_path, autoscale=True)
    # Four replicas all day hold 4 of the 6 GPUs: a 4-GPU gang cannot start.
    assert outcome.jobs["nightly"].first_start_s is None  # type: ignore[attr-defined]
    assert static.unfinished_jobs == 1  # type: ignore[attr-defined]
    assert tidal.unfinished_jobs == 0  # type: ignore[attr-defined]


def test_quotas_apply_and_the_owner_reclaims_what_was_borrowed(tmp_path: Path) -> None:
    # The inference's tenant owns the whole pool; the training team owns none of it and
    # borrows it at night. 12 h on an H100 from 20:00 local meets the morning growth.
    owner = TenantSpec(name="bank", quotas={"gpu": 6}, cohort="c")
    cohort = (owner, TenantSpec(name="research", quotas={"gpu": 0}, cohort="c"))
    long = partial(run, tmp_path, autoscale=True, team="research", days=2.0, duration_s=30 * 3600.0)
    result, outcome = long(tenants=cohort)
    assert result.slo_violations == 0  # type: ignore[attr-defined]
    job = outcome.jobs["nightly"]  # type: ignore[attr-defined]
    assert job.finish_s is not None
    assert result.preemptions.get("reclaim", 0) >= 1  # type: ignore[attr-defined]
    # Unmanaged, the same growth preempts it for priority instead.
    result, _ = long()
    assert "reclaim" not in result.preemptions  # type: ignore[attr-defined]
    assert result.preemptions.get("priority", 0) >= 1  # type: ignore[attr-defined]
    # Alone, with no cohort to borrow from, a tenant without quota never starts.
    alone = (owner, TenantSpec(name="research", quotas={"gpu": 0}))
    result, outcome = run(tmp_path, autoscale=True, tenants=alone, team="research")
    assert outcome.jobs["nightly"].first_start_s is None  # type: ignore[attr-defined]
    assert result.unfinished_jobs == 1  # type: ignore[attr-defined]
