"""A Slurm partition that is not up (review round 6): its machines' records say so, for
both transports (`scontrol -a -o show partition`; slurmrestd's `/partitions` in both of
the shapes greenfed speaks). The real cluster: tests/integration/
test_review6_slurm_queue.py."""

from __future__ import annotations

from cloud.clusters.backend import ClusterNode
from cloud.clusters.slurm.records import partition_states, with_partition_states
from cloud.clusters.slurm.rest_dialects import dialect_of

# As Slurm 22.05's `scontrol -a -o show partition` prints them (cut).
PARTITIONS = (
    "PartitionName=gpu AllowGroups=ALL Default=YES Nodes=gfnode[1-2] State=DOWN TotalCPUs=16\n"
    "PartitionName=debug AllowGroups=ALL Default=NO Nodes=gfnode1 State=UP TotalCPUs=8\n"
    "PartitionName=old AllowGroups=ALL Default=NO Nodes=gfnode3 State=INACTIVE TotalCPUs=8\n"
)


def machine(name: str, *partitions: str, unavailable: str = "") -> ClusterNode:
    return ClusterNode(name, partitions, 8, 8 << 30, {"a100": 4}, unavailable=unavailable)


def test_a_machine_none_of_whose_partitions_is_up_takes_no_work() -> None:
    states = partition_states(PARTITIONS)
    assert states == {"gpu": "DOWN", "debug": "UP", "old": "INACTIVE"}
    both, only_gpu, gpu_and_old, drained, new = with_partition_states(
        (
            machine("gfnode1", "gpu", "debug"),
            machine("gfnode2", "gpu"),
            machine("gfnode3", "gpu", "old"),
            machine("gfnode4", "gpu", unavailable="idle+drain: maint"),
            machine("gfnode5", "gpu", "created-since"),
        ),
        states,
    )
    # One that is up comes first: greenfed places work through it.
    assert (both.partitions, both.unavailable) == (("debug", "gpu"), "")
    assert (only_gpu.partitions, only_gpu.unavailable) == (("gpu",), "partition gpu down")
    assert gpu_and_old.unavailable == "partition gpu down, old inactive"
    assert drained.unavailable == "idle+drain: maint"  # the node's own state says more
    assert (new.partitions, new.unavailable) == (("created-since", "gpu"), "")


def test_slurmrestd_partition_states_in_both_shapes() -> None:
    v38 = dialect_of("v0.0.38")
    assert v38.partitions_path == "/slurm/v0.0.38/partitions"
    assert v38.partition_state({"name": "gpu", "state": "DOWN", "flags": ["default"]}) == (
        "gpu",
        "DOWN",
    )
    v41 = dialect_of("v0.0.41")
    assert v41.partitions_path == "/slurm/v0.0.41/partitions"
    assert v41.partition_state({"name": "gpu", "partition": {"state": ["INACTIVE"]}}) == (
        "gpu",
        "INACTIVE",
    )
    assert v41.partition_state({"partition": {"state": ["UP"]}}) is None
