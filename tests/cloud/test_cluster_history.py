"""A cluster whose history (slurmdbd: `sacct`, slurmrestd's `/slurmdb/`) does not answer
while its controller does: the cluster is still reachable, its machines are nodes, its
live jobs are read, and what the history alone could say waits for it. Jobs missing
from the live listing keep their last known state, are never submitted again, and
their end is read once the history answers. The commands are faked by a bin_dir of
scripts (tests/support/slurm_commands.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from cloud.clusters.backend import ClusterUnreachable
from cloud.clusters.bridge import UNREACHABLE_TAINT, ClusterBridge, ClusterPlacement
from cloud.clusters.slurm.backend import SlurmBackend
from cloud.clusters.slurm.commands import SlurmAccess, SlurmCommands
from cloud.clusters.slurm.rest_backend import SlurmRestBackend
from cloud.clusters.slurm.rest_client import SlurmRestAccess, SlurmRestClient
from cloud.clusters.slurm.script import SubmitOptions
from cloud.fleet.registry import NodeRegistry
from shared.messages import DesiredState, DesiredTraining, ReportedTraining
from tests.support.slurm_commands import SLURMDBD_DOWN, FakeSlurmBin, job_line

JOB = "01M8XES6JQ9S91MCASPSBYBS71"


@pytest.fixture
def slurm(tmp_path: Path) -> FakeSlurmBin:
    fake = FakeSlurmBin(tmp_path / "bin")
    fake.answer("sacct", err=SLURMDBD_DOWN, status=1)
    return fake


def backend_of(slurm: FakeSlurmBin) -> SlurmBackend:
    return SlurmBackend(
        SlurmCommands(SlurmAccess(bin_dir=str(slurm.path))), SubmitOptions(work_dir="/tmp")
    )


def document(*entries: DesiredTraining, generation: int = 1) -> DesiredState:
    return DesiredState(
        node_id="lab.gfnode1",
        generation=generation,
        issued_at=1.0,
        cluster_id="c1",
        training=entries,
    )


def training() -> DesiredTraining:
    return DesiredTraining(job_id=JOB, attempt=1, command=("true",), accelerator_ids=("gpu0",))


def reported(registry: NodeRegistry) -> tuple[ReportedTraining, ...]:
    record = registry.get("lab.gfnode1")
    assert record is not None
    assert record.reported is not None
    return record.reported.training


async def test_jobs_are_listed_while_the_accounting_does_not_answer(slurm: FakeSlurmBin) -> None:
    slurm.answer("scontrol-job", job_line("5", JOB, 1, "RUNNING") + "\n")
    backend = backend_of(slurm)
    (job,) = await backend.jobs(include_ended=True)
    assert (job.backend_id, job.state) == ("5", "running")
    assert "Connection refused" in backend.history_error

    # slurmdbd back: the history is read again, and says so.
    slurm.answer("sacct", f"4|gf-{JOB}-2|COMPLETED|0:0|1|2|3|gfnode1||greenfed:{JOB}:2:acme\n")
    listed = await backend.jobs(include_ended=True)
    assert [(job.backend_id, job.state) for job in listed] == [("5", "running"), ("4", "succeeded")]
    assert backend.history_error == ""


async def test_a_control_plane_started_while_slurmdbd_is_down_sees_the_cluster(
    slurm: FakeSlurmBin,
) -> None:
    registry = NodeRegistry(max_nodes=10)
    bridge = ClusterBridge("lab", backend_of(slurm), registry, ClusterPlacement("DE", "eu"))
    await bridge.step()
    assert bridge.health.reachable
    assert "history" in bridge.health.last_error
    assert "Connection refused" in bridge.health.last_error
    record = registry.get("lab.gfnode1")
    assert record is not None
    assert UNREACHABLE_TAINT not in [taint.key for taint in record.status.taints]
    assert [a.healthy for a in record.status.accelerators if a.kind == "gpu"] == [True] * 4


async def test_a_job_gone_from_the_live_listing_waits_for_the_history(
    slurm: FakeSlurmBin,
) -> None:
    slurm.answer("sacct", "")  # slurmdbd up at first
    slurm.answer("sbatch", "5;lab\n")
    registry = NodeRegistry(max_nodes=10)
    clock = [1000.0]
    bridge = ClusterBridge(
        "lab",
        backend_of(slurm),
        registry,
        ClusterPlacement("DE", "eu"),
        clock=lambda: clock[0],
    )
    bridge.accept(document(training()))
    await bridge.step()  # the node announced
    await bridge.step()  # the job submitted
    assert len(slurm.calls("sbatch")) == 1
    slurm.answer("scontrol-job", job_line("5", JOB, 1, "RUNNING") + "\n")
    await bridge.step()
    assert [entry.state for entry in reported(registry)] == ["running"]

    # It ends and ages out of slurmctld's memory while slurmdbd is down.
    slurm.answer("scontrol-job", "")
    slurm.answer("sacct", err=SLURMDBD_DOWN, status=1)
    for _ in range(3):
        clock[0] += 60.0
        await bridge.step()
        assert bridge.health.reachable
        assert [entry.state for entry in reported(registry)] == ["running"]  # as last known
    assert "history" in bridge.health.last_error
    assert len(slurm.calls("sbatch")) == 1  # never again

    slurm.answer("sacct", f"5|gf-{JOB}-1|COMPLETED|0:0|1|2|3|gfnode1||greenfed:{JOB}:1:acme\n")
    clock[0] += 60.0
    await bridge.step()
    assert [entry.state for entry in reported(registry)] == ["succeeded"]
    assert bridge.health.last_error == ""
    assert len(slurm.calls("sbatch")) == 1


class SlurmdbdDownRestClient(SlurmRestClient):
    """slurmrestd v0.0.38 answering its job listing, not its accounting."""

    async def request(self, method: str, path: str, **_: Any) -> dict[str, Any]:
        if path.startswith("/slurmdb/"):
            raise ClusterUnreachable(
                "slurmrestd: Unable to connect to database: Connection refused"
            )
        if path.endswith("/nodes"):
            return {"nodes": []}
        own = {"job_id": 5, "name": f"gf-{JOB}-1", "job_state": "RUNNING", "user_id": os.getuid()}
        return {"jobs": [{**own, "comment": f"greenfed:{JOB}:1:acme"}]}


async def test_slurmrestd_without_its_accounting_still_lists_jobs() -> None:
    client = SlurmdbdDownRestClient(SlurmRestAccess(url="unix:/nonexistent.socket"))
    backend = SlurmRestBackend(client, SubmitOptions(work_dir="/tmp"), version="v0.0.38")
    listed = await backend.jobs(include_ended=True)
    assert "Connection refused" in backend.history_error
    assert [(job.backend_id, job.state) for job in listed] == [("5", "running")]
