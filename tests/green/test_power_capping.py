"""PowerCapper: new training runs under a lower GPU power limit where the energy saved
outweighs the longer run; never past a deadline, into a reservation or below what
the device allows; a gang is capped whole."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from cloud.green.energy import EnergyModel
from cloud.green.latency import default_latency_estimator
from cloud.green.pass_rule import schedule_then_move
from cloud.green.policies import GreenInputs, build_policy, build_power_capper
from cloud.green.power_capping import PowerCapper
from cloud.scheduler import Node, Plan, Policy, Reservation, Snapshot, TrainingJob, schedule
from cloud.signals.grid import GridSignals
from shared.accelerators import capped_throughput

from .builders import HOUR, T0, flat, gpu_server, grid, running_on, series

LATENCY = default_latency_estimator({"r"})
FIFO = Policy(weights={"packing": 1.0, "speed": 0.5})


def job(
    work_id: str = "job",
    *,
    duration_h: float = 4.0,
    deadline: float | None = None,
    workers: int = 1,
    gpus: int = 4,
) -> TrainingJob:
    return TrainingJob(
        work_id=work_id,
        tenant="t",
        submitted_at=T0,
        workers=workers,
        accelerators_per_worker=gpus,
        duration_s=duration_h * HOUR,
        deadline=deadline,
    )


def placed(nodes: list[Node], queue: list[TrainingJob], **build: object) -> tuple[Snapshot, Plan]:
    snap = Snapshot.build(now=T0, nodes=nodes, queue=queue, **build)  # type: ignore[arg-type]
    return snap, schedule(snap, FIFO)


def energy_kwh(snap: Snapshot, node_id: str, gpus: int, share: float | None, run_s: float) -> float:
    row = np.array([snap.nodes.index[node_id]])
    limit = None if share is None else share * 400.0
    power_w = EnergyModel().member_power_w(
        snap, "gpu", row, gpus, EnergyModel().training_utilisation, power_limit_w=limit
    )
    return float(power_w[0]) * run_s / 3.6e6


def test_a_job_on_the_margin_runs_capped_for_less_energy_and_longer() -> None:
    signals = grid(flat("DIRTY", 600.0))
    snap, plan = placed([gpu_server("dirty", "DIRTY")], [job()])
    capped = PowerCapper(signals=signals).cap(snap, plan)

    (before,) = plan.placements
    (after,) = capped.placements
    assert after.power_limit_w is not None
    assert after.power_limit_w < 400.0
    share = after.power_limit_w / 400.0
    assert after.expected_end is not None
    assert before.expected_end is not None
    run_s = before.expected_end - before.start_at
    assert after.expected_end - after.start_at == pytest.approx(run_s / capped_throughput(share))
    # less energy for the whole (longer) run: host share included
    assert energy_kwh(snap, "dirty", 4, share, run_s / capped_throughput(share)) < 0.97 * (
        energy_kwh(snap, "dirty", 4, None, run_s)
    )
    assert "held to" in after.explain()


def test_clean_capacity_stays_uncapped_while_training_holds_the_dirty_margin() -> None:
    # Holding a clean GPU longer pushes other work onto the dirty node the cluster is
    # already using: the time costs more than the energy saves.
    signals = grid(flat("DIRTY", 600.0), flat("CLEAN", 50.0))
    nodes = [gpu_server("dirty", "DIRTY"), gpu_server("clean", "CLEAN")]
    other = job("other", duration_h=20.0)
    snap, plan = placed(nodes, [job()], allocations=[running_on("dirty", other)])
    (placement,) = plan.placements
    assert placement.node_id == "clean"
    assert PowerCapper(signals=signals).cap(snap, plan).placements[0].power_limit_w is None

    # Even with nothing on the dirty node: more work will arrive during the run, and
    # on average it would land on the fleet's mean capacity, dirtier than this node.
    alone, alone_plan = placed(nodes, [job()])
    assert alone_plan.placements[0].node_id == "clean"
    assert PowerCapper(signals=signals).cap(alone, alone_plan).placements[0].power_limit_w is None

    # In a fleet that is all this clean, the node is the margin itself: capped.
    clean_fleet = [gpu_server("clean", "CLEAN"), gpu_server("clean-2", "CLEAN")]
    only_clean, only_clean_plan = placed(clean_fleet, [job()])
    capped = PowerCapper(signals=signals).cap(only_clean, only_clean_plan)
    assert capped.placements[0].power_limit_w is not None


def test_a_cap_never_costs_a_deadline() -> None:
    signals = grid(flat("DIRTY", 600.0))
    safety_s = 3600.0
    # Room for the uncapped run and the safety margin, but not for a slower run.
    tight = job(deadline=T0 + 4 * HOUR + safety_s + 60.0)
    snap, plan = placed([gpu_server("dirty", "DIRTY")], [tight])
    capper = PowerCapper(signals=signals, safety_margin_s=safety_s)
    assert capper.cap(snap, plan).placements[0].power_limit_w is None

    # With a day to spare it is capped, and the capped run still ends in time.
    roomy = job(deadline=T0 + 24 * HOUR)
    snap, plan = placed([gpu_server("dirty", "DIRTY")], [roomy])
    (after,) = capper.cap(snap, plan).placements
    assert after.power_limit_w is not None
    assert after.expected_end is not None
    assert after.expected_end <= T0 + 24 * HOUR - safety_s


def test_nothing_is_capped_while_work_with_a_deadline_waits_for_capacity() -> None:
    signals = grid(flat("DIRTY", 600.0))
    nodes = [gpu_server("dirty", "DIRTY")]
    # The node holds the first job; the second, with a latest start, finds no room.
    waiting = dataclasses.replace(job("urgent", duration_h=1.0), max_delay_s=HOUR)
    snap, plan = placed(nodes, [job("first"), waiting])
    assert [p.work_id for p in plan.placements] == ["first"]
    assert plan.pending[0].code in ("capacity", "reserved")
    assert PowerCapper(signals=signals).cap(snap, plan).placements[0].power_limit_w is None
    # Work that can wait as long as it takes does not stop the cap (no reservation
    # here: a cap never runs into one anyway).
    unreserved = dataclasses.replace(FIFO, max_reservations=0)
    for queue in ([job("first"), job("patient", duration_h=1.0)], [job("first"), waiting]):
        snap = Snapshot.build(now=T0, nodes=nodes, queue=queue)
        plan = schedule(snap, unreserved)
        capped = PowerCapper(signals=signals).cap(snap, plan).placements[0].power_limit_w
        assert (capped is None) == (queue[1] is waiting)


def test_a_backfilled_job_is_not_stretched_into_a_reservation() -> None:
    signals = grid(flat("DIRTY", 600.0))
    snap, plan = placed([gpu_server("dirty", "DIRTY")], [job()])
    (placement,) = plan.placements
    assert placement.expected_end is not None
    held = Reservation(
        work_id="big",
        start_at=placement.expected_end + 60.0,  # the uncapped run ends just before it
        accelerator_kind="gpu",
        nodes=("dirty",),
        accelerators=(4,),
    )
    reserved = dataclasses.replace(plan, reservations=(held,))
    assert PowerCapper(signals=signals).cap(snap, reserved).placements[0].power_limit_w is None


def test_a_gang_is_capped_whole_and_ends_as_one() -> None:
    signals = grid(flat("DIRTY", 600.0))
    nodes = [gpu_server("dirty-1", "DIRTY"), gpu_server("dirty-2", "DIRTY")]
    snap, plan = placed(nodes, [job(workers=2)])
    capped = PowerCapper(signals=signals).cap(snap, plan).placements
    assert len(capped) == 2
    assert {p.power_limit_w for p in capped} == {capped[0].power_limit_w}
    assert capped[0].power_limit_w is not None
    assert len({p.expected_end for p in capped}) == 1


def test_no_cap_below_what_the_device_allows() -> None:
    # A T4's driver accepts no less than 60 of its 70 W: no share on the ladder fits.
    signals = grid(flat("DIRTY", 600.0))
    t4 = gpu_server("t4", "DIRTY", max_w=70.0, idle_w=10.0)
    t4 = dataclasses.replace(
        t4, pools=(dataclasses.replace(t4.pools[0], model="Tesla T4"), *t4.pools[1:])
    )
    snap, plan = placed([t4], [job()])
    assert PowerCapper(signals=signals).cap(snap, plan).placements[0].power_limit_w is None


def test_the_pass_rule_caps_under_green_and_never_under_the_baseline() -> None:
    signals = grid(flat("DIRTY", 600.0))
    snap = Snapshot.build(now=T0, nodes=[gpu_server("dirty", "DIRTY")], queue=[job()])
    inputs = GreenInputs(signals=signals, latency=LATENCY)
    green = schedule_then_move(
        snap,
        build_policy("green", inputs),
        None,
        (),
        capper=build_power_capper("green", inputs),
    )
    assert green.plan.placements[0].power_limit_w is not None
    assert build_power_capper("fifo-binpack", inputs) is None
    off = dataclasses.replace(inputs, power_capping=False)
    assert build_power_capper("green", off) is None


def test_with_negative_prices_a_small_saving_is_still_no_reason_to_cap() -> None:
    # Power paid for at -50 per MWh for the uncapped run's 4 hours, and at `late` after:
    # a capped run, longer, is paid more for the hours it runs into.
    snap, plan = placed([gpu_server("dirty", "DIRTY")], [job(duration_h=4.0)])

    def cap_at(late: float, min_saving: float) -> float | None:
        prices = [-50.0] * 4 + [late] * 68
        signals = grid(series("DIRTY", [600.0] * 72, price=prices))
        capper = PowerCapper(signals=signals, objective="price", min_saving=min_saving)
        return capper.cap(snap, plan).placements[0].power_limit_w

    assert cap_at(-50.0, 0.0) is None  # less energy at a negative price only costs
    assert cap_at(-5000.0, 0.03) is not None  # a large saving: capped
    # Where a cap first saves anything at all, it saves far less than the 3 % asked.
    no_cap, cap = -50.0, -5000.0
    for _ in range(60):
        middle = (no_cap + cap) / 2
        no_cap, cap = (no_cap, middle) if cap_at(middle, 0.0) is not None else (middle, cap)
    assert cap_at(cap, 0.0) is not None
    assert cap_at(cap, 0.03) is None  # before: any saving passed (1 - 0.03) × a cost < 0


def test_settings_are_checked() -> None:
    signals = GridSignals(now_s=T0)
    with pytest.raises(ValueError, match="shares"):
        PowerCapper(signals=signals, shares=(0.5, 1.2))
    with pytest.raises(ValueError, match="min_saving"):
        PowerCapper(signals=signals, min_saving=1.0)
