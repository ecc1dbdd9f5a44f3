"""The cluster bridge (cloud/clusters/bridge.py) against an in-memory back-end: the seam
a real cluster plugs into (the real one runs in tests/integration/test_slurm_backend.py).
What it must never do: submit or cancel while the cluster does not answer, cancel what
a restarted control plane has not yet handed documents for, run a gang before every
member's document came, place work on GPUs the cluster gave to others or on types it
cannot name."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from cloud.clusters.backend import (
    ClusterBackend,
    ClusterCapacity,
    ClusterJob,
    ClusterNode,
    ClusterRefused,
    ClusterUnreachable,
    GangRequest,
)
from cloud.clusters.bridge import OTHER_WORK, UNREACHABLE_TAINT, ClusterBridge, ClusterPlacement
from cloud.fleet.registry import NodeRegistry
from shared.messages import DesiredState, DesiredTraining, ReportedTraining, Telemetry

JOB = "01M8XES6JQ9S91MCASPSBYBS71"


class MemoryCluster(ClusterBackend):
    def __init__(self) -> None:
        self.nodes = [
            ClusterNode("n1", ("gpu",), 8, 64 << 30, {"a100": 4, "mystery": 2}, {"a100": 1}),
            ClusterNode("n2", ("gpu",), 8, 64 << 30, {"a100": 4}, {}),
        ]
        self.jobs_held: dict[str, ClusterJob] = {}
        self.submitted: list[GangRequest] = []
        self.cancelled: list[str] = []
        self.reachable = True
        self.refuse = ""
        self._ids = itertools.count(1)

    def _check(self) -> None:
        if not self.reachable:
            raise ClusterUnreachable("slurmctld does not answer")

    async def capacity(self) -> ClusterCapacity:
        self._check()
        return ClusterCapacity(nodes=tuple(self.nodes), pending_jobs=3)

    async def jobs(self, *, include_ended: bool = True) -> tuple[ClusterJob, ...]:
        self._check()
        return tuple(self.jobs_held.values())

    async def submit(self, gang: GangRequest) -> str:
        self._check()
        if self.refuse:
            raise ClusterRefused(self.refuse)
        backend_id = str(next(self._ids))
        self.submitted.append(gang)
        self.jobs_held[backend_id] = ClusterJob(
            backend_id,
            gang.job_id,
            gang.attempt,
            "running",
            nodes=tuple(m.node for m in gang.members),
        )
        return backend_id

    async def cancel(self, job: ClusterJob) -> None:
        self._check()
        self.cancelled.append(job.backend_id)
        self.jobs_held.pop(job.backend_id, None)

    async def read_output(self, job: ClusterJob, offset: int, limit: int) -> bytes:
        return b""


def document(node_id: str, *entries: DesiredTraining, generation: int = 1) -> DesiredState:
    return DesiredState(
        node_id=node_id, generation=generation, issued_at=1.0, cluster_id="c1", training=entries
    )


def training(
    node_rank: int = 0, nodes: int = 1, ids: tuple[str, ...] = ("gpu1",)
) -> DesiredTraining:
    return DesiredTraining(
        job_id=JOB, attempt=1, command=("true",), accelerator_ids=ids, node_rank=node_rank,
        nodes=nodes, world_size=nodes,
    )  # fmt: skip


@pytest.fixture
def cluster() -> MemoryCluster:
    return MemoryCluster()


def bridge_of(
    cluster: MemoryCluster, registry: NodeRegistry, passes: list[int] | None = None
) -> ClusterBridge:
    return ClusterBridge(
        "lab",
        cluster,
        registry,
        ClusterPlacement("DE", "europe-west3"),
        loop_passes=(lambda: passes[0]) if passes is not None else None,
    )


def reported(registry: NodeRegistry, node_id: str) -> tuple[ReportedTraining, ...]:
    record = registry.get(node_id)
    assert record is not None
    assert record.reported is not None
    return record.reported.training


async def test_machines_become_nodes_without_what_others_hold_or_what_has_no_model(
    cluster: MemoryCluster,
) -> None:
    registry = NodeRegistry(max_nodes=10)
    bridge = bridge_of(cluster, registry)
    await bridge.step()
    record = registry.get("lab.n1")
    assert record is not None
    assert record.state == "online"
    gpus = [a for a in record.status.accelerators if a.kind == "gpu"]
    assert [a.model for a in gpus] == ["NVIDIA A100-SXM4-80GB"] * 4  # "mystery" left out
    assert [a.health for a in gpus if not a.healthy] == [OTHER_WORK]  # Slurm gave one away
    assert bridge.health.unknown_accelerator_types == {"mystery": 2}
    assert bridge.health.accelerators == {"NVIDIA A100-SXM4-80GB": 8}
    assert (bridge.health.pending_jobs, bridge.health.nodes) == (3, 2)


async def test_a_gang_waits_for_every_members_document_and_runs_as_one_job(
    cluster: MemoryCluster,
) -> None:
    registry = NodeRegistry(max_nodes=10)
    bridge = bridge_of(cluster, registry)
    await bridge.step()
    bridge.accept(document("lab.n1", training(0, 2)))
    await bridge.step()
    assert cluster.submitted == []  # n2's part has not come
    bridge.accept(document("lab.n2", training(1, 2)))
    await bridge.step()
    (gang,) = cluster.submitted
    assert [m.node for m in gang.members] == ["n1", "n2"]
    assert gang.accelerator_type == "a100"
    # Submitted: starting (waiting in the cluster's queue) until the cluster says more.
    assert [entry.state for entry in reported(registry, "lab.n2")] == ["starting"]
    await bridge.step()
    assert [entry.state for entry in reported(registry, "lab.n2")] == ["running"]
    assert len(cluster.submitted) == 1  # adopted, never submitted again


async def test_nothing_is_submitted_or_cancelled_while_the_cluster_does_not_answer(
    cluster: MemoryCluster,
) -> None:
    registry = NodeRegistry(max_nodes=10)
    bridge = bridge_of(cluster, registry)
    await bridge.step()
    bridge.accept(document("lab.n1", training()))
    await bridge.step()
    assert len(cluster.submitted) == 1
    cluster.reachable = False
    bridge.accept(document("lab.n1", generation=2))  # the job is no longer wanted
    await bridge.step()
    assert cluster.cancelled == []
    assert not bridge.health.reachable
    assert "does not answer" in bridge.health.last_error
    record = registry.get("lab.n1")
    assert record is not None
    assert record.state == "online"  # its work runs on: not lost, not rescheduled
    assert [t.key for t in record.status.taints] == [UNREACHABLE_TAINT]
    cluster.reachable = True
    await bridge.step()
    assert cluster.cancelled == ["1"]
    record = registry.get("lab.n1")
    assert record is not None
    assert record.status.taints == ()


async def test_a_restarted_control_plane_cancels_nothing_before_a_whole_pass(
    cluster: MemoryCluster,
) -> None:
    cluster.jobs_held["7"] = ClusterJob("7", JOB, 1, "running", nodes=("n1",))
    passes = [10]
    registry = NodeRegistry(max_nodes=10)
    bridge = bridge_of(cluster, registry, passes)
    await bridge.step()
    passes[0] = 11  # a pass that may have begun before the bridge ended
    await bridge.step()
    assert cluster.cancelled == []
    bridge.accept(document("lab.n1", training()))
    passes[0] = 12
    await bridge.step()
    assert (cluster.cancelled, cluster.submitted) == ([], [])  # adopted
    assert [entry.state for entry in reported(registry, "lab.n1")] == ["running"]
    bridge.accept(document("lab.n1", generation=2))
    await bridge.step()
    assert cluster.cancelled == ["7"]


async def test_a_refused_or_vanished_job_fails_saying_why(cluster: MemoryCluster) -> None:
    registry = NodeRegistry(max_nodes=10)
    bridge = bridge_of(cluster, registry)
    await bridge.step()
    cluster.refuse = "Invalid qos specification"
    bridge.accept(document("lab.n1", training()))
    await bridge.step()
    (entry,) = reported(registry, "lab.n1")
    assert entry.state == "failed"
    assert "refused the job: Invalid qos specification" in entry.reason

    cluster.refuse = ""
    other = DesiredTraining(job_id=JOB, attempt=2, command=("true",), accelerator_ids=("gpu1",))
    bridge.accept(document("lab.n2", other, generation=2))
    await bridge.step()
    cluster.jobs_held.clear()  # deleted on the cluster, no trace left
    await bridge.step()
    await bridge.step()
    (entry,) = reported(registry, "lab.n2")
    assert entry.state == "failed"
    assert "disappeared from cluster lab" in entry.reason


async def test_an_asked_power_cap_is_said_not_to_apply(cluster: MemoryCluster) -> None:
    registry = NodeRegistry(max_nodes=10)
    bridge = bridge_of(cluster, registry)
    await bridge.step()
    capped = DesiredTraining(
        job_id=JOB, attempt=1, command=("true",), accelerator_ids=("gpu1",), power_limit_w=250.0
    )
    bridge.accept(document("lab.n2", capped))
    await bridge.step()
    await bridge.step()
    (entry,) = reported(registry, "lab.n2")
    assert entry.power_limit_w is None
    assert "does not cap GPU power" in entry.power_limit_note


async def test_a_job_waiting_in_the_clusters_queue_says_why_and_how_busy_it_is(
    cluster: MemoryCluster,
) -> None:
    cluster.jobs_held["9"] = ClusterJob("9", JOB, 1, "pending", reason="Resources")
    registry = NodeRegistry(max_nodes=10)
    bridge = bridge_of(cluster, registry)
    bridge.accept(document("lab.n1", training()))  # before the bridge's first step
    await bridge.step()
    await bridge.step()
    (entry,) = reported(registry, "lab.n1")
    assert entry.state == "starting"
    assert entry.reason == "waiting in cluster lab's queue (3 jobs pending there): Resources"
    assert cluster.submitted == []  # it is there already


async def test_a_machine_gone_from_the_listing_keeps_its_running_job(
    cluster: MemoryCluster,
) -> None:
    registry = NodeRegistry(max_nodes=10)
    bridge = bridge_of(cluster, registry)
    await bridge.step()
    bridge.accept(document("lab.n2", training()))
    await bridge.step()
    assert len(cluster.submitted) == 1
    cluster.nodes = cluster.nodes[:1]  # taken out of the partition, say: its job runs on
    await bridge.step()
    await bridge.step()
    assert cluster.cancelled == []
    assert len(cluster.submitted) == 1


async def test_a_restarted_bridge_does_not_take_its_own_jobs_gpus_for_others(
    cluster: MemoryCluster,
) -> None:
    # greenfed's job holds all of n2's GPUs; the control plane restarted: until the loop
    # has handed every document over, which allocated GPUs are greenfed's is not known,
    # and calling them busy would make the loop requeue its own running work.
    cluster.nodes[1] = ClusterNode("n2", ("gpu",), 8, 64 << 30, {"a100": 4}, {"a100": 4})
    cluster.jobs_held["7"] = ClusterJob("7", JOB, 1, "running", nodes=("n2",))
    passes = [10]
    registry = NodeRegistry(max_nodes=10)
    bridge = bridge_of(cluster, registry, passes)
    await bridge.step()

    def busy(node_id: str) -> list[str]:
        record = registry.get(node_id)
        assert record is not None
        return [a.id for a in record.status.accelerators if not a.healthy]

    assert busy("lab.n2") == []
    assert busy("lab.n1") == ["gpu0"]  # no job of greenfed's there: Slurm's say stands
    bridge.accept(document("lab.n2", training(ids=("gpu0", "gpu1"))))
    passes[0] = 12
    await bridge.step()
    # Every document known: the two GPUs greenfed's job does not hold are others'.
    assert busy("lab.n2") == ["gpu2", "gpu3"]
    assert [entry.state for entry in reported(registry, "lab.n2")] == ["running"]


async def test_a_job_the_cluster_placed_elsewhere_says_where_it_runs(
    cluster: MemoryCluster,
) -> None:
    # slurmrestd v0.0.38 cannot name machines: Slurm picks them within the partition.
    cluster.jobs_held["5"] = ClusterJob("5", JOB, 1, "running", nodes=("n1",))
    registry = NodeRegistry(max_nodes=10)
    bridge = bridge_of(cluster, registry)
    bridge.accept(document("lab.n2", training()))
    await bridge.step()
    await bridge.step()
    (entry,) = reported(registry, "lab.n2")
    assert entry.state == "running"
    assert entry.reason == "cluster lab runs it on n1, not on n2 as greenfed chose"


async def test_energy_the_cluster_measured_reaches_the_jobs_gpus_as_counters(
    cluster: MemoryCluster,
) -> None:
    # Slurm measures a job, not its GPUs: each reading's increase is shared evenly over
    # the GPUs the job holds, whose samples carry it as a cumulative counter (what
    # cloud/usage/meter.py counts as measured energy, as an agent's NVML counters).
    samples: list[Telemetry] = []
    registry = NodeRegistry(max_nodes=10)
    bridge = ClusterBridge(
        "lab",
        cluster,
        registry,
        ClusterPlacement("DE", "europe-west3"),
        telemetry_listeners=(samples.append,),
    )
    bridge.accept(document("lab.n2", training(ids=("gpu0", "gpu1"))))
    cluster.jobs_held["5"] = ClusterJob("5", JOB, 1, "running", nodes=("n2",))
    await bridge.step()

    def counters() -> dict[str, float | None]:
        latest = [s for s in samples if s.node_id == "lab.n2"][-1]
        return {a.id: a.energy_j for a in latest.accelerators}

    assert set(counters().values()) == {None}  # nothing measured: the model meters it
    cluster.jobs_held["5"] = dataclasses.replace(cluster.jobs_held["5"], consumed_energy_j=5000.0)
    await bridge.step()
    # The first reading starts the counters; what came before it was modelled.
    assert counters() == {"gpu0": 0.0, "gpu1": 0.0, "gpu2": None, "gpu3": None}
    cluster.jobs_held["5"] = dataclasses.replace(cluster.jobs_held["5"], consumed_energy_j=9000.0)
    await bridge.step()
    assert counters() == {"gpu0": 2000.0, "gpu1": 2000.0, "gpu2": None, "gpu3": None}
    await bridge.step()  # the same reading again: nothing more
    assert counters()["gpu0"] == 2000.0


async def test_a_job_that_just_ended_does_not_leave_its_gpus_to_others(
    cluster: MemoryCluster,
) -> None:
    # The node listing is read before the job listing: the job has failed, but its GPU
    # still shows allocated (Slurm completes it first). That GPU is the job's, not the
    # cluster's other work: called busy, the loop would take the job's own end for a
    # failed GPU and run it again.
    registry = NodeRegistry(max_nodes=10)
    clock = [1000.0]
    bridge = ClusterBridge(
        "lab", cluster, registry, ClusterPlacement("DE", "europe-west3"), clock=lambda: clock[0]
    )
    bridge.accept(document("lab.n2", training(ids=("gpu0",))))
    await bridge.step()  # the nodes announced
    await bridge.step()  # the job submitted
    (backend_id,) = cluster.jobs_held
    cluster.jobs_held[backend_id] = dataclasses.replace(
        cluster.jobs_held[backend_id], state="failed", exit_code=3, finished_at=clock[0]
    )
    cluster.nodes[1] = ClusterNode("n2", ("gpu",), 8, 64 << 30, {"a100": 4}, {"a100": 1})
    await bridge.step()

    def busy() -> list[str]:
        record = registry.get("lab.n2")
        assert record is not None
        return [a.id for a in record.status.accelerators if not a.healthy]

    assert busy() == []
    assert [entry.state for entry in reported(registry, "lab.n2")] == ["failed"]
    # Long after, an allocation there is the cluster's own again.
    clock[0] += 60.0
    await bridge.step()
    assert busy() == ["gpu0"]  # the job long over: it holds nothing there


class Claims:
    """The store's record of submitted attempts (`claim_cluster_submission`), in memory."""

    def __init__(self) -> None:
        self.claimed: set[tuple[str, int]] = set()
        self.away = False

    async def claim(self, job_id: str, attempt: int) -> bool:
        if self.away:
            raise ConnectionError("the store does not answer")
        if (job_id, attempt) in self.claimed:
            return False
        self.claimed.add((job_id, attempt))
        return True


