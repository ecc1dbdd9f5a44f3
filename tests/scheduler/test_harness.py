"""The simulated-time harness: fake clock, start, finish, fail, node loss, preemption."""

from __future__ import annotations

import pytest

from cloud.scheduler import Node
from cloud.scheduler.harness import FakeClock, SimulatedCluster

from .builders import NOW, deployment, edge_node, gpu_node, job


def test_fake_clock_only_moves_forward() -> None:
    clock = FakeClock(10.0)
    assert clock.advance(5) == 15.0
    with pytest.raises(ValueError, match="backwards"):
        clock.advance(-1)
    with pytest.raises(ValueError, match="backwards"):
        clock.set(1.0)


def test_work_starts_runs_and_finishes() -> None:
    sim = SimulatedCluster([gpu_node("n0", speed=2.0)], clock=FakeClock(NOW))
    sim.submit(job("j", 8, duration_s=3600))
    sim.schedule()
    assert "j" in sim.first_started
    assert not sim.queue
    sim.advance(1799)
    assert "j" not in sim.finished
    sim.advance(1)
    assert sim.finished["j"] == NOW + 1800  # twice as fast as the reference
    assert not sim.running
    assert [e.kind for e in sim.events] == ["submitted", "started", "finished"]


def test_failed_work_is_retried() -> None:
    sim = SimulatedCluster([gpu_node("n0")], clock=FakeClock(NOW))
    sim.submit(job("j", 4, workers=2))
    sim.schedule()
    assert len(sim.running) == 2
    sim.fail("j")
    assert not sim.running
    assert "j" in sim.queue
    sim.schedule()
    assert len(sim.running) == 2


def test_node_loss_moves_work_elsewhere() -> None:
    sim = SimulatedCluster([edge_node("e0"), edge_node("e1")], clock=FakeClock(NOW))
    sim.submit(deployment("d", replicas=2, kinds=("npu",)))
    sim.schedule()
    assert {a.node_id for a in sim.running.values()} == {"e0", "e1"}
    sim.lose_node("e0")
    assert [a.node_id for a in sim.running.values()] == ["e1"]
    assert sim.queue["d"].replicas == 1  # type: ignore[union-attr]
    plan = sim.schedule()
    # The only other NPU node already holds a replica: the lost one waits, explained.
    pending = plan.pending_for("d")
    assert pending is not None
    assert pending.rejections == {"health": 1, "replica-limit": 1}
    sim.restore_node("e0")
    sim.schedule()
    assert {a.node_id for a in sim.running.values()} == {"e0", "e1"}


def test_preempted_work_goes_back_to_the_queue() -> None:
    sim = SimulatedCluster([gpu_node("n0")], clock=FakeClock(NOW))
    sim.submit(job("low", 8, priority="p2"))
    sim.schedule()
    sim.advance(60)
    sim.submit(job("high", 8, priority="p0"))
    plan = sim.schedule()
    assert [p.allocation_id for p in plan.preemptions] == ["low/0"]
    assert "low" in sim.queue
    assert {a.work_id for a in sim.running.values()} == {"high"}
    assert [e.kind for e in sim.events if e.work_id == "low"][-1] == "preempted"


def test_rest_of_a_partial_deployment_stays_queued() -> None:
    sim = SimulatedCluster([edge_node("e0")], clock=FakeClock(NOW))
    sim.submit(deployment("d", replicas=3, min_replicas=1, kinds=("npu",)))
    plan = sim.schedule()
    assert len(plan.placements) == 1
    assert sim.queue["d"].replicas == 2  # type: ignore[union-attr]
    sim.add_node(edge_node("e1"))
    sim.schedule()
    assert sorted(a.node_id for a in sim.running.values()) == ["e0", "e1"]
    assert sim.queue["d"].replicas == 1  # type: ignore[union-attr]


def test_a_replica_evicted_while_its_deployment_places_the_rest_stays_queued() -> None:
    # Pass 1: one of two replicas runs (one GPU node). Pass 2: a p0 job evicts it from
    # n1 while the new node n0 takes the queued replica: the evicted one is queued
    # again, not dropped with the entry the placed replica came from.
    def node(node_id: str, pool: str) -> Node:
        return gpu_node(node_id, 1, labels={"pool": pool})

    sim = SimulatedCluster([node("n1", "b")], clock=FakeClock(NOW))
    sim.submit(
        deployment(
            "serve", replicas=2, min_replicas=1, priority="p2", kinds=("gpu",), sites=("cloud",)
        )
    )
    sim.schedule()
    sim.add_node(node("n0", "a"))
    sim.submit(job("train", 1, priority="p0", node_selector={"pool": "b"}, duration_s=3600))
    plan = sim.schedule()
    assert [(p.work_id, p.node_id) for p in plan.preemptions] == [("serve", "n1")]
    assert sim.queue["serve"].replicas == 1  # type: ignore[union-attr]
    sim.advance(3600)  # the job ends and frees n1
    sim.schedule()
    serving = sorted(a.node_id for a in sim.running.values() if a.work_id == "serve")
    assert serving == ["n0", "n1"]
    assert "serve" not in sim.queue


def test_running_replicas_keep_their_deployments_disruption_budget() -> None:
    sim = SimulatedCluster([gpu_node("n0", 1), gpu_node("n1", 1)], clock=FakeClock(NOW))
    sim.submit(
        deployment(
            "serve", replicas=2, min_available=2, priority="p2", kinds=("gpu",), sites=("cloud",)
        )
    )
    sim.schedule()
    assert [a.min_available for a in sim.running.values()] == [2, 2]
    sim.submit(job("train", 1, priority="p0"))
    plan = sim.schedule()
    assert plan.preemptions == ()
    pending = plan.pending_for("train")
    assert pending is not None
    assert pending.code in ("capacity", "reserved")
