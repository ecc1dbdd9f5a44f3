"""Where a job waiting in a Slurm cluster's queue cannot start (review round 6, follow-up
of the waiting-job grace), against the in-memory back-end of tests/cloud/
test_cluster_bridge.py and Slurm's own records (the real cluster: tests/integration/
test_review6_slurm2.py):

- a machine whose partitions greenfed may use are none of them up takes no work, though
  another of its partitions is up: it is tainted, and a job waiting there is given up;
- a job whose pending reason says it cannot start where it is (PartitionDown,
  ReqNodeNotAvail, ...) is given up after the same grace, also where the cluster picks
  the machines itself; one that waits its turn (Resources, Priority, Dependency,
  BeginTime) never is.
"""

from __future__ import annotations

from typing import Any

import pytest

from cloud.clusters.backend import ClusterJob, ClusterNode
from cloud.clusters.bridge import UNAVAILABLE_TAINT, ClusterBridge, ClusterPlacement
from cloud.clusters.slurm.records import jobs_of, partition_states, with_partition_states
from cloud.clusters.slurm.rest_dialects import dialect_of
from cloud.fleet.registry import NodeRegistry
from tests.cloud.test_cluster_bridge import JOB, MemoryCluster, document, reported, training
from tests.cloud.test_review6_cluster_waiting import Pinless

GRACE_S = 60.0
# As Slurm 22.05's `scontrol -a -o show partition` prints them (cut): `gpu` down,
# `debug` (on n1 too) up.
PARTITIONS = (
    "PartitionName=gpu AllowGroups=ALL Default=YES Nodes=n[1-2] State=DOWN TotalCPUs=16\n"
    "PartitionName=debug AllowGroups=ALL Default=NO Nodes=n1 State=UP TotalCPUs=8\n"
)


def machines_with_gpu_down() -> list[ClusterNode]:
    """n1 in `gpu` and `debug`, n2 in `gpu` alone, as the Slurm back-ends read them."""
    return list(
        with_partition_states(
            (
                ClusterNode("n1", ("gpu", "debug"), 8, 64 << 30, {"a100": 4}),
                ClusterNode("n2", ("gpu",), 8, 64 << 30, {"a100": 4}),
            ),
            partition_states(PARTITIONS),
        )
    )


def bridge_of(
    cluster: MemoryCluster,
    registry: NodeRegistry,
    clock: list[float],
    partitions: tuple[str, ...] = (),
) -> ClusterBridge:
    return ClusterBridge(
        "lab",
        cluster,
        registry,
        ClusterPlacement("DE", "europe-west3"),
        partitions=partitions,
        unstartable_grace_s=GRACE_S,
        clock=lambda: clock[0],
    )


def taints(registry: NodeRegistry, node_id: str) -> list[str]:
    record = registry.get(node_id)
    assert record is not None
    return [taint.key for taint in record.status.taints]


def test_each_machine_carries_its_partitions_availability() -> None:
    n1, n2 = machines_with_gpu_down()
    assert dict(n1.partition_availability) == {"gpu": "down", "debug": "up"}
    assert (n1.takes_work_in("gpu"), n1.takes_work_in("debug")) == (False, True)
    assert n1.takes_work_in("created-since")  # not in the listing: taken to be up
    assert n1.unavailable == ""  # through `debug` it takes work
    assert n2.unavailable == "partition gpu down"
    v41 = dialect_of("v0.0.41")
    state = v41.partition_state({"name": "gpu", "partition": {"state": ["DRAIN"]}})
    assert state is not None
    (drained,) = with_partition_states((n1,), dict([state]))
    assert drained.partition_availability == {"gpu": "drain"}


async def test_a_machine_none_of_whose_usable_partitions_is_up_takes_no_work() -> None:
    cluster = MemoryCluster()
    cluster.nodes = machines_with_gpu_down()
    cluster.jobs_held["7"] = ClusterJob(
        "7", JOB, 1, "pending", reason="Resources", queue_wait="turn"
    )
    registry = NodeRegistry(max_nodes=10)
    clock = [1000.0]
    bridge = bridge_of(cluster, registry, clock, partitions=("gpu",))
    bridge.accept(document("lab.n1", training()))
    await bridge.step()
    # Registered for `gpu` alone: n1 is up only through `debug`, which greenfed may not use.
    assert taints(registry, "lab.n1") == [UNAVAILABLE_TAINT]
    assert taints(registry, "lab.n2") == [UNAVAILABLE_TAINT]
    record = registry.get("lab.n1")
    assert record is not None
    assert record.status.labels["slurm.partition"] == "gpu"
    clock[0] += GRACE_S
    await bridge.step()
    (entry,) = reported(registry, "lab.n1")
    assert entry.state == "stopped"
    assert entry.reason == (
        "machine n1 of cluster lab takes no work (partition gpu down): the job waiting in "
        "its queue cannot start there"
    )


