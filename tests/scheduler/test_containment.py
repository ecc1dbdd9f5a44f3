"""Training goes only where its workers are contained as it asks (issue 24): the
`isolation`, `runtime` and `sealing` filters, their words in explanations, and work
that no registered node could ever contain."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from cloud.scheduler import Node, Pending
from cloud.scheduler.plan import NeverFits
from cloud.scheduler.unschedulable import never_fits

from .builders import gpu_node, job, nodes_of, plan_for, running, snapshot


def node(node_id: str, **fields: Any) -> Node:
    return replace(gpu_node(node_id, count=8), **fields)


def full(node_id: str) -> Any:
    """Work filling all 8 GPUs of `node_id` that nothing may evict."""
    return running(f"{node_id}-busy", node_id, 8, priority="p0", preemptible=False)


def pending(item: Pending | None) -> Pending:
    assert item is not None
    return item


def test_defaults_ask_for_nothing_and_any_isolating_node_takes_them() -> None:
    plan = plan_for([node("a")], [job("j")])
    assert nodes_of(plan, "j") == ["a"]


def test_a_node_that_cannot_isolate_takes_no_training() -> None:
    nodes = [node("cannot", isolation="unavailable"), node("open")]
    plan = plan_for(nodes, [job("j", 8)], allocations=[full("open")])
    reason = pending(plan.pending_for("j"))
    assert dict(reason.rejections) == {"isolation": 1, "busy": 1}
    assert "0/2 nodes fit: 1 cannot isolate work, 1 GPU busy" in reason.message
    assert nodes_of(plan_for(nodes, [job("k")]), "k") == ["open"]


def test_a_job_goes_only_where_workers_are_isolated_as_it_asks() -> None:
    nodes = [
        node("cannot", isolation="unavailable"),
        node("none"),
        node("user", isolation="user"),
        node("sandbox", isolation="sandbox"),
    ]
    plan = plan_for(nodes, [job("j", 8, isolation="sandbox")], allocations=[full("sandbox")])
    reason = pending(plan.pending_for("j"))
    assert dict(reason.rejections) == {"isolation": 3, "busy": 1}
    assert "0/4 nodes fit: 3 isolate work below sandbox, 1 GPU busy" in reason.message

    placed = plan_for(nodes, [job("u", 8, isolation="user"), job("v", 8, isolation="user")])
    assert sorted(nodes_of(placed, "u") + nodes_of(placed, "v")) == ["sandbox", "user"]


def test_jobs_alike_but_for_their_isolation_are_filtered_apart() -> None:
    """The static filters are cached per job shape: isolation is part of it."""
    plan = plan_for([node("none")], [job("strict", isolation="sandbox"), job("lax")])
    assert nodes_of(plan, "lax") == ["none"]
    assert dict(pending(plan.pending_for("strict")).rejections) == {"isolation": 1}


def test_an_image_needs_a_container_runtime() -> None:
    nodes = [node("bare"), node("podman", runs_containers=True)]
    plan = plan_for(nodes, [job("j", 8, image="ghcr.io/a/b:1")], allocations=[full("podman")])
    reason = pending(plan.pending_for("j"))
    assert dict(reason.rejections) == {"runtime": 1, "busy": 1}
    assert "0/2 nodes fit: 1 no container runtime, 1 GPU busy" in reason.message
    assert nodes_of(plan_for(nodes, [job("k", image="x")]), "k") == ["podman"]
    assert sorted(nodes_of(plan_for(nodes, [job("m", workers=2, gpus=8)]), "m")) == [
        "bare",
        "podman",
    ]


def test_secrets_need_a_node_that_can_receive_them() -> None:
    nodes = [node("keyless"), node("keyed", receives_secrets=True)]
    plan = plan_for(nodes, [job("j", 8, has_secrets=True)], allocations=[full("keyed")])
    reason = pending(plan.pending_for("j"))
    assert dict(reason.rejections) == {"sealing": 1, "busy": 1}
    assert "0/2 nodes fit: 1 cannot receive sealed secrets, 1 GPU busy" in reason.message
    assert nodes_of(plan_for(nodes, [job("k", has_secrets=True)]), "k") == ["keyed"]


def test_a_node_is_counted_under_the_first_filter_that_rejects_it() -> None:
    nodes = [node("nothing", isolation="unavailable"), node("no-runtime", isolation="sandbox")]
    plan = plan_for(nodes, [job("j", isolation="sandbox", image="x", has_secrets=True)])
    assert dict(pending(plan.pending_for("j")).rejections) == {"isolation": 1, "runtime": 1}


@pytest.mark.parametrize(
    ("nodes", "fields", "expected"),
    [
        (
            [node("a"), node("b", isolation="user")],
            {"isolation": "sandbox"},
            NeverFits(
                "isolation",
                "no node at cloud isolates training workers as sandbox; the best isolates as user",
            ),
        ),
        (
            [node("a", isolation="unavailable")],
            {},
            NeverFits(
                "isolation",
                "no node at cloud can isolate training workers (each reports isolation "
                "unavailable; its operator may allow unisolated work with agent.isolation)",
            ),
        ),
        (
            [node("a", isolation="user"), node("b", runs_containers=True)],
            {"isolation": "user", "image": "x"},
            NeverFits(
                "image",
                "no node at cloud that isolates as user has a container runtime (podman or "
                "docker) to run an image",
            ),
        ),
        (
            [node("a", runs_containers=True), node("b", receives_secrets=True)],
            {"image": "x", "has_secrets": True},
            NeverFits(
                "has_secrets",
                "no node at cloud that runs containers can receive sealed secrets (each "
                "isolates as none, where every tenant's workers run as one user who could "
                "read them: a node needs isolation user or sandbox and the sealing key it "
                "enrolled with; a registered cluster needs accepts_secrets)",
            ),
        ),
        (
            [node("a")],
            {"has_secrets": True},
            NeverFits(
                "has_secrets",
                "no node at cloud can receive sealed secrets (each isolates as none, where "
                "every tenant's workers run as one user who could read them: a node needs "
                "isolation user or sandbox and the sealing key it enrolled with; a registered "
                "cluster needs accepts_secrets)",
            ),
        ),
    ],
)
def test_work_no_node_could_ever_contain_names_the_field(
    nodes: list[Node], fields: dict[str, Any], expected: NeverFits
) -> None:
    assert never_fits(snapshot(nodes), job("j", **fields)) == expected


def test_the_size_of_what_can_contain_it_is_judged_among_those_nodes() -> None:
    nodes = [node("big"), replace(gpu_node("small", count=2), isolation="sandbox")]
    never = never_fits(snapshot(nodes), job("j", 4, isolation="sandbox"))
    assert never == NeverFits("accelerators_per_worker", "no node has 4 GPU; the largest has 2")
    assert never_fits(snapshot(nodes), job("k", 4)) is None


def test_a_job_no_node_could_contain_waits_as_unschedulable_saying_why() -> None:
    plan = plan_for([node("a")], [job("j", isolation="user")])
    reason = pending(plan.pending_for("j"))
    assert reason.code == "unschedulable"
    assert reason.message.startswith(
        "No node can run it: no node at cloud isolates training workers as user; the best "
        "isolates as none; 0/1 nodes fit: 1 isolate work below user."
    )
