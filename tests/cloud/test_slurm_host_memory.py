"""A job's host memory reaches Slurm: what greenfed's scheduler counted as held on each
machine (`host_memory_gib` per worker, times the workers there) is what the Slurm job
asks for per node (`sbatch --mem`, slurmrestd's `memory_per_node`, MiB), so the cluster
does not pack other work into it. A job that asks for none leaves the cluster's default."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from cloud.clusters.backend import GangMember, GangRequest
from cloud.clusters.slurm.rest_dialects import V0038, dialect_of
from cloud.clusters.slurm.script import SubmitOptions, batch_script, job_shape, sbatch_arguments
from cloud.fleet.registry import NodeRegistry
from shared.messages import DesiredTraining
from tests.cloud.test_cluster_bridge import JOB, MemoryCluster, bridge_of, document

GIB = 1 << 30
SCHEMAS: dict[str, dict[str, Any]] = json.loads(
    (Path(__file__).parent / "slurmrestd" / "openapi-schemas.json").read_text()
)
OPTIONS = SubmitOptions(work_dir="/shared/gf")


def gang(*host_memory_bytes: int) -> GangRequest:
    return GangRequest(
        job_id=JOB,
        attempt=1,
        tenant="acme",
        partition="gpu",
        members=tuple(
            GangMember(f"gfnode{i}", 2, 2, 8, host_memory_bytes=memory)
            for i, memory in enumerate(host_memory_bytes, 1)
        ),
        accelerator_type="a100",
        command=("python", "train.py"),
        env={},
        working_dir=None,
        master_port=29500,
        per_node=False,
        time_limit_s=None,
        priority="p1",
        grace_period_s=30.0,
    )


def memory_options(arguments: list[str]) -> list[str]:
    return [argument for argument in arguments if argument.startswith("--mem")]


def test_sbatch_asks_for_each_nodes_host_memory() -> None:
    assert memory_options(sbatch_arguments(gang(12 * GIB, 12 * GIB), OPTIONS)) == ["--mem=12288M"]
    # Part of a MiB is a whole one: never less than the scheduler counted.
    assert memory_options(sbatch_arguments(gang(GIB + 1), OPTIONS)) == ["--mem=1025M"]
    # None asked: the cluster's default.
    assert memory_options(sbatch_arguments(gang(0, 0), OPTIONS)) == []


def test_slurmrestd_is_asked_for_the_same_in_each_versions_units() -> None:
    request = gang(12 * GIB, 12 * GIB)
    shape, script = job_shape(request, OPTIONS), batch_script(request)
    assert V0038("v0.0.38").submit_body(shape, script)["job"]["memory_per_node"] == 12288
    for version in sorted(SCHEMAS):
        job = dialect_of(version).submit_body(shape, script)["job"]
        assert job["memory_per_node"] == {"set": True, "infinite": False, "number": 12288}
        jsonschema.validate(
            job, {**SCHEMAS[version]["job_desc_msg"], "additionalProperties": False}
        )
    unasked = gang(0)
    for dialect in (V0038("v0.0.38"), dialect_of("v0.0.45")):
        body = dialect.submit_body(job_shape(unasked, OPTIONS), batch_script(unasked))
        assert "memory_per_node" not in body["job"]


@pytest.mark.parametrize(("per_worker", "expected"), [(6 * GIB, 12 * GIB), (None, 0)])
async def test_the_bridge_submits_the_host_memory_of_each_nodes_workers(
    per_worker: int | None, expected: int
) -> None:
    cluster = MemoryCluster()
    registry = NodeRegistry(max_nodes=10)
    bridge = bridge_of(cluster, registry)
    await bridge.step()
    for rank, node_id in enumerate(("lab.n1", "lab.n2")):
        worker = DesiredTraining(
            job_id=JOB, attempt=1, command=("true",), accelerator_ids=("gpu1", "gpu2"),
            node_rank=rank, nodes=2, world_size=4, processes=2, host_memory_bytes=per_worker,
        )  # fmt: skip
        bridge.accept(document(node_id, worker))
    await bridge.step()
    (submitted,) = cluster.submitted
    assert [member.host_memory_bytes for member in submitted.members] == [expected, expected]
