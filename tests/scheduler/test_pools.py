"""Nodes with several pools of one kind: MIG slices beside whole GPUs.

Each pool is its own column of capacity (snapshot.py): work is placed in one pool,
running work counts against the pool it holds, eviction frees the pool it was in,
while quota counts every pool of the kind.
"""

from __future__ import annotations

import dataclasses

import pytest

from cloud.scheduler import AcceleratorPool, Allocation, Node, Tenant
from shared.work_literals import PriorityClass
from tests.scheduler.builders import GIB, deployment, job, plan_for, running, snapshot

WHOLE = "A100-SXM4-80GB"
SLICE = "A100-SXM4-80GB MIG 1g.10gb"


def mixed_node(node_id: str = "n1", whole: int = 2, slices: int = 7) -> Node:
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


def on_slice(
    allocation_id: str, *, tenant: str = "team-b", priority: PriorityClass = "p2"
) -> Allocation:
    replica = running(
        allocation_id,
        "n1",
        tenant=tenant,
        priority=priority,
        work_kind="inference",
        expected_end=None,
    )
    return dataclasses.replace(replica, accelerator_model=SLICE)


def test_running_work_counts_against_the_pool_it_holds() -> None:
    whole_job = dataclasses.replace(running("whole", "n1"), accelerator_model=WHOLE)
    table = snapshot([mixed_node()], allocations=[whole_job, on_slice("s0"), on_slice("s1")]).nodes
    free = [(table.kinds[c].slot, int(table.kinds[c].free[0])) for c in table.kind_columns[0]]
    assert free == [(0, 1), (1, 5)]
    # An allocation with no model (stored before pools per profile) is in the main pool.
    legacy = snapshot([mixed_node()], allocations=[running("old", "n1")]).nodes
    assert [int(legacy.kinds[c].free[0]) for c in legacy.kind_columns[0]] == [1, 7]


def test_work_that_needs_a_whole_gpu_never_gets_a_slice_and_small_work_may() -> None:
    plan = plan_for(
        [mixed_node()],
        [
            job("big", 2, memory_bytes=40 * GIB),
            job("third", 1, memory_bytes=40 * GIB),  # no whole GPU left for it
            deployment(
                "small",
                replicas=7,
                kinds=("gpu",),
                max_replicas_per_node=7,
                sites=("cloud",),
                priority="p1",
                submitted_at=10.0,  # after the jobs: the whole GPUs are taken by then
            ),
        ],
    )
    models = {(p.work_id, p.accelerator_model) for p in plan.placements}
    assert models == {("big", WHOLE), ("small", SLICE)}
    (pending,) = plan.pending
    assert pending.work_id == "third"
    assert pending.code == "capacity"


def test_a_deployment_may_ask_for_a_slice_profile_by_its_model() -> None:
    plan = plan_for(
        [mixed_node()],
        [deployment("small", kinds=("gpu",), sites=("cloud",), accelerator_models=(SLICE,))],
    )
    (placement,) = plan.placements
    assert placement.accelerator_model == SLICE


def test_an_eviction_frees_the_pool_its_victim_held() -> None:
    """The slices are full of p2 replicas and a p2 job holds a whole GPU: a p0 job that
    needs a whole GPU evicts that job, not the replicas (they would free only slices)."""
    whole_job = dataclasses.replace(running("p2-job", "n1", 2), accelerator_model=WHOLE)
    replicas = [on_slice(f"r{i}", priority="p2") for i in range(7)]
    plan = plan_for(
        [mixed_node()],
        [job("urgent", 1, priority="p0", memory_bytes=40 * GIB)],
        allocations=[whole_job, *replicas],
    )
    (placement,) = plan.placements
    assert placement.accelerator_model == WHOLE
    assert [p.allocation_id for p in plan.preemptions] == ["p2-job"]


def test_quota_counts_every_pool_of_the_kind() -> None:
    tenants = [Tenant(name="team-a", nominal={"gpu": 3})]
    slices_held = [on_slice("s0", tenant="team-a"), on_slice("s1", tenant="team-a")]
    plan = plan_for(
        [mixed_node()],
        [job("two-whole", 2, memory_bytes=40 * GIB, tenant="team-a")],
        allocations=slices_held,
        tenants=tenants,
    )
    (pending,) = plan.pending
    assert pending.code == "quota"
    assert pending.quota is not None
    assert pending.quota.usage == 2


def test_a_node_has_at_most_one_pool_per_kind_and_model() -> None:
    pool = AcceleratorPool(kind="gpu", count=1, model=WHOLE)
    with pytest.raises(ValueError, match="at most one pool per accelerator kind and model"):
        Node(node_id="n1", site="cloud", pools=(pool, pool))
