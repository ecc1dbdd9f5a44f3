"""Work no node of the fleet could ever run is pending as `unschedulable` with the exact
cause (never "waiting for capacity"), and CPU cores of GPU jobs (`cpus_per_worker`) are
filtered, held while running, and freed by preemption (issue 17)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from cloud.scheduler import AcceleratorPool, Node, Pending, Tenant, Work
from cloud.scheduler.plan import NeverFits
from cloud.scheduler.unschedulable import never_fits

from .builders import GIB, NOW, deployment, gpu_node, job, plan_for, running, snapshot


def server(node_id: str, gpus: int = 8, *, cores: int = 16, host_memory_gib: int = 512) -> Node:
    """A GPU server whose CPU is a pool of `cores` cores, as the loop builds nodes."""
    return Node(
        node_id=node_id,
        site="cloud",
        zone="DE",
        region="eu",
        host_memory_bytes=host_memory_gib * GIB,
        pools=(
            AcceleratorPool(kind="gpu", count=gpus, model="A100", memory_bytes=80 * GIB),
            AcceleratorPool(kind="cpu", count=cores, model="", relative_speed=0.05),
        ),
    )


def pending(item: Pending | None) -> Pending:
    assert item is not None
    return item


# ---- work that can never run ------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "field", "reason"),
    [
        ({"gpus": 64}, "accelerators_per_worker", "no node has 64 GPU; the largest has 8"),
        ({"accelerator_kind": "npu"}, "accelerator_kind", "no node at cloud has a NPU"),
        (
            {"accelerator_models": ("H100",)},
            "accelerator_models",
            "no node has 1 GPU of model H100",
        ),
        (
            {"memory_bytes": 100 * GIB},
            "memory_bytes",
            "no node has GPU with 100 GiB of memory each; the most is 80 GiB",
        ),
        (
            {"host_memory_bytes": 2048 * GIB},
            "host_memory_bytes",
            "no node with 1 GPU has 2,048 GiB of host memory; the most is 512 GiB",
        ),
        (
            {"cpus_per_worker": 32},
            "cpus_per_worker",
            "no node with 1 GPU has 32 CPU cores; the most is 16",
        ),
        (
            {"gpus": 8, "workers": 3},
            "workers",
            "the fleet could hold at most 2 workers of 8 GPU at once (on 2 nodes); the gang has 3",
        ),
        (
            {"gpus": 4, "workers": 3, "cpus_per_worker": 10},
            "workers",
            "the fleet could hold at most 2 workers of 4 GPU at once (on 2 nodes); the gang has 3",
        ),
        (
            {"deadline": NOW + 1800},
            "deadline",
            "2023-11-14T22:43:20+00:00 is too soon: the job needs 3,600 s on the fastest "
            "registered gpu (relative speed 1), so it would be late wherever it ran",
        ),
        ({"deadline": NOW - 1}, "deadline", "2023-11-14T22:13:19+00:00 has passed"),
    ],
)
def test_work_the_fleet_could_never_hold_is_unschedulable_with_its_exact_cause(
    fields: dict[str, Any], field: str, reason: str
) -> None:
    gpus = fields.pop("gpus", 1)
    nodes = [server("a"), server("b")]
    work = job("j", gpus, **fields)
    assert never_fits(snapshot(nodes), work) == NeverFits(field, reason)
    waiting = pending(plan_for(nodes, [work]).pending_for("j"))
    assert waiting.code == "unschedulable"
    assert waiting.never_fits == NeverFits(field, reason)
    assert waiting.message.startswith(f"No node can run it: {reason}; ")
    assert waiting.reservation is None
    assert sum(waiting.rejections.values()) + waiting.fitting_nodes == waiting.nodes_total


def test_a_gang_counts_only_the_nodes_that_would_finish_it_in_time() -> None:
    nodes = [gpu_node("fast", 8, speed=2.0), gpu_node("slow", 8, speed=0.5)]
    gang = job("gang", 8, workers=2, duration_s=3600, deadline=NOW + 3600)
    assert never_fits(snapshot(nodes), gang) == NeverFits(
        "workers",
        "the fleet could hold at most 1 workers of 8 GPU at once (on 1 nodes); the gang has 2",
    )
    relaxed = job("gang", 8, workers=2, duration_s=3600, deadline=NOW + 8000)
    assert never_fits(snapshot(nodes), relaxed) is None


def test_more_host_memory_than_any_node_has_is_not_waiting_for_capacity() -> None:
    """Host memory is a dynamic filter: without the fleet rule the job used to read
    "Waiting for capacity ... no reservation" for ever."""
    plan = plan_for([server("a", host_memory_gib=64)], [job("big", 1, host_memory_bytes=65 * GIB)])
    waiting = pending(plan.pending_for("big"))
    assert waiting.code == "unschedulable"
    assert "Waiting for capacity" not in waiting.message
    assert dict(waiting.rejections) == {"host-memory": 1}


def test_a_gang_beyond_what_quota_and_cohort_could_ever_give_is_unschedulable() -> None:
    nodes = [server("a"), server("b"), server("c")]
    alone = Tenant(name="acme", nominal={"gpu": 8})
    lending = [
        Tenant(name="acme", nominal={"gpu": 8}, cohort="lab", borrowing_limit={"gpu": 4}),
        Tenant(name="beta", nominal={"gpu": 8}, cohort="lab"),
    ]
    gang = job("gang", 8, workers=2, tenant="acme")
    assert never_fits(snapshot(nodes, tenants=[alone]), gang) == NeverFits(
        "workers",
        "tenant acme may hold at most 8 GPU (its nominal quota; no cohort to borrow from); "
        "the job needs 16",
    )
    assert never_fits(snapshot(nodes, tenants=lending), gang) == NeverFits(
        "workers",
        "tenant acme may hold at most 12 GPU (nominal 8 plus what cohort lab could lend, "
        "borrowing limit 4); the job needs 16",
    )
    three_quarters = job("gang", 4, workers=3, tenant="acme")
    assert never_fits(snapshot(nodes, tenants=lending), three_quarters) is None
    # Within what it could borrow, but others hold it now: quota, not unschedulable.
    held = [
        running("b-run", "a", 8, tenant="beta", preemptible=False),
        running("b-run2", "b", 4, tenant="beta", preemptible=False),
    ]
    waiting = pending(plan_for(nodes, [three_quarters], held, tenants=lending).pending_for("gang"))
    assert waiting.code == "quota"
    unmanaged = job("gang", 8, workers=3, tenant="someone")
    assert never_fits(snapshot(nodes, tenants=lending), unmanaged) is None


def test_nothing_registered_where_it_may_run_is_nothing_to_judge_by() -> None:
    assert never_fits(snapshot([]), job("j", 64)) is None
    edge_only = [replace(gpu_node("e", 1, site="edge"), runs_training=False)]
    assert never_fits(snapshot(edge_only), job("j", 64)) is None  # a cloud node may register
    cloud_only = [server("a")]
    either = deployment("d", kinds=("gpu",), accelerators_per_replica=64, sites=("cloud", "edge"))
    assert never_fits(snapshot(cloud_only), either) is None  # an edge node may register
    assert never_fits(snapshot([*cloud_only, gpu_node("e", 2, site="edge")]), either) == (
        NeverFits("accelerators_per_replica", "no node has 64 GPU; the largest has 8")
    )
    assert never_fits(snapshot(edge_only), job("j", 1, sites=("edge",))) == NeverFits(
        "sites",
        "no node at edge runs training (an edge agent runs it with agent.training_enabled = "
        "true); name cloud, or enable training there",
    )


def test_a_deployment_is_judged_per_replica_over_its_accepted_kinds() -> None:
    nodes = [gpu_node("e", 2, site="edge")]
    assert never_fits(snapshot(nodes), deployment("d", kinds=("npu", "gpu"))) is None
    too_wide = deployment("d", kinds=("npu", "gpu"), accelerators_per_replica=4)
    assert never_fits(snapshot(nodes), too_wide) == NeverFits(
        "accelerators_per_replica", "no node has 4 NPU/GPU; the largest has 2"
    )


def test_a_job_that_fits_an_empty_fleet_but_not_now_waits_for_capacity() -> None:
    nodes = [server("a")]
    plan = plan_for(nodes, [job("j", 8, priority="p2")], [running("r", "a", 8, priority="p1")])
    assert pending(plan.pending_for("j")).code == "capacity"
    assert pending(plan.pending_for("j")).never_fits is None


# ---- CPU cores beside GPUs ---------------------------------------------------------------


def test_cpu_cores_are_filtered_like_host_memory_with_their_own_reason() -> None:
    holder = replace(running("holder", "a", 1, priority="p0", preemptible=False), cpu_cores=12)
    plan = plan_for([server("a", cores=16)], [job("j", 1, cpus_per_worker=8)], [holder])
    waiting = pending(plan.pending_for("j"))
    assert waiting.code == "capacity"
    assert dict(waiting.rejections) == {"cpus": 1}
    assert "1 fewer than 8 CPU cores free" in waiting.message
    fits = plan_for([server("a", cores=16)], [job("j", 1, cpus_per_worker=4)], [holder])
    assert [p.cpu_cores for p in fits.placements] == [4]


def test_cores_held_beside_gpus_are_counted_for_later_members_and_cpu_work() -> None:
    queue: list[Work] = [
        job("first", 1, cpus_per_worker=10, submitted_at=1),
        job("second", 1, cpus_per_worker=10, submitted_at=2),
        deployment(
            "cpu-serving",
            kinds=("cpu",),
            accelerators_per_replica=8,
            sites=("cloud",),
            priority="p2",
        ),
    ]
    plan = plan_for([server("a", cores=16)], queue)
    assert {p.work_id for p in plan.placements} == {"first"}
    assert dict(pending(plan.pending_for("second")).rejections) == {"cpus": 1}
    # The CPU replica sees 6 of 16 cores free: the GPU job's 10 are held.
    assert dict(pending(plan.pending_for("cpu-serving")).rejections) == {"busy": 1}


def test_running_allocations_hold_their_cores_in_the_snapshot() -> None:
    holder = replace(running("holder", "a", 1), cpu_cores=12)
    table = snapshot([server("a", cores=16)], allocations=[holder]).nodes
    assert int(table.kind("cpu").free[0]) == 4
    assert int(table.kind("gpu").free[0]) == 7


def test_preemption_frees_cores_a_lower_priority_gpu_job_holds() -> None:
    low = replace(running("low", "a", 1, priority="p2"), cpu_cores=14)
    plan = plan_for(
        [server("a", cores=16)], [job("hi", 1, priority="p0", cpus_per_worker=8)], [low]
    )
    assert [p.allocation_id for p in plan.preemptions] == ["low"]
    assert [(p.work_id, p.cpu_cores) for p in plan.placements] == [("hi", 8)]


def test_a_cpu_job_asks_for_cores_with_its_accelerators_not_cpus_per_worker() -> None:
    with pytest.raises(ValueError, match="cpus_per_worker"):
        job("j", 4, accelerator_kind="cpu", cpus_per_worker=2)
