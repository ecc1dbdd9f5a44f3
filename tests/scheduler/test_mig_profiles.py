"""Work that asks for MIG slices by profile (``mig_profile``) lands only on slices of
that profile, never on a whole GPU; the simulated MIG node offers them as discovery
would, each addressed by its MIG UUID (CUDA_VISIBLE_DEVICES)."""

from __future__ import annotations

import dataclasses
import random

import pytest

from cloud.eval.fleet import pools
from cloud.scheduler import AcceleratorPool, Allocation, Node, Tenant, TrainingJob
from edge.training.environment import visible_devices
from shared.errors import FieldError
from shared.mig_profiles import mig_profile_of
from shared.work_literals import PriorityClass
from sim_devices.probes import SimulatedNode
from sim_devices.profiles import get_profile
from tests.scheduler.builders import GIB, deployment, job, plan_for, running

WHOLE = "NVIDIA A100-SXM4-80GB"
SLICE = "NVIDIA A100-SXM4-80GB MIG 1g.10gb"


def mig_node(node_id: str = "n1", whole: int = 1, slices: int = 7) -> Node:
    return Node(
        node_id=node_id,
        site="cloud",
        zone="DE",
        region="eu",
        pools=(
            AcceleratorPool(kind="gpu", count=whole, model=WHOLE, memory_bytes=80 * GIB),
            AcceleratorPool(
                kind="gpu", count=slices, model=SLICE, memory_bytes=10 * GIB, relative_speed=1 / 7
            ),
        ),
    )


def test_a_job_with_a_mig_profile_takes_slices_of_that_profile_only() -> None:
    plan = plan_for([mig_node()], [job("tiny", 2, mig_profile="1g.10gb")])
    assert [(p.accelerator_model, p.accelerators) for p in plan.placements] == [(SLICE, 2)]


def test_slices_run_out_and_the_whole_gpu_is_never_taken_for_them() -> None:
    plan = plan_for(
        [mig_node(slices=3)],
        [job("a", 3, mig_profile="1g.10gb"), job("b", 1, mig_profile="1g.10gb", submitted_at=1)],
    )
    assert {p.work_id for p in plan.placements} == {"a"}
    pending = plan.pending_for("b")
    assert pending is not None
    assert pending.code == "capacity"


def test_a_profile_no_node_has_is_refused_naming_mig_profile() -> None:
    plan = plan_for([mig_node()], [job("big-slice", 1, mig_profile="3g.40gb")])
    pending = plan.pending_for("big-slice")
    assert pending is not None
    assert pending.code == "unschedulable"
    assert pending.never_fits is not None
    assert pending.never_fits.field == "mig_profile"
    assert "MIG 3g.40gb" in pending.message


def test_a_deployment_serves_from_slices() -> None:
    plan = plan_for(
        [mig_node()],
        [
            deployment(
                "small",
                replicas=3,
                kinds=("gpu",),
                sites=("cloud",),
                max_replicas_per_node=3,
                mig_profile="1g.10gb",
            )
        ],
    )
    assert [p.accelerator_model for p in plan.placements] == [SLICE] * 3


def test_a_mig_profile_is_checked() -> None:
    with pytest.raises(FieldError) as bad:
        TrainingJob(work_id="j", tenant="t", mig_profile="huge")
    assert bad.value.path == ("mig_profile",)
    with pytest.raises(FieldError) as kind:
        TrainingJob(work_id="j", tenant="t", accelerator_kind="npu", mig_profile="1g.10gb")
    assert kind.value.path == ("accelerator_kind",)


def test_the_simulated_mig_node_offers_seven_slices_beside_a_whole_gpu() -> None:
    node = SimulatedNode("m", get_profile("a100-mig"), random.Random(1))
    gpus = [a for a in node.accelerators if a.kind == "gpu"]
    slices = [a for a in gpus if a.parent_id == "gpu0"]
    assert [a.id for a in slices] == [f"gpu0-mig{j}" for j in range(7)]
    assert {mig_profile_of(a.model) for a in slices} == {"1g.10gb"}
    assert all(a.uuid is not None and a.uuid.startswith("MIG-") for a in slices)
    assert [a.id for a in gpus if a.parent_id is None] == ["gpu1"]
    # A worker on slice 3 sees that slice alone, by its MIG UUID.
    assert visible_devices(["gpu0-mig3"], node.accelerators) == slices[3].uuid
    # The evaluation's view of it: the whole GPU is the main pool, the slices beside it.
    assert [(p.model, p.count) for p in pools(get_profile("a100-mig")) if p.kind == "gpu"] == [
        (WHOLE, 1),
        (SLICE, 7),
    ]


def on_slices(
    allocation_id: str, slices: int = 1, *, tenant: str = "team-a", priority: PriorityClass = "p2"
) -> Allocation:
    return dataclasses.replace(
        running(allocation_id, "n1", slices, tenant=tenant, priority=priority),
        accelerator_model=SLICE,
    )


