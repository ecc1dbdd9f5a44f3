"""Accounting: kWh, gCO2eq and cost per allocation, job and tenant; measured energy;
the fifo-binpack counterfactual."""

from __future__ import annotations

import math

import pytest

from cloud.green.accounting import (
    Totals,
    Usage,
    account,
    by_tenant,
    by_work,
    counterfactual,
    counterfactual_usages,
    total,
)
from cloud.green.energy import EnergyModel
from cloud.green.latency import ServingLatency
from cloud.green.policies import GreenInputs, build_policy
from cloud.scheduler import Allocation, Snapshot, TrainingJob

from .builders import HOUR, T0, flat, gpu_server, grid, series, snapshot

NODES = [gpu_server("a", "DIRTY"), gpu_server("b", "CLEAN")]
RECORDED = grid(
    series("CLEAN", [100.0, 300.0] * 36, price=[20.0, 60.0] * 36), flat("DIRTY", 500.0, price=10.0)
)
FLEET = snapshot(NODES)


def usage(
    work_id: str = "j",
    node_id: str = "b",
    *,
    start_h: float = 0.0,
    end_h: float = 2.0,
    accelerators: int = 1,
    tenant: str = "t",
    measured_j: float | None = None,
) -> Usage:
    return Usage(
        allocation_id=f"{work_id}/{node_id}/{start_h}",
        work_id=work_id,
        tenant=tenant,
        node_id=node_id,
        accelerator_kind="gpu",
        accelerators=accelerators,
        start_s=T0 + start_h * HOUR,
        end_s=T0 + end_h * HOUR,
        utilisation=0.8,
        measured_energy_j=measured_j,
    )


def test_one_allocation_by_hand() -> None:
    [record] = account([usage()], FLEET, RECORDED, EnergyModel())
    power_w = 330.0 + 420.0 / 4  # one A100 at 80 % and a quarter of the host CPU
    kwh = power_w * 2 / 1000
    assert record.totals.kwh == pytest.approx(kwh)
    assert record.totals.gco2 == pytest.approx(kwh * 200.0)  # mean of 100 and 300
    assert record.totals.cost == pytest.approx(kwh * 40.0 / 1000)
    assert record.zone == "CLEAN"
    assert not record.measured
    assert not record.fallback


def test_measured_energy_replaces_the_model() -> None:
    [record] = account([usage(measured_j=3.6e6)], FLEET, RECORDED, EnergyModel())
    assert record.totals.kwh == pytest.approx(1.0)
    assert record.totals.gco2 == pytest.approx(200.0)
    assert record.measured


def test_totals_per_job_and_tenant() -> None:
    records = account(
        [
            usage("j1", "a", tenant="vision"),
            usage("j1", "b", tenant="vision"),
            usage("j2", "b", tenant="speech", accelerators=2),
        ],
        FLEET,
        RECORDED,
        EnergyModel(),
    )
    jobs = by_work(records)
    tenants = by_tenant(records)
    assert set(jobs) == {"j1", "j2"}
    assert jobs["j1"].gco2 == pytest.approx(records[0].totals.gco2 + records[1].totals.gco2)
    assert tenants["vision"] == jobs["j1"]
    assert total(records).kwh == pytest.approx(sum(r.totals.kwh for r in records))
    assert (Totals(1, 2, 3) - Totals(1, 1, 1)) == Totals(0, 1, 2)


def test_an_unrecorded_zone_is_flagged_and_not_cheap() -> None:
    fleet = snapshot([*NODES, gpu_server("c", "NOWHERE")])
    [record] = account([usage(node_id="c")], fleet, RECORDED, EnergyModel())
    assert record.fallback
    assert record.totals.gco2 >= record.totals.kwh * 500.0


def test_a_cost_without_any_price_is_unknown_and_flagged() -> None:
    unpriced = grid(series("NOWHERE", [100.0] * 72, price=[math.nan] * 72))
    fleet = snapshot([gpu_server("c", "NOWHERE")])
    [record] = account([usage(node_id="c")], fleet, unpriced, EnergyModel())
    assert record.totals.gco2 == pytest.approx(record.totals.kwh * 100.0)
    assert math.isnan(record.totals.cost)  # not 0: no hour is free for want of a price
    assert record.fallback


def test_usage_on_an_unknown_node_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown node 'zz'"):
        account([usage(node_id="zz")], FLEET, RECORDED, EnergyModel())


def test_the_counterfactual_is_what_fifo_binpack_chooses_at_submission() -> None:
    inputs = GreenInputs(signals=grid(), latency=ServingLatency(rtt_ms={}))
    baseline = build_policy("fifo-binpack", inputs)
    job = TrainingJob(work_id="j", tenant="t", submitted_at=T0, duration_s=2 * HOUR)
    choice = counterfactual(snapshot(NODES), job, baseline)
    assert choice is not None
    assert [m.node_id for m in choice.members] == ["a"]  # node order: carbon-agnostic
    assert choice.start_s == T0
    usages = counterfactual_usages(choice, job, EnergyModel())
    baseline_totals = total(account(usages, FLEET, RECORDED, EnergyModel()))
    actual = total(account([usage()], FLEET, RECORDED, EnergyModel()))
    avoided = baseline_totals - actual
    assert avoided.gco2 == pytest.approx(actual.kwh * (500.0 - 200.0))
    assert avoided.kwh == pytest.approx(0.0)


def test_a_counterfactual_that_must_wait_starts_at_its_reservation() -> None:
    inputs = GreenInputs(signals=grid(), latency=ServingLatency(rtt_ms={}))
    full = [
        Allocation(
            allocation_id=f"x{i}/0",
            work_id=f"x{i}",
            work_kind="training",
            tenant="t",
            priority="p1",
            preemptible=False,
            node_id=node,
            accelerator_kind="gpu",
            accelerators=4,
            started_at=T0,
            expected_end=T0 + end,
        )
        for i, (node, end) in enumerate((("a", 3 * HOUR), ("b", HOUR)))
    ]
    job = TrainingJob(work_id="j", tenant="t", submitted_at=T0, accelerators_per_worker=4)
    snap = Snapshot.build(now=T0, nodes=NODES, allocations=full)
    choice = counterfactual(snap, job, build_policy("fifo-binpack", inputs))
    assert choice is not None
    assert choice.start_s == T0 + HOUR
    assert [m.node_id for m in choice.members] == ["b"]
