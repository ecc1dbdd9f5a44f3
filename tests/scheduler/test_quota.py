"""Tenants and quotas: nominal, borrowing within a limit, cohorts, explanations."""

from __future__ import annotations

from cloud.scheduler import Tenant

from .builders import gpu_node, job, plan_for, running

NODES = [gpu_node(f"n{i}") for i in range(4)]  # 32 GPUs


def test_within_nominal_is_admitted_not_borrowed() -> None:
    tenants = [Tenant(name="a", cohort="c", nominal={"gpu": 8})]
    plan = plan_for(NODES, [job("j", 8, tenant="a")], tenants=tenants)
    assert [p.borrowed for p in plan.placements] == [False]


def test_borrowing_idle_cohort_capacity_up_to_the_limit() -> None:
    tenants = [
        Tenant(name="a", cohort="c", nominal={"gpu": 8}, borrowing_limit={"gpu": 8}),
        Tenant(name="b", cohort="c", nominal={"gpu": 16}),
    ]
    queue = [job(f"j{i}", 8, tenant="a", submitted_at=i) for i in range(3)]
    plan = plan_for(NODES, queue, tenants=tenants)
    assert [p.work_id for p in plan.placements] == ["j0", "j1"]
    assert [p.borrowed for p in plan.placements] == [False, True]
    pending = plan.pending_for("j2")
    assert pending is not None
    assert pending.code == "quota"
    assert pending.quota is not None
    assert (pending.quota.usage, pending.quota.nominal, pending.quota.borrowing_limit) == (16, 8, 8)
    assert "Over quota: tenant a uses 16 GPU (nominal 8, borrowing limit 8" in pending.message


def test_borrowing_only_what_the_cohort_has_idle() -> None:
    tenants = [
        Tenant(name="a", cohort="c", nominal={"gpu": 8}),  # no limit: whatever is idle
        Tenant(name="b", cohort="c", nominal={"gpu": 8}),
    ]
    allocations = [running("b1", "n0", 6, tenant="b", priority="p1", preemptible=False)]
    queue = [job(f"j{i}", 2, tenant="a", submitted_at=i) for i in range(6)]
    plan = plan_for(NODES, queue, allocations, tenants=tenants)
    # cohort nominal 16, b uses 6: a gets 10 (8 nominal + 2 borrowed), not more.
    assert len(plan.placements) == 5


def test_tenant_without_cohort_never_exceeds_nominal() -> None:
    tenants = [Tenant(name="a", nominal={"gpu": 4})]
    plan = plan_for(
        NODES, [job("j1", 4, tenant="a"), job("j2", 1, tenant="a", submitted_at=1)], tenants=tenants
    )
    assert [p.work_id for p in plan.placements] == ["j1"]
    assert plan.pending_for("j2") is not None


def test_unmanaged_tenants_have_no_quota() -> None:
    tenants = [Tenant(name="a", nominal={"gpu": 4})]
    plan = plan_for(NODES, [job("j", 8, workers=4, tenant="someone-else")], tenants=tenants)
    assert len(plan.placements) == 4
