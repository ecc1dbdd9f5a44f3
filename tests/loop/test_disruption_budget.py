"""A deployment's `min_available` in the loop: a drain goes on once that many replicas
serve elsewhere and says what it waits for until then; a rollout's canary leaves that
many replicas on the deployment's model."""

from __future__ import annotations

import dataclasses

import msgspec

from cloud.fleet.registry import NodeRecord
from cloud.loop.desired import canary_members
from cloud.loop.drain import DrainPlan, plan_drain
from cloud.loop.inputs import build_inputs
from cloud.scheduler import Plan, Policy, schedule
from cloud.store import AllocationRecord, StoreSnapshot, WorkRecord
from cloud.work.convert import spec_of
from cloud.work.specs import CanarySpec, DeploymentSpec
from shared.messages import DeploymentSample, ReportedDeployment, Telemetry

from .builders import allocation, node, work


def serving(record: NodeRecord, *deployment_ids: str) -> NodeRecord:
    """`record` with a telemetry sample saying it serves `deployment_ids`."""
    samples = tuple(
        DeploymentSample(deployment_id=d, requests=10, errors=0, rejected=0, requests_per_s=1.0)
        for d in deployment_ids
    )
    telemetry = Telemetry(
        node_id=record.node_id,
        instance_id="i1",
        seq=1,
        sampled_at=0.0,
        interval_s=1.0,
        cpu_utilization_pct=1.0,
        memory_used_bytes=0,
        memory_total_bytes=1,
        deployments=samples,
    )
    return dataclasses.replace(record, decoded_telemetry=telemetry, telemetry_seq=telemetry.seq)


def deployment(
    replicas: int, min_available: int | None, nodes: tuple[str, ...]
) -> tuple[WorkRecord, DeploymentSpec, tuple[AllocationRecord, ...]]:
    record = work(
        "detector", kind="inference", state="running", replicas=replicas,
        min_available=min_available,
    )  # fmt: skip
    spec = spec_of(record)
    assert isinstance(spec, DeploymentSpec)
    members = tuple(
        allocation("detector", i, node_id, kind="inference") for i, node_id in enumerate(nodes)
    )
    return record, spec, members


def ready_on(node_id: str, members: tuple[AllocationRecord, ...], **fields: object) -> NodeRecord:
    """A node that reports its replicas of `members` ready and serves them."""
    reports = tuple(
        ReportedDeployment(deployment_id=m.work_id, replica=m.member_index, state="ready")
        for m in members
        if m.node_id == node_id
    )
    return serving(node(node_id, deployments=reports, **fields), "detector")  # type: ignore[arg-type]


def drain(
    replicas: int, min_available: int | None, placed_on: tuple[str, ...], serving_on: set[str]
) -> DrainPlan:
    record, spec, members = deployment(replicas, min_available, placed_on)
    nodes = {
        node_id: ready_on(node_id, members) if node_id in serving_on else node(node_id)
        for node_id in {*placed_on, "spare"}
    }
    return plan_drain({"detector": record}, {"detector": members}, {"detector": spec}, nodes, {"a"})


def test_a_drain_waits_while_the_deployment_would_fall_below_min_available() -> None:
    plan = drain(2, 2, ("a", "b"), serving_on={"a", "b"})
    assert plan.releases == []
    assert plan.surge == {"detector": 1}  # a replacement is wanted elsewhere first
    assert plan.waiting == {
        "a": ["waiting: detector would fall below min_available 2 (1 serving elsewhere)"]
    }


def test_a_drain_goes_on_once_min_available_replicas_serve_elsewhere() -> None:
    # The replacement serves on "spare": the replica on "a" is given back.
    plan = drain(2, 2, ("a", "b", "spare"), serving_on={"a", "b", "spare"})
    assert plan.waiting == {}
    (release,) = plan.releases
    assert sorted(a.node_id for a in release.allocations) == ["b", "spare"]


def test_a_budget_below_the_replicas_lets_the_drain_go_on_at_once() -> None:
    # Three replicas, a budget of two, two serve elsewhere: the drain need not wait
    # for a replacement (the queue tops the deployment up afterwards).
    plan = drain(3, 2, ("a", "b", "c"), serving_on={"a", "b", "c"})
    assert plan.waiting == {}
    assert plan.surge == {}
    (release,) = plan.releases
    assert sorted(a.node_id for a in release.allocations) == ["b", "c"]


def test_without_a_budget_the_drain_says_it_waits_for_the_replacements() -> None:
    plan = drain(2, None, ("a", "b"), serving_on={"a", "b"})
    assert plan.releases == []
    assert plan.waiting == {
        "a": [
            "waiting: detector has 1 of 2 replicas serving elsewhere; its replacements start first"
        ]
    }


