"""Work on MIG slices is accounted, and progresses, as the slices it ran on: the
simulation charges each usage at the power of the pool it held (the energy model's, as
the optimum in cloud/eval/bound.py has it) and runs it at that pool's pace, never at
its node's first pool's (the whole GPU beside the slices)."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import numpy as np
import pytest

from cloud.eval.fleet import node_from_spec
from cloud.eval.runner import (
    EvalOptions,
    EvalReport,
    build_scenario,
    run_eval,
    serving_latency,
    sim_config,
)
from cloud.eval.simulation import HOUR_S, Simulation
from cloud.green.accounting import Usage, modelled_kwh
from cloud.green.energy import EnergyModel
from cloud.scheduler import Allocation, Snapshot
from cloud.scheduler.model import KIND_INDEX
from sim_devices.fleet import SimNodeSpec
from sim_devices.profiles import get_profile

SLICE = "NVIDIA A100-SXM4-80GB MIG 1g.10gb"
WHOLE = "NVIDIA A100-SXM4-80GB"
SLICE_SPEED = 1 / 7

# One A100 server in Ontario: one whole A100 beside one cut into 7 × 1g.10gb.
MIG_SERVER = """
[[group]]
name = "mig"
profile = "a100-mig"
count = 1
site = "cloud"
zone = "CA-ON"
region = "northamerica-northeast2"
"""

# Two GPUs per worker: more than the one whole GPU, so two slices.
ON_TWO_SLICES = """
seed = 1

[[training]]
id = "sliced"
tenant = "vision"
submit_offset_s = 0
duration_s = 3600
gpus_per_worker = 2
"""

# The sliced job saves a checkpoint every 30 minutes of its run; 3.25 h in (six
# checkpoints), a p0 job that needs all seven slices preempts it.
PREEMPTED_ON_SLICES = """
seed = 1

[[training]]
id = "sliced"
tenant = "vision"
submit_offset_s = 0
duration_s = 3600
gpus_per_worker = 2
checkpoint_interval_s = 1800

