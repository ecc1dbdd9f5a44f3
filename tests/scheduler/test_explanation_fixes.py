"""Explanations that used to mislead: each case as it read before, and as it reads now.

- the preemptor's explanation said `preemptions: []`: it lists its victims;
- work only cordoned or draining nodes could run read "No node can run it", which
  sounds permanent: it waits for them, code `cordoned`;
- members kept apart by their own anti-affinity on a fleet with too few nodes read
  "Waiting for capacity": unschedulable, naming `anti_affinity_groups`.
"""

from __future__ import annotations

from cloud.scheduler import Pending, Plan, Taint
from cloud.scheduler.unschedulable import never_fits
from cloud.work.explain import explanations_for_plan
from cloud.work.explanation import decode_explanation
from shared.taints import CORDON_TAINT_KEY

from .builders import gpu_node, job, nodes_of, plan_for, running, snapshot

CORDON = Taint(key=CORDON_TAINT_KEY)


def pending(plan: Plan, work_id: str) -> Pending:
    (found,) = [p for p in plan.pending if p.work_id == work_id]
    return found


def test_the_preemptor_lists_its_victims() -> None:
    plan = plan_for(
        [gpu_node("n0", 4)],
        [job("urgent", 4, priority="p0")],
        # The same tenant's: across tenants neither side is named by its id
        # (tests/api/test_preemption_tenancy.py).
        [running("batch-0", "n0", 4, work_id="batch", priority="p2", tenant="team-a")],
    )
    assert nodes_of(plan, "urgent") == ["n0"]
    documents = explanations_for_plan(plan)
    urgent = decode_explanation(documents["urgent"])
    assert urgent.outcome == "placed"
    [victim] = urgent.preemptions
    assert (victim.work_id, victim.node_id, victim.reason, victim.preempted_by) == (
        "batch",
        "n0",
        "priority",
        "urgent",
    )
    assert urgent.message.endswith("It preempted batch on n0 (priority).")
    # The victim's own explanation says who took its place, as before.
    batch = decode_explanation(documents["batch"])
    assert batch.outcome == "preempted"
    assert [(p.preempted_by, p.work_id) for p in batch.preemptions] == [("urgent", None)]


def test_work_only_cordoned_nodes_could_run_waits_for_them() -> None:
    nodes = [gpu_node("big", 8, taints=(CORDON,)), gpu_node("small", 2)]
    plan = plan_for(nodes, [job("wide", 8)])
    waiting = pending(plan, "wide")
    assert waiting.code == "cordoned"
    assert waiting.message.startswith("Waiting for 1 cordoned or draining node: ")
    assert "No node can run it" not in waiting.message


def test_a_cordoned_node_with_another_untolerated_taint_does_not_count() -> None:
    dedicated = Taint(key="dedicated", value="risk")
    nodes = [gpu_node("big", 8, taints=(CORDON, dedicated)), gpu_node("small", 2)]
    plan = plan_for(nodes, [job("wide", 8)])
    waiting = pending(plan, "wide")
    assert waiting.code == "unschedulable"
    assert waiting.message.startswith("No node can run it")


def test_members_kept_apart_on_too_few_nodes_are_unschedulable_naming_the_constraint() -> None:
    apart = job("spread", 1, workers=3, group="g", anti_affinity_groups=("g",))
    nodes = [gpu_node("n0"), gpu_node("n1")]
    plan = plan_for(nodes, [apart])
    waiting = pending(plan, "spread")
    assert waiting.code == "unschedulable"
    assert waiting.never_fits is not None
    assert waiting.never_fits.field == "anti_affinity_groups"
    assert "Waiting for capacity" not in waiting.message
    assert "must each run on a node of their own" in waiting.message
    # On three nodes it runs, one worker on each.
    three = plan_for([*nodes, gpu_node("n2")], [apart])
    assert sorted(nodes_of(three, "spread")) == ["n0", "n1", "n2"]
    assert never_fits(snapshot([*nodes, gpu_node("n2")]), apart) is None
