"""A job waiting in a cluster's own queue (review round 6), against the in-memory back-end
of tests/cloud/test_cluster_bridge.py (the real Slurm cluster: tests/integration/
test_review6_slurm_queue.py):

- on a machine that takes no work (drained, down, its partition not up) it would wait
  there for ever: after a grace it is reported `stopped`, saying why, so the loop places
  it elsewhere, and its cluster job is cancelled once its document drops it;
- its GPUs stay claimed (nothing else is placed on them) but are sampled idle: only the
  GPUs of a job the cluster runs are sampled busy, which the energy model bills.
"""

from __future__ import annotations

import dataclasses

import pytest

from cloud.clusters.backend import ClusterJob, ClusterNode
from cloud.clusters.bridge import ClusterBridge, ClusterPlacement
from cloud.fleet.registry import NodeRegistry
from shared.messages import Telemetry
from tests.cloud.test_cluster_bridge import JOB, MemoryCluster, document, reported, training

GRACE_S = 60.0


@pytest.fixture
def cluster() -> MemoryCluster:
    return MemoryCluster()


class Pinless(MemoryCluster):
    """A cluster that picks the machines itself (slurmrestd v0.0.38)."""

    @property
    def pins_machines(self) -> bool | None:
        return False


def bridge_of(
    cluster: MemoryCluster,
    registry: NodeRegistry,
    clock: list[float],
    samples: list[Telemetry] | None = None,
) -> ClusterBridge:
    return ClusterBridge(
        "lab",
        cluster,
        registry,
        ClusterPlacement("DE", "europe-west3"),
        unstartable_grace_s=GRACE_S,
        telemetry_listeners=(samples.append,) if samples is not None else (),
        clock=lambda: clock[0],
    )


def drain(cluster: MemoryCluster, why: str = "idle+drain: maint") -> None:
    cluster.nodes[1] = dataclasses.replace(cluster.nodes[1], unavailable=why)


def resume(cluster: MemoryCluster) -> None:
    cluster.nodes[1] = dataclasses.replace(cluster.nodes[1], unavailable="")


async def test_a_job_waiting_on_a_drained_machine_is_stopped_after_the_grace_and_cancelled(
    cluster: MemoryCluster,
) -> None:
    cluster.jobs_held["7"] = ClusterJob("7", JOB, 1, "pending", reason="ReqNodeNotAvail")
    registry = NodeRegistry(max_nodes=10)
    clock = [1000.0]
    bridge = bridge_of(cluster, registry, clock)
    bridge.accept(document("lab.n2", training()))
    drain(cluster)
    await bridge.step()
    await bridge.step()
    (entry,) = reported(registry, "lab.n2")
    assert entry.state == "starting"  # a moment's state is not believed yet
    clock[0] += GRACE_S - 1
    await bridge.step()
    assert reported(registry, "lab.n2")[0].state == "starting"
    clock[0] += 1
    await bridge.step()
    (entry,) = reported(registry, "lab.n2")
    assert entry.state == "stopped"
    assert entry.reason == (
        "machine n2 of cluster lab takes no work (idle+drain: maint): the job waiting in its "
        "queue cannot start there"
    )
    assert entry.finished_at == clock[0]
    # Given up for good: the machine back, the report does not go backwards.
    resume(cluster)
    clock[0] += 5
    await bridge.step()
    assert reported(registry, "lab.n2")[0].state == "stopped"
    assert cluster.cancelled == []
    # The loop requeued it elsewhere: its document no longer names it, and the cluster
    # job goes with it.
    bridge.accept(document("lab.n2", generation=2))
    await bridge.step()
    assert cluster.cancelled == ["7"]


async def test_a_machine_back_within_the_grace_keeps_its_waiting_job(
    cluster: MemoryCluster,
) -> None:
    cluster.jobs_held["7"] = ClusterJob("7", JOB, 1, "pending", reason="Resources")
    registry = NodeRegistry(max_nodes=10)
    clock = [1000.0]
    bridge = bridge_of(cluster, registry, clock)
    bridge.accept(document("lab.n2", training()))
    drain(cluster, "down*")
    await bridge.step()
    clock[0] += GRACE_S - 10
    await bridge.step()
    resume(cluster)  # slurmd registered again
    clock[0] += 5
    await bridge.step()
    drain(cluster, "down*")  # and again: the grace starts over
    clock[0] += 20
    await bridge.step()
    clock[0] += GRACE_S - 1
    await bridge.step()
    (entry,) = reported(registry, "lab.n2")
    assert entry.state == "starting"
    assert entry.reason == "waiting in cluster lab's queue (3 jobs pending there): Resources"
    assert cluster.cancelled == []


async def test_a_running_job_on_a_drained_machine_runs_on(cluster: MemoryCluster) -> None:
    # Draining a machine lets what runs there finish: only a waiting job is given up.
    cluster.jobs_held["7"] = ClusterJob("7", JOB, 1, "running", nodes=("n2",))
    registry = NodeRegistry(max_nodes=10)
    clock = [1000.0]
    bridge = bridge_of(cluster, registry, clock)
    bridge.accept(document("lab.n2", training()))
    drain(cluster)
    await bridge.step()
    clock[0] += 10 * GRACE_S
    await bridge.step()
    assert reported(registry, "lab.n2")[0].state == "running"


async def test_a_cluster_that_picks_machines_itself_is_not_judged_by_the_one_chosen() -> None:
    cluster = Pinless()
    cluster.jobs_held["7"] = ClusterJob("7", JOB, 1, "pending", reason="Resources")
    registry = NodeRegistry(max_nodes=10)
    clock = [1000.0]
    bridge = bridge_of(cluster, registry, clock)
    bridge.accept(document("lab.n2", training()))
    drain(cluster)
    await bridge.step()
    clock[0] += 10 * GRACE_S
    await bridge.step()
    assert reported(registry, "lab.n2")[0].state == "starting"


async def test_a_waiting_jobs_gpus_are_claimed_but_idle_until_the_cluster_runs_it(
    cluster: MemoryCluster,
) -> None:
    samples: list[Telemetry] = []
    registry = NodeRegistry(max_nodes=10)
    clock = [1000.0]
    bridge = bridge_of(cluster, registry, clock, samples)
    gpus = ("gpu0", "gpu1", "gpu2", "gpu3")
    bridge.accept(document("lab.n2", training(ids=gpus)))
    cluster.jobs_held["7"] = ClusterJob("7", JOB, 1, "pending", reason="Resources")

    def utilization() -> dict[str, float]:
        latest = [s for s in samples if s.node_id == "lab.n2"][-1]
        return {a.id: a.utilization_pct for a in latest.accelerators}

    def busy() -> list[str]:
        record = registry.get("lab.n2")
        assert record is not None
        return [a.id for a in record.status.accelerators if not a.healthy]

    await bridge.step()
    assert utilization() == dict.fromkeys(gpus, 0.0)  # waiting: not billed at full power
    assert busy() == []
    # Slurm starts it on those GPUs: they are the job's, busy, and not others'.
    cluster.jobs_held["7"] = ClusterJob("7", JOB, 1, "running", nodes=("n2",))
    cluster.nodes[1] = ClusterNode("n2", ("gpu",), 8, 64 << 30, {"a100": 4}, {"a100": 4})
    await bridge.step()
    assert utilization() == dict.fromkeys(gpus, 100.0)
    assert busy() == []
