"""CPU cores held beside GPUs (cpus_per_worker) are reserved, reclaimed and charged to
a ``cpu`` quota the way host memory and accelerators are."""

from __future__ import annotations

from cloud.scheduler import Policy, Tenant

from .builders import NOW, deployment, gpu_node, job, nodes_of, plan_for, running

# n1: 8 GPUs, 16 cores; CPU work holds 12 cores until NOW+3600.
NODES = [gpu_node("n1", 8, cpu_cores=16)]
CPU_BUSY = [
    running(
        "cpu-work", "n1", 12, kind="cpu", priority="p0", preemptible=False, expected_end=NOW + 3600
    )
]


def test_a_job_blocked_only_by_cores_reserves_them() -> None:
    plan = plan_for(NODES, [job("head", 1, cpus_per_worker=14)], CPU_BUSY)
    (reservation,) = plan.reservations
    assert (reservation.work_id, reservation.start_at) == ("head", NOW + 3600)
    assert reservation.cpu_cores == (14,)
    assert reservation.host_memory_bytes == ()
    pending = plan.pending_for("head")
    assert pending is not None
    assert pending.reservation == reservation
    assert "reserved 1 GPU and 14 CPU cores on 1 node(s)" in pending.message


def test_backfill_cannot_take_the_cores_a_reservation_needs() -> None:
    # At NOW+3600 the head takes 14 of 16 cores: 2 are slack. Work running past then
    # (CPU work, or other jobs' cores) may take only those; short work backfills.
    queue = [
        job("head", 1, submitted_at=0, cpus_per_worker=14),
        job("greedy-gpu", 1, submitted_at=10, duration_s=36000, cpus_per_worker=4),
        job("greedy-cpu", 4, submitted_at=20, duration_s=36000, accelerator_kind="cpu"),
        job("modest", 1, submitted_at=30, duration_s=36000, cpus_per_worker=2),
        job("short", 2, submitted_at=40, duration_s=60, accelerator_kind="cpu"),
    ]
    plan = plan_for(NODES, queue, CPU_BUSY, policy=Policy(max_reservations=1))
    (reservation,) = plan.reservations
    assert reservation.work_id == "head"
    for blocked in ("greedy-gpu", "greedy-cpu"):
        pending = plan.pending_for(blocked)
        assert pending is not None
        assert pending.code == "reserved", blocked
    assert nodes_of(plan, "modest") == ["n1"]  # within the cores' slack
    assert nodes_of(plan, "short") == ["n1"]  # ends before the reserved start


def test_reservation_waits_for_cores_held_beside_gpus() -> None:
    # GPUs are free now; cores only when "r" (1 GPU and 12 cores) ends.
    busy = [
        running(
            "r", "n1", 1, priority="p0", preemptible=False, expected_end=NOW + 1800, cpu_cores=12
        )
    ]
    plan = plan_for(NODES, [job("head", 2, cpus_per_worker=8)], busy)
    (reservation,) = plan.reservations
    assert reservation.start_at == NOW + 1800
    assert reservation.cpu_cores == (8,)


def test_a_cpu_job_waits_for_cores_held_beside_gpus() -> None:
    busy = [
        running(
            "r", "n1", 1, priority="p0", preemptible=False, expected_end=NOW + 1800, cpu_cores=12
        )
    ]
    plan = plan_for(NODES, [job("cpu-head", 8, accelerator_kind="cpu")], busy)
    (reservation,) = plan.reservations
    assert (reservation.accelerator_kind, reservation.start_at) == ("cpu", NOW + 1800)
    assert reservation.accelerators == (8,)


def test_a_cpu_job_evicts_lower_priority_gpu_work_for_the_cores_beside_its_gpus() -> None:
    # p2 GPU work holds all 16 cores beside its GPU: the cores are the CPU pool's, so a
    # p0 CPU job evicts it for them as a p0 GPU job asking for cores would.
    low = [running("low", "n1", 1, priority="p2", expected_end=NOW + 36000, cpu_cores=16)]
    plan = plan_for(NODES, [job("cpu-p0", 4, accelerator_kind="cpu", priority="p0")], low)
    assert [(p.allocation_id, p.reason) for p in plan.preemptions] == [("low", "priority")]
    assert nodes_of(plan, "cpu-p0") == ["n1"]