[[training]]
id = "urgent"
tenant = "speech"
submit_offset_s = 11700
duration_s = 600
gpus_per_worker = 7
priority = "p0"
preemptible = false
"""


def _evaluate(directory: Path, workload: str, policy: str = "fifo-binpack") -> EvalReport:
    fleet_path, workload_path = directory / "fleet.toml", directory / "workload.toml"
    fleet_path.write_text(MIG_SERVER, encoding="utf-8")
    workload_path.write_text(workload, encoding="utf-8")
    return run_eval(
        EvalOptions(
            start=date(2023, 6, 1),
            days=1,
            fleet=fleet_path,
            workload=workload_path,
            policies=(policy,),
        )
    )


def _mig_snapshot() -> Snapshot:
    spec = SimNodeSpec(
        node_id="mig-0",
        profile=get_profile("a100-mig"),
        site="cloud",
        zone="CA-ON",
        region="northamerica-northeast2",
        labels={},
    )
    return Snapshot.build(now=0.0, nodes=[node_from_spec(spec)])


def _hour_on(model: str, accelerators: int = 1) -> Usage:
    return Usage(
        allocation_id=f"one-hour-{model}",
        work_id="w",
        tenant="t",
        node_id="mig-0",
        accelerator_kind="gpu",
        accelerators=accelerators,
        start_s=0.0,
        end_s=HOUR_S,
        utilisation=EnergyModel().training_utilisation,
        accelerator_model=model,
    )


def test_a_slice_hour_is_charged_the_slices_power_not_the_whole_gpus() -> None:
    """A 1g.10gb slice draws a seventh of its A100 (47 W at 80 %) plus an eighth of the
    host (242 W at 80 %, shared by the node's eight GPU devices): 0.077 kWh an hour,
    against the whole A100's 0.360."""
    fleet = _mig_snapshot()
    slice_kwh, whole_kwh = modelled_kwh([_hour_on(SLICE), _hour_on(WHOLE)], fleet, EnergyModel())
    host_w = (90.0 + 190.0 * 0.8) / 8
    assert slice_kwh == pytest.approx((50.0 / 7 + 50.0 * 0.8 + host_w) / 1000)
    assert slice_kwh == pytest.approx(0.077, abs=0.0005)
    assert whole_kwh == pytest.approx((50.0 + 350.0 * 0.8 + host_w) / 1000)
    assert whole_kwh == pytest.approx(0.360, abs=0.0005)


def test_a_job_on_slices_is_charged_the_slices_energy_in_the_simulation(
    tmp_path: Path,
) -> None:
    report = _evaluate(tmp_path, ON_TWO_SLICES)
    [outcome], [result] = report.outcomes, report.results
    # Two slices at a seventh of an A100's pace: seven hours for an A100-hour of work,
    # each slice at a seventh of the A100's power, with its share of the host.
    record = outcome.jobs["sliced"]
    assert record.first_start_s is not None
    assert record.finish_s is not None
    assert record.finish_s - record.first_start_s == pytest.approx(7 * HOUR_S)
    member_w = 2 * (50.0 / 7 + 50.0 * 0.8) + 2 * (90.0 + 190.0 * 0.8) / 8
    assert result.training_kwh == pytest.approx(member_w * 7 / 1000)  # 1.08, not 5.04
    usages = [u for u in outcome.usages if u.work_id == "sliced"]
    assert [(u.accelerator_model, u.accelerators) for u in usages] == [(SLICE, 2)]
    fleet = Snapshot.build(now=report.options.start_s, nodes=outcome.nodes)
    assert result.training_kwh == pytest.approx(
        float(np.sum(modelled_kwh(usages, fleet, report.options.energy)))
    )


def test_a_job_preempted_on_slices_keeps_the_work_it_did_at_the_slices_pace(
    tmp_path: Path,
) -> None:
    """Six checkpoints of 30 min on slices are 6 × 1800 s × 1/7 of an A100's work; at the
    whole GPU's pace the job would keep its whole run's work and finish hours early."""
    report = _evaluate(tmp_path, PREEMPTED_ON_SLICES)
    [outcome] = report.outcomes
    start = report.options.start_s
    sliced, urgent = outcome.jobs["sliced"], outcome.jobs["urgent"]
    assert sliced.preemptions
    assert urgent.finish_s is not None
    assert urgent.first_start_s == pytest.approx(start + 11700)
    assert urgent.finish_s == pytest.approx(start + 11700 + 600 / SLICE_SPEED)
    saved_s = 6 * 1800 * SLICE_SPEED
    resumed_run_s = (3600 - saved_s + outcome.config.restart_s) / SLICE_SPEED
    assert sliced.finish_s == pytest.approx(urgent.finish_s + resumed_run_s)
    runs = sorted((u.start_s, u.end_s) for u in outcome.usages if u.work_id == "sliced")
    assert runs == [
        pytest.approx((start, start + 11700)),
        pytest.approx((urgent.finish_s, sliced.finish_s)),
    ]


def test_the_policy_sees_slices_in_use_as_load_on_the_slices_not_on_the_whole_gpu(
    tmp_path: Path,
) -> None:
    """Simulated telemetry: two busy slices are 2/7 of the slice pool at the training
    utilisation, and the whole A100 beside them idles."""
    fleet_path, workload_path = tmp_path / "fleet.toml", tmp_path / "workload.toml"
    fleet_path.write_text(MIG_SERVER, encoding="utf-8")
    workload_path.write_text(ON_TWO_SLICES, encoding="utf-8")
    options = EvalOptions(start=date(2023, 6, 1), days=1, fleet=fleet_path, workload=workload_path)
    scenario = build_scenario(options)
    simulation = Simulation(
        sim_config(options, "green"),
        scenario.nodes,
        scenario.workload,
        scenario.provider,
        serving_latency(scenario, options.start_s),
    )
    [node] = scenario.nodes
    simulation._hold(
        Allocation(
            allocation_id="sliced/0",
            work_id="sliced",
            work_kind="training",
            tenant="vision",
            priority="p1",
            preemptible=True,
            node_id=node.node_id,
            accelerator_kind="gpu",
            accelerators=2,
            accelerator_model=SLICE,
        )
    )
    table = simulation._snapshot([]).nodes
    utilisation = {
        table.model_at(column, 0): table.kinds[column].utilisation.item(0)
        for column in table.kind_columns[KIND_INDEX["gpu"]]
    }
    drive = options.energy.training_utilisation
    assert utilisation == pytest.approx({SLICE: 2 / 7 * drive, WHOLE: 0.0})
