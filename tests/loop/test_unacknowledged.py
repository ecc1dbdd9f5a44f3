"""Allocations a node never acknowledges: republished after the timeout, requeued after
twice it; acknowledged, offline or unheard-while-disconnected ones are left alone."""

from __future__ import annotations

import dataclasses

import msgspec

from cloud.loop.unacknowledged import AssignmentWatch
from shared.messages import ReportedDeployment, ReportedTraining
from tests.loop.builders import allocation, node, work


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def watch(clock: Clock) -> AssignmentWatch:
    return AssignmentWatch(timeout_s=10.0, monotonic=clock)


def test_a_silent_node_gets_its_document_again_then_loses_the_work() -> None:
    clock = Clock()
    watcher = watch(clock)
    records = {"j1": work("j1")}
    allocations = {"j1": (allocation("j1", 0, "a"), allocation("j1", 1, "b"))}
    nodes = {
        "a": node("a"),
        "b": node("b", training=(ReportedTraining(job_id="j1", attempt=1, state="running"),)),
    }
    first = watcher.check(records, allocations, nodes, listening=True)
    assert not first.republish
    assert not first.changes_work
    clock.now_s += 10.0
    second = watcher.check(records, allocations, nodes, listening=True)
    assert second.republish == {"a"}
    assert not second.changes_work
    clock.now_s += 5.0
    third = watcher.check(records, allocations, nodes, listening=True)
    assert not third.republish  # once per clock, not every pass
    clock.now_s += 5.0
    fourth = watcher.check(records, allocations, nodes, listening=True)
    assert [e.work_id for e in fourth.evictions] == ["j1"]  # the gang goes back whole
    assert "node a did not acknowledge" in fourth.evictions[0].reason
    assert fourth.evictions[0].expected_version == records["j1"].version


def test_an_acknowledgement_of_another_attempt_does_not_count() -> None:
    clock = Clock()
    watcher = watch(clock)
    records = {"j1": work("j1", attempts=2)}
    allocations = {"j1": (allocation("j1", 0, "a"),)}
    old = ReportedTraining(job_id="j1", attempt=1, state="failed")
    nodes = {"a": node("a", training=(old,))}
    watcher.check(records, allocations, nodes, listening=True)
    clock.now_s += 20.0
    assert watcher.check(records, allocations, nodes, listening=True).evictions


def test_acknowledged_work_and_offline_nodes_are_never_judged() -> None:
    clock = Clock()
    watcher = watch(clock)
    records = {"j1": work("j1"), "j2": work("j2")}
    allocations = {"j1": (allocation("j1", 0, "a"),), "j2": (allocation("j2", 0, "gone"),)}
    starting = ReportedTraining(job_id="j1", attempt=1, state="starting")
    nodes = {"a": node("a", training=(starting,)), "gone": node("gone", state="offline")}
    for _ in range(5):
        verdict = watcher.check(records, allocations, nodes, listening=True)
        assert not verdict.republish
        assert not verdict.changes_work
        clock.now_s += 10.0


def test_time_off_the_broker_does_not_count_and_restarts_the_clocks() -> None:
    clock = Clock()
    watcher = watch(clock)
    records = {"j1": work("j1")}
    allocations = {"j1": (allocation("j1", 0, "a"),)}
    nodes = {"a": node("a")}
    watcher.check(records, allocations, nodes, listening=True)
    clock.now_s += 15.0
    assert not watcher.check(records, allocations, nodes, listening=False).republish
    clock.now_s += 100.0
    after = watcher.check(records, allocations, nodes, listening=True)
    assert not after.republish
    assert not after.changes_work
    clock.now_s += 10.0
    assert watcher.check(records, allocations, nodes, listening=True).republish == {"a"}


def test_a_deployment_keeps_its_acknowledged_replicas() -> None:
    clock = Clock()
    watcher = watch(clock)
    records = {"d1": work("d1", kind="inference")}
    allocations = {
        "d1": (
            allocation("d1", 0, "a", kind="inference"),
            allocation("d1", 1, "b", kind="inference"),
        )
    }
    ready = ReportedDeployment(deployment_id="d1", replica=1, state="ready")
    nodes = {"a": node("a"), "b": node("b", deployments=(ready,))}
    watcher.check(records, allocations, nodes, listening=True)
    clock.now_s += 20.0
    verdict = watcher.check(records, allocations, nodes, listening=True)
    assert not verdict.evictions
    [placement] = verdict.placements
    assert [a.node_id for a in placement.allocations] == ["b"]


def test_work_settled_by_its_reports_is_left_alone() -> None:
    clock = Clock()
    watcher = watch(clock)
    records = {"j1": work("j1")}
    allocations = {"j1": (allocation("j1", 0, "a"),)}
    nodes = {"a": node("a")}
    watcher.check(records, allocations, nodes, listening=True)
    clock.now_s += 30.0
    verdict = watcher.check(records, allocations, nodes, listening=True, settled={"j1"})
    assert not verdict.changes_work
    assert not verdict.republish


def test_a_report_left_by_the_previous_agent_is_no_acknowledgement() -> None:
    clock = Clock()
    watcher = watch(clock)
    records = {"j1": work("j1")}
    allocations = {"j1": (allocation("j1", 0, "a"),)}
    running = ReportedTraining(job_id="j1", attempt=1, state="running")
    restarted = node("a", training=(running,))
    restarted = dataclasses.replace(
        restarted, status=msgspec.structs.replace(restarted.status, instance_id="i2")
    )
    watcher.check(records, allocations, {"a": restarted}, listening=True)
    clock.now_s += 20.0
    assert watcher.check(records, allocations, {"a": restarted}, listening=True).evictions
