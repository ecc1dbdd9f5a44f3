"""Behaviour 7: a reason and a sentence for every pending job; a breakdown per placement."""

from __future__ import annotations

from cloud.scheduler import Policy, Work

from .builders import deployment, edge_node, gpu_node, job, plan_for


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
    assert too_big.message == "No node can run it: 0/2 nodes fit: 1 not cloud, 1 fewer than 16 GPU."


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
