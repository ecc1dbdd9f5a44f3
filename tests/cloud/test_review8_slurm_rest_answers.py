"""What slurmrestd answers, read as it is meant (cloud/clusters/slurm/rest_backend.py,
rest_dialects.py):

- an answer without the list its API documents (`{}`, `{"jobs": null}`: a proxy's page,
  a broken slurmrestd) is the cluster not answering usably, never "no jobs" or "no
  machines": the bridge keeps the last known states and taints the machines, and a
  running job is never called vanished for it; an empty list is still an answer;
- a job slurmrestd v0.0.38 requeued although greenfed asked it not to (it ignores
  `"requeue": false`: its `restart_cnt` says so) is reported `stopped`, "requeued by the
  cluster", and cancelled, never shown `starting` while it restarts behind greenfed's
  back.

slurmrestd is faked in process, its records those recorded from Slurm 22.05.8
(tests/cloud/slurmrestd/)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from cloud.clusters.backend import ClusterRefused, ClusterUnreachable
from cloud.clusters.bridge import UNREACHABLE_TAINT, ClusterBridge, ClusterPlacement
from cloud.clusters.slurm.rest_backend import SlurmRestBackend
from cloud.clusters.slurm.rest_client import SlurmRestAccess, SlurmRestClient
from cloud.clusters.slurm.rest_dialects import dialect_of
from cloud.clusters.slurm.script import SubmitOptions
from cloud.fleet.registry import NodeRegistry
from shared.messages import DesiredState, DesiredTraining, ReportedTraining

pytestmark = pytest.mark.timeout(30)

JOB = "01M8XES6JQ9S91MCASPSBYBS71"
RECORDED = Path(__file__).parent / "slurmrestd"
NODES = json.loads((RECORDED / "v0.0.38-nodes.json").read_text())["nodes"]
# Job 3 of the recording: RUNNING on gfnode1, restart_cnt 0, an expected end_time.
RUNNING_JOB = json.loads((RECORDED / "v0.0.38-jobs.json").read_text())["jobs"][2]
# What slurmrestd v0.0.38 lists for it once its machine went down: requeued (Requeue=1
# although greenfed asked for none), pending again until its BeginTime, the times
# Slurm's expectations.
REQUEUED = {
    "job_state": "PENDING",
    "state_reason": "BeginTime",
    "restart_cnt": 1,
    "nodes": "",
    "start_time": 4_000_000_000,
    "end_time": 4_000_086_400,
}


class FakeSlurmrestd(SlurmRestClient):
    """slurmrestd v0.0.38 without its accounting plugin: each listing answers what the
    test sets; a submitted job is listed RUNNING as the recording's job 3."""

    def __init__(self) -> None:
        super().__init__(SlurmRestAccess(url="unix:/nonexistent/slurmrestd.socket"))
        self.jobs: list[dict[str, Any]] = []
        self.jobs_answer: dict[str, Any] | None = None  # None: {"jobs": self.jobs}
        self.nodes_answer: dict[str, Any] | None = None  # None: the recorded nodes
        self.accounting_answer: dict[str, Any] | None = None  # None: no plugin (404)
        self.cancelled: list[str] = []

    async def request(self, method: str, path: str, **options: Any) -> dict[str, Any]:
        if path == "/slurm/v0.0.38/jobs":
            return self.jobs_answer if self.jobs_answer is not None else {"jobs": self.jobs}
        if path == "/slurm/v0.0.38/nodes":
            return self.nodes_answer if self.nodes_answer is not None else {"nodes": NODES}
        if path == "/slurm/v0.0.38/partitions":
            return {"partitions": [{"name": "gpu", "state": "UP"}]}
        if path.startswith("/slurmdb/"):
            if self.accounting_answer is None:
                raise ClusterRefused(f"slurmrestd answered GET {path} 404: no plugin")
            return self.accounting_answer
        if method == "POST":
            job = options["body"]["job"]
            listed = {**RUNNING_JOB, "job_id": 42, "user_id": os.getuid()}
            self.jobs.append({**listed, "name": job["name"], "comment": job["comment"]})
            return {"job_id": 42}
        if method == "DELETE":
            self.cancelled.append(path.rsplit("/", 1)[1])
            return {}
        raise AssertionError(f"unexpected {method} {path}")