def claiming_bridge_of(
    cluster: MemoryCluster, registry: NodeRegistry, claims: Claims
) -> ClusterBridge:
    return ClusterBridge(
        "lab",
        cluster,
        registry,
        ClusterPlacement("DE", "europe-west3"),
        claim_submission=claims.claim,
    )


async def test_an_attempt_submitted_before_a_restart_is_never_submitted_again(
    cluster: MemoryCluster,
) -> None:
    claims = Claims()
    bridge = claiming_bridge_of(cluster, NodeRegistry(max_nodes=10), claims)
    bridge.accept(document("lab.n1", training()))
    await bridge.step()
    await bridge.step()
    assert len(cluster.submitted) == 1
    # The control plane restarts; meanwhile the job ended and the cluster, keeping no
    # history, forgot it.
    cluster.jobs_held.clear()
    registry = NodeRegistry(max_nodes=10)
    restarted = claiming_bridge_of(cluster, registry, claims)
    restarted.accept(document("lab.n1", training()))
    await restarted.step()  # the nodes announced
    await restarted.step()  # the attempt found submitted before
    (entry,) = reported(registry, "lab.n1")
    assert entry.state == "starting"
    assert "submitted to cluster lab before" in entry.reason
    await restarted.step()
    assert len(cluster.submitted) == 1
    (entry,) = reported(registry, "lab.n1")
    assert entry.state == "failed"
    assert "disappeared from cluster lab" in entry.reason