def test_slices_count_against_their_profiles_quota_not_the_gpu_quota() -> None:
    # Seven slices and a whole GPU under quotas of 1 GPU and 7 slices: all fit.
    tenants = [Tenant(name="team-a", nominal={"gpu": 1}, mig_nominal={"1g.10gb": 7})]
    plan = plan_for(
        [mig_node()],
        [
            job("slices", 7, mig_profile="1g.10gb"),
            job("whole", 1, memory_bytes=40 * GIB, submitted_at=1),
        ],
        tenants=tenants,
    )
    assert {p.work_id for p in plan.placements} == {"slices", "whole"}


def test_work_over_its_slice_quota_waits_for_quota_and_evicts_nothing() -> None:
    tenants = [Tenant(name="team-a", nominal={"gpu": 8}, mig_nominal={"1g.10gb": 3})]
    held = [on_slices("held", 2)]
    plan = plan_for(
        [mig_node()], [job("more", 2, mig_profile="1g.10gb", priority="p0")], held, tenants
    )
    assert plan.placements_for("more") == ()
    assert plan.preemptions == ()
    pending = plan.pending_for("more")
    assert pending is not None
    assert pending.code == "quota"
    assert pending.quota is not None
    assert (pending.quota.kind, pending.quota.usage, pending.quota.nominal) == (
        "mig-1g.10gb",
        2,
        3,
    )
    assert "Over quota: tenant team-a uses 2 mig-1g.10gb slices" in pending.message


def test_without_a_slice_quota_a_slice_counts_as_a_gpu() -> None:
    tenants = [Tenant(name="team-a", nominal={"gpu": 3})]
    held = [on_slices("held", 1, priority="p0")]
    plan = plan_for([mig_node()], [job("three", 3, mig_profile="1g.10gb")], held, tenants)
    pending = plan.pending_for("three")
    assert pending is not None
    assert pending.code == "quota"
    assert pending.quota is not None
    assert (pending.quota.kind, pending.quota.usage) == ("gpu", 1)


def test_work_without_a_profile_never_takes_slices_its_tenants_slice_quota_governs() -> None:
    # Quotas of 4 GPUs and 2 slices: jobs without a mig_profile are admitted by the gpu
    # quota, so they may take whole GPUs only; slices they held would count against
    # the slice quota, which never admitted them, and so be held under neither quota.
    tenants = [Tenant(name="team-a", nominal={"gpu": 4}, mig_nominal={"1g.10gb": 2})]
    whole_busy = dataclasses.replace(
        running("other", "n1", 4, tenant="team-b", preemptible=False), accelerator_model=WHOLE
    )
    queue = [job(f"j{i}", 4, submitted_at=i) for i in range(3)]
    plan = plan_for([mig_node(whole=4, slices=14)], queue, [whole_busy], tenants)
    assert plan.placements == ()
    for waiting in ("j0", "j1", "j2"):
        pending = plan.pending_for(waiting)
        assert pending is not None
        assert pending.code in ("capacity", "reserved")


def test_work_only_slices_of_a_governed_profile_could_hold_is_unschedulable() -> None:
    tenants = [Tenant(name="team-a", nominal={"gpu": 4}, mig_nominal={"1g.10gb": 2})]
    plan = plan_for([mig_node(whole=0, slices=14)], [job("j", 4)], tenants=tenants)
    assert plan.placements == ()
    pending = plan.pending_for("j")
    assert pending is not None
    assert pending.code == "unschedulable"
    assert pending.never_fits is not None
    assert pending.never_fits.field == "mig_profile"
    assert "slice quota keeps for work asking for that profile" in pending.message


def test_a_tenant_without_a_slice_quota_still_serves_from_slices() -> None:
    # The rule is the slice quota's: another tenant's work may take any slice.
    tenants = [
        Tenant(name="team-a", nominal={"gpu": 4}, mig_nominal={"1g.10gb": 2}),
        Tenant(name="team-b", nominal={"gpu": 4}),
    ]
    plan = plan_for([mig_node(whole=0, slices=7)], [job("b", 4, tenant="team-b")], tenants=tenants)
    assert [(p.work_id, p.accelerator_model) for p in plan.placements] == [("b", SLICE)]


def test_slice_work_reclaims_nothing_from_the_cohorts_gpu_borrowers() -> None:
    # Slice quotas are not lent or borrowed: a p2 slice job of a tenant that lends no
    # GPU quota has no claim on p0 work another tenant borrowed from a third.
    node = mig_node(whole=0, slices=7)
    tenants = [
        Tenant(name="team-a", cohort="lab", nominal={"gpu": 0}, mig_nominal={"1g.10gb": 7}),
        Tenant(name="team-b", cohort="lab", nominal={"gpu": 0}),
        Tenant(name="team-c", cohort="lab", nominal={"gpu": 8}),
    ]
    borrowed = on_slices("b-p0", 7, tenant="team-b", priority="p0")
    plan = plan_for(
        [node], [job("a-slice", 1, mig_profile="1g.10gb", priority="p2")], [borrowed], tenants
    )
    assert plan.preemptions == ()
    assert plan.placements == ()
    pending = plan.pending_for("a-slice")
    assert pending is not None
    assert pending.code == "capacity"
