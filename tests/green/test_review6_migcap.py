"""Power capping never holds MIG slices to a limit: NVML limits power per physical GPU,
so a slice's cap would hold its sibling slices, other tenants' work among them, too.
Work on slices runs at the default limit and its explanation claims no cap; whole GPUs
beside the slices are capped as before."""

from __future__ import annotations

from cloud.green.latency import default_latency_estimator
from cloud.green.pass_rule import schedule_then_move
from cloud.green.policies import GreenInputs, build_policy, build_power_capper
from cloud.green.power_capping import PowerCapper
from cloud.scheduler import AcceleratorPool, Node, Policy, Snapshot, TrainingJob, schedule
from shared.mig_profiles import slice_model

from .builders import HOUR, T0, flat, grid

A100 = "NVIDIA A100-SXM4-80GB"
FIFO = Policy(weights={"packing": 1.0, "speed": 0.5})


def mig_server(node_id: str, zone: str, *, whole_gpus: int = 0) -> Node:
    """One A100 (400 W) in MIG mode as seven 1g.10gb slices, beside ``whole_gpus``
    whole A100s, and a host CPU."""
    pools = [
        AcceleratorPool(
            kind="gpu",
            count=7,
            model=slice_model(A100, "1g.10gb"),
            memory_bytes=10 * 1000**3,
            relative_speed=1 / 7,
            idle_power_w=50.0 / 7,
            max_power_w=400.0 / 7,
        ),
        AcceleratorPool(kind="cpu", count=1, idle_power_w=100.0, max_power_w=500.0),
    ]
    if whole_gpus:
        pools.append(
            AcceleratorPool(
                kind="gpu",
                count=whole_gpus,
                model=A100,
                memory_bytes=80 * 1000**3,
                relative_speed=1.0,
                idle_power_w=50.0,
                max_power_w=400.0,
            )
        )
    return Node(node_id=node_id, site="cloud", zone=zone, region="r", pools=tuple(pools))


def job(
    work_id: str, *, gpus: int, mig_profile: str | None = None, workers: int = 1
) -> TrainingJob:
    return TrainingJob(
        work_id=work_id,
        tenant="t",
        submitted_at=T0,
        workers=workers,
        accelerators_per_worker=gpus,
        duration_s=4 * HOUR,
        mig_profile=mig_profile,
    )


def test_training_on_mig_slices_runs_uncapped_where_a_whole_gpu_would_be_capped() -> None:
    # A dirty zone, the only capacity: on whole GPUs such a job is always capped.
    signals = grid(flat("DIRTY", 600.0))
    node = mig_server("mig", "DIRTY", whole_gpus=2)
    queue = [job("on-slices", gpus=2, mig_profile="1g.10gb"), job("on-gpus", gpus=2)]
    snapshot = Snapshot.build(now=T0, nodes=[node], queue=queue)
    plan = schedule(snapshot, FIFO)
    models = {p.work_id: p.accelerator_model for p in plan.placements}
    assert models == {"on-slices": slice_model(A100, "1g.10gb"), "on-gpus": A100}

    capped = {p.work_id: p for p in PowerCapper(signals=signals).cap(snapshot, plan).placements}
    assert capped["on-gpus"].power_limit_w is not None  # the whole GPUs still pay off
    on_slices = capped["on-slices"]
    assert on_slices.power_limit_w is None
    original = next(p for p in plan.placements if p.work_id == "on-slices")
    assert on_slices.expected_end == original.expected_end  # no slower run either
    assert "power capping" not in on_slices.explain()


def test_a_gang_with_a_member_on_slices_runs_uncapped_whole() -> None:
    # A gang gets one share for all its members, and its slices can have none.
    signals = grid(flat("DIRTY", 600.0))
    nodes = [mig_server("mig", "DIRTY"), mig_server("whole", "DIRTY", whole_gpus=2)]
    snapshot = Snapshot.build(now=T0, nodes=nodes, queue=[job("gang", gpus=4, workers=2)])
    plan = schedule(snapshot, FIFO)
    models = sorted(p.accelerator_model for p in plan.placements)
    assert len(plan.placements) == 2
    assert slice_model(A100, "1g.10gb") in models
    capped = PowerCapper(signals=signals).cap(snapshot, plan)
    assert [p.power_limit_w for p in capped.placements] == [None, None]


def test_the_green_policys_pass_leaves_slices_uncapped() -> None:
    # The pass the live loop and the evaluation both run (pass_rule.schedule_then_move).
    signals = grid(flat("DIRTY", 600.0))
    inputs = GreenInputs(signals=signals, latency=default_latency_estimator({"r"}))
    snapshot = Snapshot.build(
        now=T0,
        nodes=[mig_server("mig", "DIRTY", whole_gpus=2)],
        queue=[job("on-slices", gpus=3, mig_profile="1g.10gb"), job("on-gpus", gpus=2)],
    )
    decision = schedule_then_move(
        snapshot,
        build_policy("green", inputs),
        None,
        (),
        capper=build_power_capper("green", inputs),
    )
    placed = {p.work_id: p for p in decision.plan.placements}
    assert placed["on-gpus"].power_limit_w is not None  # the policy does cap here
    on_slices = placed["on-slices"]
    assert on_slices.accelerator_model == slice_model(A100, "1g.10gb")
    assert on_slices.power_limit_w is None
    assert "power capping" not in on_slices.explain()