def backend_of(slurmrestd: FakeSlurmrestd) -> SlurmRestBackend:
    return SlurmRestBackend(slurmrestd, SubmitOptions(work_dir="/tmp"), version="v0.0.38")


class Cluster:
    """A bridge over the fake slurmrestd, its clock moved by hand."""

    def __init__(self) -> None:
        self.slurmrestd = FakeSlurmrestd()
        self.registry = NodeRegistry(max_nodes=10)
        self.now = 1_800_000_000.0
        self.bridge = ClusterBridge(
            "lab",
            backend_of(self.slurmrestd),
            self.registry,
            ClusterPlacement("DE", "europe-west3"),
            clock=lambda: self.now,
        )

    async def step(self) -> None:
        await self.bridge.step()
        self.now += 5.0

    async def running_job(self) -> None:
        """greenfed's job submitted and seen running on gfnode1."""
        await self.step()  # the machines announced
        self.bridge.accept(
            DesiredState(
                node_id="lab.gfnode1",
                generation=1,
                issued_at=1.0,
                cluster_id="c1",
                training=(
                    DesiredTraining(
                        job_id=JOB, attempt=1, command=("true",), accelerator_ids=("gpu0",)
                    ),
                ),
            )
        )
        await self.step()  # submitted
        await self.step()  # listed running
        assert [(t.state, t.reason) for t in self.reported()] == [("running", "")]

    def reported(self) -> tuple[ReportedTraining, ...]:
        record = self.registry.get("lab.gfnode1")
        assert record is not None
        assert record.reported is not None
        return record.reported.training

    def taints(self) -> list[str]:
        record = self.registry.get("lab.gfnode1")
        assert record is not None
        return [taint.key for taint in record.status.taints]


MALFORMED_LISTINGS = [{}, {"jobs": None}, {"jobs": {}}, {"jobs": "none"}]


@pytest.mark.parametrize("answer", MALFORMED_LISTINGS, ids=json.dumps)
async def test_a_listing_without_its_jobs_never_makes_a_running_job_vanish(
    answer: dict[str, Any],
) -> None:
    cluster = Cluster()
    await cluster.running_job()
    cluster.slurmrestd.jobs_answer = answer
    for _ in range(3):  # more than the two listings that used to call it vanished
        await cluster.step()
        assert not cluster.bridge.health.reachable
        assert "'jobs' list" in cluster.bridge.health.last_error
        assert cluster.taints() == [UNREACHABLE_TAINT]
        assert [(t.state, t.reason) for t in cluster.reported()] == [("running", "")]
    cluster.slurmrestd.jobs_answer = None
    await cluster.step()
    assert cluster.bridge.health.reachable
    assert cluster.taints() == []
    assert [(t.state, t.reason) for t in cluster.reported()] == [("running", "")]
    assert cluster.slurmrestd.cancelled == []


@pytest.mark.parametrize(
    "answer", [{}, {"nodes": None}, {"nodes": {"gfnode1": {}}}], ids=json.dumps
)
async def test_a_node_listing_without_its_nodes_is_no_answer(answer: dict[str, Any]) -> None:
    cluster = Cluster()
    await cluster.running_job()
    cluster.slurmrestd.nodes_answer = answer
    await cluster.step()
    assert not cluster.bridge.health.reachable
    assert "'nodes' list" in cluster.bridge.health.last_error
    assert cluster.bridge.health.nodes == 2  # as last known, not 0
    assert cluster.taints() == [UNREACHABLE_TAINT]
    assert [(t.state, t.reason) for t in cluster.reported()] == [("running", "")]