async def test_a_submission_the_store_cannot_record_waits_for_it(cluster: MemoryCluster) -> None:
    claims = Claims()
    claims.away = True
    registry = NodeRegistry(max_nodes=10)
    bridge = claiming_bridge_of(cluster, registry, claims)
    bridge.accept(document("lab.n1", training()))
    await bridge.step()
    await bridge.step()
    assert cluster.submitted == []
    assert [entry.state for entry in reported(registry, "lab.n1")] == ["starting"]
    claims.away = False
    await bridge.step()
    assert len(cluster.submitted) == 1


async def test_a_submission_that_did_not_reach_the_cluster_is_made_again(
    cluster: MemoryCluster,
) -> None:
    claims = Claims()
    registry = NodeRegistry(max_nodes=10)
    bridge = claiming_bridge_of(cluster, registry, claims)
    bridge.accept(document("lab.n1", training()))
    await bridge.step()
    submit = cluster.submit

    async def unreachable(gang: GangRequest) -> str:
        raise ClusterUnreachable("sbatch did not finish within 20 s")

    cluster.submit = unreachable  # type: ignore[method-assign]
    await bridge.step()
    assert cluster.submitted == []
    cluster.submit = submit  # type: ignore[method-assign]
    await bridge.step()
    await bridge.step()
    assert len(cluster.submitted) == 1  # this run claimed it: submitted once it can be
    assert [entry.state for entry in reported(registry, "lab.n1")] == ["running"]


async def test_a_bridge_held_for_a_removal_submits_nothing_new(cluster: MemoryCluster) -> None:
    registry = NodeRegistry(max_nodes=10)
    bridge = bridge_of(cluster, registry)
    bridge.accept(document("lab.n1", training()))
    await bridge.step()  # the nodes announced
    bridge.hold_submissions(True)
    await bridge.step()
    assert (cluster.submitted, bridge.live_jobs()) == ([], {})
    bridge.hold_submissions(False)  # the removal refused
    await bridge.step()
    assert len(cluster.submitted) == 1
    assert bridge.live_jobs() == {(JOB, 1): "pending"}