def test_a_replacement_beside_a_serving_replica_counts_only_once_it_reports_ready() -> None:
    # Replica 1 serves on "b"; the drain's replacement (replica 2) is placed on "b" too.
    # "b" sends serving figures (replica 1's), but replica 2 has not started: the drain
    # waits, and goes on once "b" reports replica 2 ready.
    record = work(
        "detector", kind="inference", state="running", replicas=2, max_replicas_per_node=2
    )
    spec = spec_of(record)
    assert isinstance(spec, DeploymentSpec)
    members = (
        allocation("detector", 0, "a", ("gpu0",), kind="inference"),
        allocation("detector", 1, "b", ("gpu0",), kind="inference"),
        allocation("detector", 2, "b", ("gpu1",), kind="inference"),
    )
    starting = ready_on("b", members[:2])
    nodes = {"a": ready_on("a", members), "b": starting}
    plan = plan_drain({"detector": record}, {"detector": members}, {"detector": spec}, nodes, {"a"})
    assert plan.releases == []
    assert plan.waiting == {
        "a": [
            "waiting: detector has 1 of 2 replicas serving elsewhere; its replacements start first"
        ]
    }
    nodes["b"] = ready_on("b", members)
    plan = plan_drain({"detector": record}, {"detector": members}, {"detector": spec}, nodes, {"a"})
    (release,) = plan.releases
    assert [(a.member_index, a.node_id) for a in release.allocations] == [(1, "b"), (2, "b")]


def test_a_replica_on_an_offline_node_or_reported_by_a_gone_agent_does_not_serve() -> None:
    # The registry keeps an offline node's last report and sample, and a node's report
    # when a new agent instance starts: neither says the replica serves now.
    record, spec, members = deployment(2, None, ("a", "b", "spare"))
    restarted = ready_on("spare", members)
    restarted = dataclasses.replace(
        restarted, status=msgspec.structs.replace(restarted.status, instance_id="i2")
    )
    for spare in (ready_on("spare", members, state="offline"), restarted):
        nodes = {"a": ready_on("a", members), "b": ready_on("b", members), "spare": spare}
        plan = plan_drain(
            {"detector": record}, {"detector": members}, {"detector": spec}, nodes, {"a"}
        )
        assert plan.releases == []
        assert plan.surge == {"detector": 1}


def test_a_canary_leaves_min_available_replicas_on_the_deployments_model() -> None:
    _, spec, members = deployment(4, 3, ("a", "b", "c", "d"))
    canary = CanarySpec(model_id="m2", replicas=3)
    assert canary_members(msgspec.structs.replace(spec, canary=canary), members) == {0}
    no_budget = msgspec.structs.replace(spec, canary=canary, min_available=None)
    assert canary_members(no_budget, members) == {0, 1, 2}
    # A budget of every replica leaves no room for a canary: the rollout waits.
    full = msgspec.structs.replace(spec, canary=canary, min_available=4)
    assert canary_members(full, members) == frozenset()


def tidal_plan(min_available: int) -> Plan:
    """A p1 deployment of 3 replicas on one 4-GPU node, as stored; a p0 training job
    that needs 2 GPUs (1 is free)."""
    deployment = work(
        "detector", kind="inference", state="running", replicas=3, min_available=min_available,
        sites=["cloud"], accepted_kinds=["gpu"], max_replicas_per_node=4,
    )  # fmt: skip
    trainer = dataclasses.replace(
        work("trainer", state="pending", accelerators_per_worker=2), priority="p0"
    )
    replicas = tuple(
        allocation("detector", i, "a", (f"gpu{i}",), kind="inference") for i in range(3)
    )
    store = StoreSnapshot(
        tenants=(), work=(deployment, trainer), allocations=replicas, node_generations={}
    )
    inputs = build_inputs(0.0, [node("a", gpus=4)], store)
    return schedule(inputs.snapshot, Policy())


def test_training_takes_back_gpus_from_inference_only_as_far_as_the_budget_allows() -> None:
    # Tidal sharing through the loop's own conversion of stored work: a budget of 2
    # lets one replica go, a budget of 3 none.
    plan = tidal_plan(2)
    assert [p.work_id for p in plan.preemptions] == ["detector"]
    assert [p.node_id for p in plan.placements_for("trainer")] == ["a"]
    plan = tidal_plan(3)
    assert plan.preemptions == ()
    assert plan.placements_for("trainer") == ()
