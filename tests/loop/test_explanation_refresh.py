"""What the loop writes as a work item's reason and explanation: a victim of preemption
keeps "preempted by X (reason)" until it is placed again (the next pass's "Waiting for
capacity" used to overwrite it within a second), and a deployment that gives replicas
back gets a fresh explanation (it used to keep saying "Placed 2 replicas")."""

from __future__ import annotations

import dataclasses

from cloud.loop.inputs import build_inputs
from cloud.loop.plans import translate
from cloud.scheduler import Policy, schedule
from cloud.store import StoreSnapshot
from cloud.work.explain import explanation_for_scaling, explanations_for_plan
from cloud.work.explanation import decode_explanation
from tests.loop.builders import allocation, node, work


def pending_reasons(*records: object) -> dict[str, str]:
    store = StoreSnapshot(tenants=(), work=records, allocations=(), node_generations={})  # type: ignore[arg-type]
    # One node with 4 GPUs: an 8-GPU job waits.
    inputs = build_inputs(0.0, [node("a", gpus=4)], store)
    plan = schedule(inputs.snapshot, Policy())
    return dict(translate(plan, inputs, {}).write.pending_reasons)


def test_a_victim_keeps_preempted_by_as_its_reason_until_placed_again() -> None:
    victim = dataclasses.replace(
        work("victim", state="pending", accelerators_per_worker=8),
        state_reason="preempted by urgent (priority)",
    )
    waiting = dataclasses.replace(
        work("other", state="pending", accelerators_per_worker=8), state_reason="submitted"
    )
    reasons = pending_reasons(victim, waiting)
    assert "victim" not in reasons  # its reason stays "preempted by urgent (priority)"
    assert reasons["other"].startswith("No node can run it")


def test_a_scale_down_replaces_the_explanation_of_the_last_placement() -> None:
    explanation = decode_explanation(explanation_for_scaling(0.0, ["edge-1"]))
    assert explanation.outcome == "placed"
    assert explanation.message == "Scaled to 1 replica: kept on edge-1."
    assert explanation.placements == ()


def test_a_scale_up_says_the_replicas_placed_are_more() -> None:
    deployment = work("dep-1", kind="inference", state="running", replicas=2, sites=["cloud"])
    store = StoreSnapshot(
        tenants=(),
        work=(deployment,),
        allocations=(allocation("dep-1", 0, "a", kind="inference"),),
        node_generations={},
    )
    inputs = build_inputs(0.0, [node("a"), node("b")], store)
    plan = schedule(inputs.snapshot, Policy())
    explained = decode_explanation(explanations_for_plan(plan)["dep-1"])
    assert explained.message.startswith("Placed 1 more replica on ")