async def test_empty_lists_are_answers() -> None:
    slurmrestd = FakeSlurmrestd()
    slurmrestd.nodes_answer = {"nodes": []}
    backend = backend_of(slurmrestd)
    capacity = await backend.capacity()
    assert (capacity.nodes, capacity.pending_jobs) == ((), 0)
    assert await backend.jobs(include_ended=True) == ()


async def test_an_accounting_answer_without_its_jobs_is_not_read_this_time() -> None:
    slurmrestd = FakeSlurmrestd()
    slurmrestd.accounting_answer = {"jobs": None}
    backend = backend_of(slurmrestd)
    assert await backend.jobs(include_ended=True) == ()
    # Not read (the bridge waits for it), never "no accounting kept" (asked no more).
    assert "'jobs' list" in backend.history_error
    slurmrestd.accounting_answer = {"jobs": []}
    assert await backend.jobs(include_ended=True) == ()
    assert backend.history_error == ""


async def test_the_live_listing_without_its_jobs_raises_what_the_bridge_takes_as_unreachable() -> (
    None
):
    slurmrestd = FakeSlurmrestd()
    slurmrestd.jobs_answer = {"jobs": None}
    with pytest.raises(ClusterUnreachable, match="'jobs' list"):
        await backend_of(slurmrestd).jobs(include_ended=False)


def own_job(**changes: Any) -> dict[str, Any]:
    return {
        **RUNNING_JOB,
        "job_id": 42,
        "name": f"gf-{JOB}-1",
        "comment": f"greenfed:{JOB}:1:acme",
        **changes,
    }


def state_of(raw: dict[str, Any]) -> str:
    job = dialect_of("v0.0.38").job(raw)
    assert job is not None
    return job.state


def test_a_job_slurm_requeued_reads_stopped_not_pending() -> None:
    dialect = dialect_of("v0.0.38")
    requeued = dialect.job(own_job(**REQUEUED))
    assert requeued is not None
    assert requeued.state == "stopped"
    assert requeued.reason.startswith("requeued by the cluster")
    # Slurm's expected start and end are no times of this attempt (never in the future).
    assert (requeued.started_at, requeued.finished_at) == (None, None)
    assert dialect.held_after_requeue(own_job(**REQUEUED))
    # Running again from its beginning after the requeue: the same.
    again = dialect.job(own_job(restart_cnt=2))
    assert again is not None
    assert (again.state, again.finished_at) == ("stopped", None)
    # Never requeued: as before.
    assert state_of(own_job()) == "running"
    assert state_of(own_job(**{**REQUEUED, "restart_cnt": 0})) == "pending"
    # Ended since: its end is kept (and it is no longer held, nothing to cancel).
    ended = own_job(job_state="COMPLETED", exit_code=0, restart_cnt=1)
    assert state_of(ended) == "succeeded"
    assert not dialect.held_after_requeue(ended)


async def test_a_running_job_slurm_requeued_is_stopped_and_cancelled() -> None:
    cluster = Cluster()
    await cluster.running_job()
    # gfnode1 went down: slurmrestd v0.0.38 had the job requeued (Restarts=1).
    cluster.slurmrestd.jobs[0].update(REQUEUED)
    await cluster.step()
    (entry,) = cluster.reported()
    assert entry.state == "stopped"  # the loop decides what follows, not Slurm
    assert "requeued by the cluster" in entry.reason
    assert entry.started_at is None or entry.started_at <= cluster.now
    assert entry.finished_at is None or entry.finished_at <= cluster.now
    # Never left to start again from its beginning beside the loop's next attempt.
    assert cluster.slurmrestd.cancelled == ["42"]
    # Cancelled: read stopped still, and not cancelled again.
    cluster.slurmrestd.jobs[0].update(job_state="CANCELLED", state_reason="None")
    await cluster.step()
    (entry,) = cluster.reported()
    assert entry.state == "stopped"
    assert "requeued by the cluster" in entry.reason
    assert cluster.slurmrestd.cancelled == ["42"]