async def test_a_machine_up_through_a_usable_partition_takes_work_through_it() -> None:
    cluster = MemoryCluster()
    cluster.nodes = machines_with_gpu_down()
    registry = NodeRegistry(max_nodes=10)
    bridge = bridge_of(cluster, registry, [1000.0], partitions=("gpu", "debug"))
    await bridge.step()
    assert taints(registry, "lab.n1") == []
    record = registry.get("lab.n1")
    assert record is not None
    assert record.status.labels["slurm.partition"] == "debug"
    assert taints(registry, "lab.n2") == [UNAVAILABLE_TAINT]


@pytest.mark.parametrize("picks_machines_itself", [False, True])
async def test_a_job_that_cannot_start_where_it_waits_is_given_up_after_the_grace(
    picks_machines_itself: bool,
) -> None:
    cluster = Pinless() if picks_machines_itself else MemoryCluster()
    cluster.jobs_held["7"] = ClusterJob(
        "7", JOB, 1, "pending", reason="PartitionDown", queue_wait="cannot_start"
    )
    registry = NodeRegistry(max_nodes=10)
    clock = [1000.0]
    bridge = bridge_of(cluster, registry, clock)
    bridge.accept(document("lab.n2", training()))
    await bridge.step()
    clock[0] += GRACE_S - 1
    await bridge.step()
    assert reported(registry, "lab.n2")[0].state == "starting"  # the machine itself is fine
    clock[0] += 1
    await bridge.step()
    (entry,) = reported(registry, "lab.n2")
    assert entry.state == "stopped"
    assert entry.reason == (
        "cluster lab cannot start the job where it waits in its queue (PartitionDown)"
    )
    bridge.accept(document("lab.n2", generation=2))  # placed elsewhere by the loop
    await bridge.step()
    assert cluster.cancelled == ["7"]


@pytest.mark.parametrize("reason", ["Resources", "Priority", "Dependency", "BeginTime"])
async def test_a_job_waiting_its_turn_is_never_given_up(reason: str) -> None:
    cluster = MemoryCluster()
    cluster.jobs_held["7"] = ClusterJob("7", JOB, 1, "pending", reason=reason, queue_wait="turn")
    registry = NodeRegistry(max_nodes=10)
    clock = [1000.0]
    bridge = bridge_of(cluster, registry, clock)
    bridge.accept(document("lab.n2", training()))
    await bridge.step()
    clock[0] += 10 * GRACE_S
    await bridge.step()
    (entry,) = reported(registry, "lab.n2")
    assert entry.state == "starting"
    assert entry.reason.endswith(f": {reason}")


def scontrol_job(state: str, reason: str) -> ClusterJob:
    line = (
        f"JobId=7 JobName=gf-{JOB}-1 UserId=root(0) JobState={state} Reason={reason} "
        f"ExitCode=0:0 SubmitTime=1796284836 StartTime=Unknown EndTime=Unknown "
        f"NodeList=(null) Comment=greenfed:{JOB}:1:acme\n"
    )
    (job,) = jobs_of(line)
    return job


def rest_job(version: str, state: str, reason: str) -> ClusterJob:
    raw: dict[str, Any] = {
        "job_id": 7,
        "name": f"gf-{JOB}-1",
        "job_state": state if version == "v0.0.38" else [state],
        "state_reason": reason,
        "nodes": "",
    }
    job = dialect_of(version).job(raw)
    assert job is not None
    return job


@pytest.mark.parametrize(
    ("reason", "wait"),
    [
        ("PartitionDown", "cannot_start"),
        ("PartitionInactive", "cannot_start"),
        # The job's own request: every machine of the partition refuses it alike.
        ("PartitionNodeLimit", "turn"),
        ("PartitionTimeLimit", "turn"),
        ("PartitionConfig", "turn"),
        ("ReqNodeNotAvail", "cannot_start"),
        ("Resources", "turn"),
        ("Priority", "turn"),
        ("Dependency", "turn"),
        ("BeginTime", "turn"),
        ("QOSMaxGRESPerUser", "turn"),
        ("None", "turn"),
    ],
)
@pytest.mark.parametrize("transport", ["scontrol", "v0.0.38", "v0.0.41", "v0.0.45"])
def test_slurms_pending_reason_says_whether_the_job_can_start_where_it_is(
    reason: str, wait: str, transport: str
) -> None:
    if transport == "scontrol":
        job = scontrol_job("PENDING", reason)
    else:
        job = rest_job(transport, "PENDING", reason)
    assert (job.state, job.queue_wait) == ("pending", wait)


def test_scontrols_detail_after_the_reason_is_not_read_as_its_name() -> None:
    # `scontrol` writes the job's state description in place of the bare reason.
    job = scontrol_job("PENDING", "ReqNodeNotAvail,_UnavailableNodes:gfnode1")
    assert job.queue_wait == "cannot_start"
    # Slurm's "Resources" description: nodes busy *or* reserved for higher priority
    # partitions: a wait, not a dead end.
    waits = scontrol_job(
        "PENDING",
        "Nodes_required_for_job_are_DOWN,_DRAINED_or_reserved_for_jobs_in_higher_"
        "priority_partitions",
    )
    assert waits.queue_wait == "turn"
    assert scontrol_job("RUNNING", "None").queue_wait is None