def test_a_cpu_deployment_evicts_lower_priority_gpu_work_for_its_cores() -> None:
    low = [running("low", "n1", 1, priority="p2", expected_end=NOW + 36000, cpu_cores=16)]
    serve = deployment("serve", kinds=("cpu",), sites=("cloud",), priority="p0")
    plan = plan_for(NODES, [serve], low)
    assert [(p.allocation_id, p.reason) for p in plan.preemptions] == [("low", "priority")]
    assert nodes_of(plan, "serve") == ["n1"]


def test_a_cpu_job_evicts_only_what_its_cores_need() -> None:
    # Two p2 GPU jobs hold 8 cores each: a 6-core CPU job evicts one of them (the latest
    # started), not both.
    low = [
        running("early", "n1", 1, priority="p2", started_at=NOW - 900, cpu_cores=8),
        running("late", "n1", 1, priority="p2", started_at=NOW - 60, cpu_cores=8),
    ]
    plan = plan_for(NODES, [job("cpu-p0", 6, accelerator_kind="cpu", priority="p0")], low)
    assert [p.allocation_id for p in plan.preemptions] == ["late"]
    assert nodes_of(plan, "cpu-p0") == ["n1"]


def test_reclaim_frees_a_borrowers_cores() -> None:
    # The borrower (p0, so only reclaim can evict it) holds 4 GPUs and all 16 cores;
    # the owner, within its nominal quota, needs 4 cores beside 1 GPU.
    tenants = [
        Tenant(name="owner", cohort="lab", nominal={"gpu": 4}),
        Tenant(name="borrower", cohort="lab", nominal={"gpu": 0}),
    ]
    allocations = [
        running("b", "n1", 4, tenant="borrower", priority="p0", cpu_cores=16),
    ]
    plan = plan_for(
        NODES,
        [job("mine", 1, tenant="owner", priority="p1", cpus_per_worker=4)],
        allocations,
        tenants=tenants,
    )
    assert [(p.allocation_id, p.reason) for p in plan.preemptions] == [("b", "reclaim")]
    assert nodes_of(plan, "mine") == ["n1"]


def test_cores_count_against_a_cpu_quota() -> None:
    tenants = [Tenant(name="team-a", nominal={"gpu": 8, "cpu": 4})]
    held = [running("mine-before", "n1", 1, tenant="team-a", priority="p1", cpu_cores=4)]
    plan = plan_for(
        NODES, [job("more", 1, cpus_per_worker=2, priority="p1")], held, tenants=tenants
    )
    pending = plan.pending_for("more")
    assert pending is not None
    assert pending.code == "quota"
    assert pending.quota is not None
    assert (pending.quota.kind, pending.quota.usage, pending.quota.requested) == ("cpu", 4, 2)
    assert "CPU" in pending.message


def test_a_cpu_quota_evicts_the_tenants_own_lower_priority_cores() -> None:
    tenants = [Tenant(name="team-a", nominal={"gpu": 8, "cpu": 4})]
    held = [running("old", "n1", 1, tenant="team-a", priority="p2", cpu_cores=4)]
    plan = plan_for(
        NODES, [job("urgent", 1, cpus_per_worker=2, priority="p1")], held, tenants=tenants
    )
    assert [(p.allocation_id, p.reason) for p in plan.preemptions] == [("old", "quota")]
    (placement,) = plan.placements_for("urgent")
    assert placement.cpu_cores == 2


def test_without_a_cpu_quota_cores_are_capacity_only() -> None:
    tenants = [Tenant(name="team-a", nominal={"gpu": 8})]
    plan = plan_for(NODES, [job("free", 1, cpus_per_worker=8)], tenants=tenants)
    assert nodes_of(plan, "free") == ["n1"]


def test_cores_beyond_what_a_cpu_quota_could_ever_give_never_fit() -> None:
    tenants = [Tenant(name="team-a", nominal={"gpu": 8, "cpu": 4})]
    plan = plan_for(NODES, [job("wide", 1, workers=3, cpus_per_worker=2)], tenants=tenants)
    pending = plan.pending_for("wide")
    assert pending is not None
    assert pending.code == "unschedulable"
    assert pending.never_fits is not None
    assert pending.never_fits.field == "cpus_per_worker"
    assert "at most 4 CPU" in pending.never_fits.reason
