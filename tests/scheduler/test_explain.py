"""Behaviour 7: a reason and a sentence for every pending job; a breakdown per placement."""

from __future__ import annotations

from cloud.scheduler import Pending, Plan, Policy, Tenant, Work

from .builders import deployment, edge_node, gpu_node, job, plan_for, running


def test_every_job_is_placed_or_explained() -> None:
    nodes = [gpu_node("n0", 4), edge_node("e0")]
    queue: list[Work] = [
        job("fits", 4),
        job("too-big", 16),
        job("no-room", 4, submitted_at=1),
        deployment("no-gpu", kinds=("gpu",)),
        deployment("ok", kinds=("npu",)),
    ]
    plan = plan_for(nodes, queue)
    placed = {p.work_id for p in plan.placements}
    pending = {p.work_id for p in plan.pending}
    assert placed | pending == {w.work_id for w in queue}
    assert not placed & pending
    for item in plan.pending:
        assert item.message
        assert "\n" not in item.message
        assert sum(item.rejections.values()) + item.fitting_nodes == item.nodes_total
    too_big = plan.pending_for("too-big")
    assert too_big is not None
    assert too_big.code == "unschedulable"
    assert too_big.message == (
        "No node can run it: no node has 16 GPU; the largest has 4; "
        "0/2 nodes fit: 1 not cloud, 1 fewer than 16 GPU."
    )


def test_placement_explains_choice_and_runners_up() -> None:
    nodes = [gpu_node(f"n{i}", utilisation=0.1 * i) for i in range(6)]
    plan = plan_for(nodes, [job("j", 8)], policy=Policy(runners_up=3))
    (placement,) = plan.placements
    assert placement.chosen.node_id == "n0"
    assert [r.node_id for r in placement.runners_up] == ["n1", "n2", "n3"]
    assert placement.chosen.total >= max(r.total for r in placement.runners_up)
    assert [t.name for t in placement.chosen.terms] == [
        "packing",
        "load",
        "speed",
        "preference",
    ]
    text = placement.explain()
    assert text.startswith("j/0 on n0 ")
    assert "runners-up: n1" in text
    assert plan.explain("j") == [text]


def test_runners_up_can_be_turned_off() -> None:
    plan = plan_for([gpu_node("a"), gpu_node("b")], [job("j", 1)], policy=Policy(runners_up=0))
    assert plan.placements[0].runners_up == ()


def _pending(plan: Plan, work_id: str) -> Pending:
    found = plan.pending_for(work_id)
    assert found is not None
    return found


def test_a_failed_reclaim_is_not_called_over_quota() -> None:
    # A is within its nominal 4, but B borrowed the whole cohort with work that cannot
    # be preempted: A's problem is the loan, not its own usage.
    tenants = [
        Tenant(name="A", cohort="c", nominal={"gpu": 4}),
        Tenant(name="B", cohort="c", nominal={"gpu": 4}),
    ]
    lent = running("b", "n1", 8, tenant="B", priority="p2", preemptible=False)
    plan = plan_for(
        [gpu_node("n1", 8), gpu_node("n2", 2)], [job("J", 2, tenant="A")], [lent], tenants
    )
    reason = _pending(plan, "J")
    assert reason.code == "quota"
    assert "Over quota" not in reason.message
    assert "nothing lower-priority to evict" not in reason.message
    assert "within its quota" in reason.message
    assert "lent to non-preemptible work" in reason.message


def test_over_quota_says_nothing_to_evict_only_when_preemption_ran() -> None:
    tenants = [Tenant(name="a", nominal={"gpu": 4})]
    queue = [job("j1", 4, tenant="a"), job("j2", 1, tenant="a", submitted_at=1)]
    plan = plan_for([gpu_node("n0")], queue, tenants=tenants)
    assert "nothing lower-priority to evict" in _pending(plan, "j2").message
    plan = plan_for([gpu_node("n0")], queue, tenants=tenants, policy=Policy(preemption=False))
    message = _pending(plan, "j2").message
    assert message.startswith("Over quota: tenant a uses 4 GPU")
    assert "nothing lower-priority to evict" not in message
    assert "preemption is off" in message


def test_quota_reason_names_the_kind_that_would_fit() -> None:
    # T's NPU quota is used up on the only NPU node; the GPU node is free, but T has no
    # GPU quota: the reason is about GPUs, the kind the deployment could run on.
    tenants = [Tenant(name="T", nominal={"npu": 1, "gpu": 0})]
    held = running(
        "t-npu", "e1", 1, kind="npu", tenant="T", preemptible=False, work_kind="inference"
    )
    nodes = [edge_node("e1"), edge_node("g1", kind="gpu", providers=("CUDAExecutionProvider",))]
    plan = plan_for(nodes, [deployment("d", tenant="T", kinds=("npu", "gpu"))], [held], tenants)
    reason = _pending(plan, "d")
    assert reason.code == "quota"
    assert reason.quota is not None
    assert reason.quota.kind == "gpu"
    assert "uses 0 GPU (nominal 0" in reason.message


def test_a_kind_denied_by_quota_is_not_reported_as_waiting_for_capacity() -> None:
    # NPU is within quota but busy; the GPU node is free but T has no GPU quota.
    tenants = [Tenant(name="T", nominal={"npu": 1, "gpu": 0})]
    held = running(
        "other",
        "e1",
        1,
        kind="npu",
        tenant="U",
        priority="p0",
        preemptible=False,
        work_kind="inference",
    )
    nodes = [edge_node("e1"), edge_node("g1", kind="gpu", providers=("CUDAExecutionProvider",))]
    plan = plan_for(nodes, [deployment("d", tenant="T", kinds=("npu", "gpu"))], [held], tenants)
    reason = _pending(plan, "d")
    assert reason.code == "quota"
    assert reason.quota is not None
    assert reason.quota.kind == "gpu"
    assert not reason.message.startswith("Waiting for capacity: 1/2 nodes fit")


def test_capacity_message_says_whether_preemption_was_tried() -> None:
    nodes = [gpu_node("n0"), gpu_node("n1")]
    allocations = [
        running("low", "n0", 8),
        running("pinned", "n1", 8, priority="p0", preemptible=False),
    ]
    gang = job("gang", 8, workers=2, priority="p1")
    message = _pending(plan_for(nodes, [gang], allocations), "gang").message
    assert "no lower-priority work to evict" not in message
    assert "evicting lower-priority work would not make room" in message
    off = plan_for(nodes, [gang], allocations, policy=Policy(preemption=False))
    message = _pending(off, "gang").message
    assert "no lower-priority work to evict" not in message
    assert "preemption is off" in message


def test_jobs_alike_but_for_their_accelerator_kind_are_explained_each_for_its_kind() -> None:
    # Two training jobs whose only difference is the kind share every other static
    # input: each must still be judged against the nodes of its own kind.
    nodes = [gpu_node("n0", 4), gpu_node("n1", 4)]
    queue: list[Work] = [job("gpus", 8), job("npus", 8, accelerator_kind="npu")]
    plan = plan_for(nodes, queue)
    gpus, npus = plan.pending_for("gpus"), plan.pending_for("npus")
    assert gpus is not None
    assert npus is not None
    assert gpus.rejections != npus.rejections
    assert "NPU" in npus.message, npus.message
    assert "GPU" not in npus.message, npus.message
