"""The live counterfactual of work placed on MIG slices (cloud/usage/counterfactual.py):
the work's own energy is the slices', not its node's whole GPU's, so the baseline's
energy per kWh of the work is counted against what the slices drew."""

from __future__ import annotations

import dataclasses

import pytest

from cloud.green.energy import EnergyModel
from cloud.green.latency import ServingLatency
from cloud.green.policies import GreenInputs, build_policy
from cloud.scheduler import AcceleratorPool, Node, TrainingJob, schedule
from cloud.usage.counterfactual import BASELINE, live_counterfactuals
from tests.green.builders import HOUR, T0, flat, gpu_server, grid, snapshot

RECORDED = grid(flat("CLEAN", 100.0), flat("DIRTY", 500.0))
INPUTS = GreenInputs(signals=RECORDED, latency=ServingLatency(rtt_ms={}))
SLICE = "A100 MIG 1g.10gb"
# Two GPUs: more than the MIG server's one whole A100, so two of its slices there.
JOB = TrainingJob(
    work_id="j", tenant="t", submitted_at=T0, duration_s=2 * HOUR, accelerators_per_worker=2
)


def mig_server(node_id: str, zone: str) -> Node:
    """One whole A100 (50-400 W) beside one cut into seven 1g.10gb slices, each a
    seventh of its speed and power; a 100-500 W host CPU."""
    return Node(
        node_id=node_id,
        site="cloud",
        zone=zone,
        region="r",
        pools=(
            AcceleratorPool(
                kind="gpu", count=1, model="A100", idle_power_w=50.0, max_power_w=400.0
            ),
            AcceleratorPool(
                kind="gpu",
                count=7,
                model=SLICE,
                relative_speed=1 / 7,
                idle_power_w=50.0 / 7,
                max_power_w=400.0 / 7,
            ),
            AcceleratorPool(kind="cpu", count=1, idle_power_w=100.0, max_power_w=500.0),
        ),
    )


def test_work_on_slices_is_counted_at_the_slices_energy() -> None:
    on_slices = mig_server("b", "CLEAN")
    plan = schedule(
        dataclasses.replace(snapshot([on_slices]), queue=(JOB,)), build_policy("green", INPUTS)
    )
    (placement,) = plan.placements_for("j")
    assert placement.accelerator_model == SLICE
    # The baseline would have run it on the dirty 4 × A100 server, the first node.
    fleet = dataclasses.replace(snapshot([gpu_server("a", "DIRTY"), on_slices]), queue=(JOB,))
    (record,) = live_counterfactuals(
        fleet, [(JOB, "tenant-1")], plan, build_policy(BASELINE, INPUTS), EnergyModel()
    )
    host_w = 100.0 + 400.0 * 0.8
    whole_w = 2 * (50.0 + 350.0 * 0.8) + host_w * 2 / 4  # two of its four GPUs, 2 h
    slices_w = 2 * (50.0 + 350.0 * 0.8) / 7 + host_w * 2 / 8  # two of eight devices, 14 h
    assert record.zone_factors == pytest.approx({"DIRTY": whole_w * 2 / (slices_w * 14)})
